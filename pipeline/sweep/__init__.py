"""The sweep: many variants of one recipe built, measured and compared (`ingot sweep`).

executor.py: `BuildJob` / `BuildOutcome`, the `Executor` interface and its registry
`EXECUTORS` (executors/: `local`, many builds at once on this host as memory allows; `ray`,
each build a task on a Ray cluster); build_worker.py: one build in a fresh interpreter (its
peak memory is its own). speed.py: `measure_speed`, each artifact timed alone in a fresh
interpreter (speed_worker.py), rounds interleaved across variants, on a quiet host
(ingot.pipeline.host_load).

Imports ingot.common, ingot.runtime (the speed worker loads artifacts) and ingot.pipeline
(the build, its stage cache and plan); never the CLI (`ingot.cli*`, `ingot.llm`). Ray is
imported only by executors/ray.py, when that executor is asked for.
"""
