"""The sweep's executors, one module each, found through `ingot.pipeline.sweep.executor.EXECUTORS`
(each module's ``PLUGIN`` makes an `Executor` from its options)."""
