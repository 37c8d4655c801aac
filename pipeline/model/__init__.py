"""pipeline/model."""
