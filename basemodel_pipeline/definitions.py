"""Dagster code location: `dagster dev -m basemodel_pipeline.definitions` (see workspace.yaml, `make ui`).

Config: BASEMODEL_CONFIG; environment: BASEMODEL_ENV=local|ci|prod (docs/orchestration.md, "Which environment":
only local defaults to demo_workspace/config.yaml and shows the demo graph while it does not exist).
"""

from basemodel_pipeline.defs import build_definitions

defs = build_definitions()
