"""The build's stages, in pipeline order: source -> quantize -> export -> engine -> package.

Each stage is a pure function of its inputs: its recipe slice and the digests of the
stages before it. The build (``pipeline/build.py``) caches each stage's output directory.
"""
