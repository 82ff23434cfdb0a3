"""The event cache: build and append, versions, integrity, the reader (EventCache), windows and sizing."""
