"""Calibration: the recipe's dataset read, tokenized and packed into token windows
(dataset.py), the activations of every window at one point of the model, spilled to disk past
a memory budget (activations.py), and the observers that accumulate what quantizers need from
a linear's inputs (capture.py). The layer-sequential walk that drives them is the pipeline's
(pipeline/quantize/driver.py).

Imports ingot.common, ingot.artifacts (file digests) and ingot.runtime (the tokenizer), and
torch; never ingot.pipeline or the CLI.
"""
