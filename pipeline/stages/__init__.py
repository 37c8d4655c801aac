"""The build's stages, declared as a graph and walked through the stage cache
(docs/design.md, "The stage contract"; `pipeline/build.py` is the outline):

    prepare.py   everything validated and prepared before any stage (`BuildInputs`)
    graph.py     the stages a recipe needs, in dependency order (`declare_stages`):
                 [calibrate] -> quantize -> export -> engine:<name> per target (model.py),
                 heads | eagle, the same for a draft model (draft-...), interop:<format> per
                 format, [evaluate]
    walk.py      the builder: runs each stage through the cache (`Walk`), records `StageRun`s
    package.py   the uncached last step: the artifact and its manifest from the outputs

A stage (stage.py `Stage`) states its name, its recipe slice, its inputs (digests, earlier
stages, parts of their outputs), what it reads unkeyed, how it produces its output, and its
output's contract: a `StageOutput` subclass in the stage's module naming the files it writes
and reading them (`ExportOutput.graph_info()`, `EngineOutput.record()`, ...). Consumers get
the outputs, or the data read from them, from the build: no module outside this package
imports a stage's file names.

This package sits on top of the pipeline: it may import any of `ingot.pipeline`'s other
modules, `ingot.calibration`, `ingot.runtime` (the evaluate stage opens engines through the
runtime's loader) and `ingot.artifacts`; only `pipeline/build.py` imports it. Within it, a
module imports only those before it in: stage, walk, the stages' own modules (calibrate,
quantize, export, engine, heads, eagle, interop), model, prepare, evaluate, graph, package.
"""
