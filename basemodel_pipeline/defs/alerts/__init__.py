"""Alerts and freshness: failed runs and failed checks go to a sink (webhook, Slack, or a log line);
predictions and embeddings carry freshness checks (docs/orchestration.md, "Alerts and freshness")."""

from __future__ import annotations

import dagster as dg

from basemodel_pipeline.defs.alerts.freshness import build_freshness_checks, build_freshness_sensor
from basemodel_pipeline.defs.alerts.resources import AlertSinks, alert_sinks_from_env
from basemodel_pipeline.defs.alerts.sensors import build_alert_sensors

__all__ = ["AlertSinks", "build_alert_definitions"]


def build_alert_definitions(default_status: dg.DefaultSensorStatus) -> dg.Definitions:
    """The alert sensors, the freshness checks and their sensor, and the `alerts` resource (from the env)."""
    checks = build_freshness_checks()
    return dg.Definitions(
        asset_checks=checks,
        sensors=[*build_alert_sensors(default_status), build_freshness_sensor(checks, default_status)],
        resources={"alerts": alert_sinks_from_env()},
    )
