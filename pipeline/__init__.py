"""The build: a recipe compiled into a verified artifact (recipe -> calibrate -> quantize ->
ONNX export -> engines -> interop -> evaluate -> package), run as cached stages (build.py,
stages/), with the plan of its memory and time (plan.py).

Needs the build install (torch, onnx). Imports ingot.common, ingot.artifacts
(to write and verify the artifact), ingot.runtime (the tokenizer, and the loader the evaluate
stage runs the engine through) and ingot.calibration; never the CLI (`ingot.cli*`, `ingot.llm`).
"""
