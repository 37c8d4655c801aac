"""The sweep: many variants of one recipe built, measured and compared (`ingot sweep`).

run.py: the orchestration (`run_sweep`). axes.py: the axes file; variants.py: the variants,
their names and dotted paths set in a recipe; recipes.py and paths.py: each variant as a full
recipe under DIR/recipes/ (paths made absolute), checked by the build's preflight;
quality.py: KL, perplexity and size from a built artifact, perplexity on the out-of-domain
text; pareto.py: the front; results.py, markdown.py, plot.py: sweep.json, sweep.md,
pareto.png; pick.py: `--pick` / `--maximize` -> picked.yaml.

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
