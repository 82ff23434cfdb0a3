"""Maintenance: the workspace retention policy runs by itself (`workspace_retention`, daily schedule)."""

from __future__ import annotations

import dagster as dg

from basemodel_pipeline.defs.maintenance.assets import workspace_retention
from basemodel_pipeline.defs.maintenance.schedules import build_retention_schedule, prune_workspace

__all__ = ["build_maintenance_definitions", "workspace_retention"]


def build_maintenance_definitions(schedule_status: dg.DefaultScheduleStatus) -> dg.Definitions:
    """The retention asset, its job and its daily schedule (resources come from the main definitions)."""
    return dg.Definitions(
        assets=[workspace_retention],
        jobs=[prune_workspace],
        schedules=[build_retention_schedule(schedule_status)],
    )
