"""Dagster definitions, one folder per domain. The only package (with definitions.py) that imports dagster.

extracts/     one asset per data source (events: daily partitions), schema and volume checks, new-data sensor
cache/        event_cache (in-process) and its manifest check
models/       foundation_model, scenario_baselines, scenario_model (Pipes; dynamic partitions "scenarios"),
              loss/metric checks,
              the scenario-registry sensor
predictions/  predictions (per scenario), entity_embeddings (Pipes)
reports/      metrics_summary (in-process)
publish/      published_artifacts: finished artifacts to s3:// (when BASEMODEL_PUBLISH_URL is set)
maintenance/  workspace_retention (the config's retention policy) and its daily schedule
alerts/       alert sensors (failed runs, failed checks) with their sinks; freshness checks of the outputs
automation.py declarative automation conditions and the automation sensor
schedules.py  jobs and the nightly schedule
launcher.py   the launcher resource (subprocess | docker | k8s | ecs); cleanup.py: docker run-status sensors
resources.py  the resource set of each environment (BASEMODEL_ENV)
"""

from __future__ import annotations

import dagster as dg

from basemodel_pipeline.defs.alerts import build_alert_definitions
from basemodel_pipeline.defs.automation import automation_sensor
from basemodel_pipeline.defs.cache.assets import build_cache_asset
from basemodel_pipeline.defs.cache.checks import build_cache_check
from basemodel_pipeline.defs.cleanup import build_cleanup_sensors
from basemodel_pipeline.defs.extracts.assets import build_extract_assets, days_partitions, extract_key
from basemodel_pipeline.defs.extracts.checks import build_extract_checks
from basemodel_pipeline.defs.extracts.sensors import build_new_data_sensor
from basemodel_pipeline.defs.maintenance import build_maintenance_definitions
from basemodel_pipeline.defs.models.assets import foundation_model, scenario_baselines, scenario_model
from basemodel_pipeline.defs.models.checks import model_checks
from basemodel_pipeline.defs.models.partitions import scenarios_partitions
from basemodel_pipeline.defs.models.retrain import build_retrain_sensor
from basemodel_pipeline.defs.models.sensors import build_scenario_registry_sensor
from basemodel_pipeline.defs.predictions.assets import entity_embeddings, predictions
from basemodel_pipeline.defs.predictions.checks import predictions_checks
from basemodel_pipeline.defs.publish.assets import published_artifacts
from basemodel_pipeline.defs.reports.assets import metrics_summary
from basemodel_pipeline.defs.resources import config_path_from_env, current_env, resources_for
from basemodel_pipeline.defs.schedules import build_jobs, build_nightly_schedule
from basemodel_pipeline.defs.shape import shape_config
from basemodel_pipeline.settings import setting

__all__ = ["build_assets", "build_checks", "build_definitions", "scenarios_partitions"]

# BASEMODEL_AUTOMATION=stopped starts sensors and the schedule stopped (tests, a paused deployment).
AUTOMATION_ENV_VAR = "BASEMODEL_AUTOMATION"
# BASEMODEL_RUN_LAUNCHER=docker: the instance starts run workers as containers (docker-compose.yml sets it)
RUN_LAUNCHER_ENV_VAR = "BASEMODEL_RUN_LAUNCHER"


def build_assets(config_path: str, publish: bool = False) -> list[dg.AssetsDefinition]:
    cfg = shape_config(config_path)
    days = days_partitions(cfg.data_params.data_start_date)
    extracts = build_extract_assets(list(cfg.data_sources), days)
    cache = build_cache_asset([extract_key(s.name) for s in cfg.data_sources])
    assets = [
        *extracts,
        cache,
        foundation_model,
        scenario_baselines,
        scenario_model,
        predictions,
        entity_embeddings,
        metrics_summary,
    ]
    return [*assets, published_artifacts] if publish else assets


def build_checks(config_path: str) -> list[dg.AssetChecksDefinition]:
    cfg = shape_config(config_path)
    checks = [c for s in cfg.data_sources for c in build_extract_checks(s, extract_key(s.name))]
    return [*checks, build_cache_check(dg.AssetKey("event_cache")), *model_checks, *predictions_checks]


def build_definitions(config_path: str | None = None, env: str | None = None) -> dg.Definitions:
    """All definitions for one config file and environment (defaults: BASEMODEL_CONFIG, BASEMODEL_ENV)."""
    env = env or current_env()
    shape_path = config_path or config_path_from_env()
    resources = resources_for(env, config_path)
    running = setting(AUTOMATION_ENV_VAR, "running") != "stopped"
    sensor_status = dg.DefaultSensorStatus.RUNNING if running else dg.DefaultSensorStatus.STOPPED
    schedule_status = dg.DefaultScheduleStatus.RUNNING if running else dg.DefaultScheduleStatus.STOPPED
    cfg = shape_config(shape_path)
    event_keys = [extract_key(s.name) for s in cfg.data_sources if s.type == "event"]
    sensors = [
        build_scenario_registry_sensor(sensor_status),
        build_retrain_sensor(sensor_status),
        build_new_data_sensor(event_keys, sensor_status),
        automation_sensor(sensor_status),
    ]
    # containers to clean up: trainer containers (docker launcher) or run workers (DockerRunLauncher)
    if resources["launcher"].backend == "docker" or setting(RUN_LAUNCHER_ENV_VAR) == "docker":
        sensors += build_cleanup_sensors()
    pipeline = dg.Definitions(
        assets=build_assets(shape_path, publish="publisher" in resources),
        asset_checks=build_checks(shape_path),
        jobs=build_jobs([extract_key(s.name) for s in cfg.data_sources]),
        schedules=[build_nightly_schedule(schedule_status)],
        sensors=sensors,
        resources=resources,
    )
    extra = [build_maintenance_definitions(schedule_status), build_alert_definitions(sensor_status)]
    return dg.Definitions.merge(pipeline, *extra)
