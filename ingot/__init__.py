"""ingot: ahead-of-time compiler for LLMs."""
