"""Dagster code location: `dagster dev -m basemodel_pipeline.definitions` (see workspace.yaml, `make ui`).

Config: BASEMODEL_CONFIG (default demo_workspace/config.yaml); environment: BASEMODEL_ENV=local|ci|prod.
"""

from basemodel_pipeline.defs import build_definitions

defs = build_definitions()
