"""Report assets."""
