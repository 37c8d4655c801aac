"""Mistral (``MistralForCausalLM``): Llama's layer with a sliding window (config.json's
``sliding_window``) over every layer. llama.cpp runs it as ``llama`` (without the window:
interop/checks.py refuses a window that binds)."""

from __future__ import annotations

from dataclasses import replace

from .llama import PLUGIN as LLAMA

__all__ = ["PLUGIN"]

PLUGIN = replace(LLAMA, name="mistral", hf_class="MistralForCausalLM")
