"""Models: foundation_model, scenario_baselines and scenario_model (Pipes; dynamic partitions "scenarios"),
their checkpoint, loss and metric checks, the scenario-registry sensor and the retrain sensor."""

from __future__ import annotations

import dagster as dg

from basemodel_pipeline.defs.models.assets import foundation_model, scenario_baselines, scenario_model
from basemodel_pipeline.defs.models.checks import model_checks
from basemodel_pipeline.defs.models.retrain import build_retrain_sensor
from basemodel_pipeline.defs.models.sensors import build_scenario_registry_sensor
from basemodel_pipeline.defs.shared.deployment import Deployment


def defs(deployment: Deployment) -> dg.Definitions:
    return dg.Definitions(
        assets=[foundation_model, scenario_baselines, scenario_model],
        asset_checks=model_checks,
        sensors=[
            build_scenario_registry_sensor(deployment.sensor_status),
            build_retrain_sensor(deployment.sensor_status),
        ],
    )
