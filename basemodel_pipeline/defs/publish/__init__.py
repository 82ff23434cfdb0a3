"""Publishing finished artifacts to object storage."""
