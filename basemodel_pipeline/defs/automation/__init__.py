"""Automation: the sensor that evaluates every asset's declarative automation condition (shared/conditions.py)."""

from __future__ import annotations

import dagster as dg

from basemodel_pipeline.defs.automation.sensors import automation_sensor
from basemodel_pipeline.defs.shared.deployment import Deployment


def defs(deployment: Deployment) -> dg.Definitions:
    return dg.Definitions(sensors=[automation_sensor(deployment.sensor_status)])
