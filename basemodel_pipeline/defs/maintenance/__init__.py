"""Maintenance: the workspace retention policy runs by itself (`workspace_retention`, daily schedule)."""

from __future__ import annotations

import dagster as dg

from basemodel_pipeline.defs.maintenance.assets import workspace_retention
from basemodel_pipeline.defs.maintenance.schedules import build_retention_schedule, prune_workspace
from basemodel_pipeline.defs.shared.deployment import Deployment


def defs(deployment: Deployment) -> dg.Definitions:
    """The retention asset, its job and its daily schedule (resources come from the root)."""
    return dg.Definitions(
        assets=[workspace_retention],
        jobs=[prune_workspace],
        schedules=[build_retention_schedule(deployment.schedule_status)],
    )
