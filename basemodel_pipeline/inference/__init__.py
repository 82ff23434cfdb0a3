"""Inference: score entities as of a date with a trained scenario model."""
