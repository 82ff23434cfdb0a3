"""Dagster definitions: one folder per domain, each exposing `defs(deployment) -> dg.Definitions`; this root
only merges them. The only package (with definitions.py) that imports dagster.

extracts/     one asset per data source (events: daily partitions), schema and volume checks, the new-data
              sensor, the refresh jobs and the nightly schedule
cache/        event_cache (in-process) and its manifest check
models/       foundation_model, scenario_baselines, scenario_model (Pipes; dynamic partitions "scenarios"),
              checkpoint/loss/metric checks, the scenario-registry and retrain sensors
predictions/  predictions (per scenario), entity_embeddings (Pipes), the output check
reports/      metrics_summary (in-process)
upload/       uploaded_artifacts: finished artifacts to s3:// (when BASEMODEL_UPLOAD_URL is set)
maintenance/  workspace_retention (the config's retention policy) and its daily schedule
alerts/       alert sensors (failed runs, failed checks) with their sinks; freshness checks of the outputs
automation/   the automation sensor (the conditions themselves: shared/conditions.py)
containers/   run-status sensors removing finished runs' containers (container deployments)
shared/       infrastructure, no definitions: the Deployment every defs() reads, resources per environment
              (BASEMODEL_ENV), the launcher (subprocess | docker | k8s | ecs), code versions, conditions,
              partitions, the graph's shape, how assets run a stage
materialize.py  runs the whole graph in-process (`basemodel demo`, tests); not part of the definitions
"""

from __future__ import annotations

import dagster as dg

from basemodel_pipeline.defs import (
    alerts,
    automation,
    cache,
    containers,
    extracts,
    maintenance,
    models,
    predictions,
    reports,
    upload,
)
from basemodel_pipeline.defs.shared.deployment import Deployment, deployment, shape_only

__all__ = ["build_assets", "build_checks", "build_definitions"]

# The asset graph proper, in dependency order (what an in-process run materializes).
PIPELINE = (extracts, cache, models, predictions, reports, upload)
# Everything else a deployment runs beside it.
OPERATIONS = (maintenance, alerts, automation, containers)


def _pipeline(d: Deployment) -> list[dg.Definitions]:
    return [domain.defs(d) for domain in PIPELINE]


def build_assets(config_path: str, upload: bool = False, env: str = "local") -> list[dg.AssetsDefinition]:
    """The pipeline's assets for one config (uploaded_artifacts only with `upload`)."""
    return [a for d in _pipeline(shape_only(config_path, upload, env)) for a in d.assets or []]  # type: ignore[misc]


def build_checks(config_path: str, env: str = "local") -> list[dg.AssetChecksDefinition]:
    """The pipeline's asset checks for one config (the freshness checks of alerts/ excluded)."""
    return [c for d in _pipeline(shape_only(config_path, env=env)) for c in d.asset_checks or []]  # type: ignore[misc]


def build_definitions(config_path: str | None = None, env: str | None = None) -> dg.Definitions:
    """All definitions for one config file and environment (defaults: BASEMODEL_CONFIG, BASEMODEL_ENV)."""
    d = deployment(config_path, env)
    domains = [domain.defs(d) for domain in (*PIPELINE, *OPERATIONS)]
    return dg.Definitions.merge(dg.Definitions(resources=dict(d.resources)), *domains)
