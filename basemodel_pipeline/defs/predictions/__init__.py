"""Prediction assets."""
