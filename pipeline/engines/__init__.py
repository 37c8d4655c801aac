"""pipeline/engines."""
