"""The event cache asset."""
