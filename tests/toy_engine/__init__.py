"""A toy engine, laid out as a new engine is (design.md section 2): its build half (build.py,
in the tree pipeline/engines/toy/__init__.py) and its runtime half (runtime.py, in the tree
runtime/engines/toy/__init__.py), each registered by one line (tests/pipeline/
test_engine_plugin.py registers them as those lines would). The engine is the exported graph
itself, copied, which ONNX Runtime runs unoptimized."""
