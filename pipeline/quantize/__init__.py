"""pipeline/quantize."""
