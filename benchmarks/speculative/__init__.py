"""Speculative decoding (n-gram, draft model, Medusa, EAGLE-3) against plain decoding and
transformers' assisted generation (speculative)."""
