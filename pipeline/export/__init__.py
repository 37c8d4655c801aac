"""pipeline/export."""
