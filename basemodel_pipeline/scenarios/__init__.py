"""Scenarios: declarative targets turned into labelled (entity, split time) examples."""
