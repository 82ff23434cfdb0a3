"""Containers: run-status sensors that remove a run's containers once it ends (container deployments only)."""

from __future__ import annotations

import dagster as dg

from basemodel_pipeline.defs.containers.sensors import build_cleanup_sensors
from basemodel_pipeline.defs.shared.deployment import Deployment


def defs(deployment: Deployment) -> dg.Definitions:
    return dg.Definitions(sensors=build_cleanup_sensors() if deployment.containers else [])
