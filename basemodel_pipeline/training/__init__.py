"""Training: split points, the foundation (self-supervised) stage and scenario fine-tuning."""
