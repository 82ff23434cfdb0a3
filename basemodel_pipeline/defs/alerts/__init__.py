"""Alerts and freshness: failed runs and failed checks go to a sink (webhook, Slack, or a log line) once per
incident (the first failure, a reminder while it keeps failing, its recovery); predictions and embeddings
carry freshness checks (docs/orchestration.md, "Alerts and freshness")."""

from __future__ import annotations

import dagster as dg

from basemodel_pipeline.defs.alerts.freshness import build_freshness_checks, build_freshness_sensor
from basemodel_pipeline.defs.alerts.resources import alert_sinks_from_env
from basemodel_pipeline.defs.alerts.sensors import build_alert_sensors
from basemodel_pipeline.defs.shared.deployment import Deployment


def defs(deployment: Deployment) -> dg.Definitions:
    """The alert sensors, the freshness checks and their sensor, and the `alerts` resource (from the env)."""
    checks = build_freshness_checks()
    status = deployment.sensor_status
    return dg.Definitions(
        asset_checks=checks,
        sensors=[*build_alert_sensors(status), build_freshness_sensor(checks, status)],
        resources={"alerts": alert_sinks_from_env()},
    )
