"""The automation sensor: evaluates every asset's automation condition (shared/conditions.py)."""

from __future__ import annotations

import dagster as dg

from basemodel_pipeline.defs.shared.conditions import MAX_RUNTIME, MAX_RUNTIME_TAG


def automation_sensor(
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.RUNNING,
    run_tags: dict[str, str] | None = None,
) -> dg.AutomationConditionSensorDefinition:
    """Evaluates every asset's automation condition every 30 s; running by default."""
    return dg.AutomationConditionSensorDefinition(
        "basemodel_automation",
        target=dg.AssetSelection.all(),
        default_status=default_status,
        minimum_interval_seconds=30,
        run_tags={MAX_RUNTIME_TAG: str(MAX_RUNTIME["train"]), **(run_tags or {})},
    )
