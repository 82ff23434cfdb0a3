"""The scenario registry: keep the `scenarios` dynamic partitions equal to the scenarios in the config, and
retrain a model whose part of the config was edited."""

import json
from pathlib import Path

import dagster as dg

from basemodel_pipeline.config import load_config
from basemodel_pipeline.config.versions import FOUNDATION, model_config_versions
from basemodel_pipeline.defs.shared.partitions import scenarios_partitions
from basemodel_pipeline.defs.shared.resources import BasemodelConfigResource

SCENARIO_ASSETS = [
    dg.AssetKey("scenario_baselines"),
    dg.AssetKey("scenario_model"),
    dg.AssetKey("predictions"),
]


def edited_model_requests(
    before: dict[str, str], now: dict[str, str], existing: list[str]
) -> list[dg.RunRequest]:
    """A run for each model whose config version differs from the one recorded on the previous tick.

    New scenarios are left to the automation (a new partition trains once); the run key names the version,
    so a repeated tick never trains the same edit twice."""
    requests = []
    for name, version in now.items():
        if before.get(name) in (None, version):
            continue
        tags = {"basemodel/trigger": "config_edited"}
        if name == FOUNDATION:
            requests.append(
                dg.RunRequest(
                    run_key=f"config:{name}:{version}",
                    asset_selection=[dg.AssetKey("foundation_model")],
                    tags=tags,
                )
            )
        elif name in existing:
            requests.append(
                dg.RunRequest(
                    run_key=f"config:{name}:{version}",
                    asset_selection=SCENARIO_ASSETS,
                    partition_key=name,
                    tags=tags,
                )
            )
    return requests


def build_scenario_registry_sensor(default_status: dg.DefaultSensorStatus) -> dg.SensorDefinition:
    @dg.sensor(
        name="scenario_registry_sensor",
        minimum_interval_seconds=60,
        default_status=default_status,
        asset_selection=[dg.AssetKey("foundation_model"), *SCENARIO_ASSETS],
    )
    def scenario_registry_sensor(
        context: dg.SensorEvaluationContext, basemodel_config: BasemodelConfigResource
    ) -> dg.SensorResult | dg.SkipReason:
        """Add a partition for each new scenario in the config; remove those that left it; retrain a model
        whose part of the config changed since the last tick (cursor: the config version of each model).

        A removed scenario's partition disappears from the UI; its checkpoints stay in the workspace, and
        adding the scenario back brings its materialization history back too.
        """
        if not Path(basemodel_config.config_path).is_file():
            return dg.SkipReason(f"config {basemodel_config.config_path} does not exist yet")
        cfg = load_config(basemodel_config.config_path)
        wanted = [sc.name for sc in cfg.scenarios]
        existing = context.instance.get_dynamic_partitions(scenarios_partitions.name)
        added = [name for name in wanted if name not in existing]
        removed = [name for name in existing if name not in wanted]
        versions = model_config_versions(cfg)
        before = json.loads(context.cursor) if context.cursor else {}
        edited = edited_model_requests(before, versions, existing)
        partition_requests = []
        if added:
            partition_requests.append(scenarios_partitions.build_add_request(added))
        if removed:
            partition_requests.append(scenarios_partitions.build_delete_request(removed))
        if added or removed:
            context.log.info(f"scenarios added: {added or 'none'}; removed: {removed or 'none'}")
        if edited:
            context.log.info(f"config edited, retraining: {[r.run_key for r in edited]}")
        return dg.SensorResult(
            run_requests=edited,
            dynamic_partitions_requests=partition_requests,
            cursor=json.dumps(versions, sort_keys=True),
        )

    return scenario_registry_sensor
