"""The scenario registry: keep the `scenarios` dynamic partitions equal to the scenarios in the config."""

from pathlib import Path

import dagster as dg

from basemodel_pipeline.config import load_config
from basemodel_pipeline.defs.models.partitions import scenarios_partitions
from basemodel_pipeline.defs.resources import BasemodelConfigResource


def build_scenario_registry_sensor(default_status: dg.DefaultSensorStatus) -> dg.SensorDefinition:
    @dg.sensor(name="scenario_registry_sensor", minimum_interval_seconds=60, default_status=default_status)
    def scenario_registry_sensor(
        context: dg.SensorEvaluationContext, basemodel_config: BasemodelConfigResource
    ) -> dg.SensorResult | dg.SkipReason:
        """Add a partition for each new scenario in the config; remove those that left it.

        A removed scenario's partition disappears from the UI; its checkpoints stay in the workspace, and
        adding the scenario back brings its materialization history back too.
        """
        if not Path(basemodel_config.config_path).is_file():
            return dg.SkipReason(f"config {basemodel_config.config_path} does not exist yet")
        wanted = [sc.name for sc in load_config(basemodel_config.config_path).scenarios]
        existing = context.instance.get_dynamic_partitions(scenarios_partitions.name)
        added = [name for name in wanted if name not in existing]
        removed = [name for name in existing if name not in wanted]
        if not added and not removed:
            return dg.SkipReason(f"{len(wanted)} scenarios, each with its partition")
        requests = []
        if added:
            requests.append(scenarios_partitions.build_add_request(added))
        if removed:
            requests.append(scenarios_partitions.build_delete_request(removed))
        context.log.info(f"scenarios added: {added or 'none'}; removed: {removed or 'none'}")
        return dg.SensorResult(dynamic_partitions_requests=requests)

    return scenario_registry_sensor
