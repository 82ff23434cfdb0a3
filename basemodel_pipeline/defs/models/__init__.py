"""Model assets: the foundation model and the per-scenario fine-tuned models."""
