"""ingot runtime: load a verified artifact and generate with it (no torch, no transformers).

model = LoadedModel.load("out/tiny-llama")
[completion] = model.generator().generate(["Hello"], SamplingParams(max_tokens=8))

The production install: imports ingot.common and ingot.artifacts, numpy, onnxruntime (through
its engine plug-ins), tokenizers, jinja2 and, on a request's first constraint, llguidance;
never torch, transformers, onnx, ingot.calibration, ingot.pipeline or the CLI
(tests/runtime/test_no_torch.py).
"""

from ingot.runtime.generate import Completion, Generator, SchedulerStats, StepOutput
from ingot.runtime.model import LoadedModel
from ingot.runtime.sampling import SamplingParams

__all__ = [
    "Completion",
    "Generator",
    "LoadedModel",
    "SamplingParams",
    "SchedulerStats",
    "StepOutput",
]
