"""Keep the `scenarios` dynamic partitions in step with the scenarios the config defines."""

from pathlib import Path

import dagster as dg

from basemodel_pipeline.config import load_config
from basemodel_pipeline.defs.models.partitions import scenarios_partitions
from basemodel_pipeline.defs.resources import BasemodelConfigResource


@dg.sensor(minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING)
def scenario_partitions_sensor(
    context: dg.SensorEvaluationContext, basemodel_config: BasemodelConfigResource
) -> dg.SensorResult | dg.SkipReason:
    """Add a partition for every scenario in the config that has none yet (never deletes history)."""
    if not Path(basemodel_config.config_path).is_file():
        return dg.SkipReason(f"config {basemodel_config.config_path} does not exist yet")
    wanted = [sc.name for sc in load_config(basemodel_config.config_path).scenarios]
    existing = set(context.instance.get_dynamic_partitions(scenarios_partitions.name))
    missing = [name for name in wanted if name not in existing]
    if not missing:
        return dg.SkipReason("every scenario has its partition")
    return dg.SensorResult(dynamic_partitions_requests=[scenarios_partitions.build_add_request(missing)])
