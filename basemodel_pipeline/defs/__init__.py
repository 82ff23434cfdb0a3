"""Dagster definitions, one folder per domain. The only package (with definitions.py) that imports dagster.

extracts/     one asset per data source (in-process, DuckDB -> Parquet)
cache/        event_cache (in-process)
models/       foundation_model, scenario_model (Pipes subprocess; dynamic partitions "scenarios")
predictions/  predictions (Pipes subprocess; same partitions)
reports/      metrics_summary (in-process)
resources.py  the resource set of each environment (BASEMODEL_ENV)
"""

from __future__ import annotations

import dagster as dg

from basemodel_pipeline.defs.cache.assets import build_cache_asset
from basemodel_pipeline.defs.extracts.assets import build_extract_assets, extract_key
from basemodel_pipeline.defs.models.assets import foundation_model, scenario_model
from basemodel_pipeline.defs.models.partitions import scenarios_partitions
from basemodel_pipeline.defs.models.sensors import scenario_partitions_sensor
from basemodel_pipeline.defs.predictions.assets import entity_embeddings, predictions
from basemodel_pipeline.defs.reports.assets import metrics_summary
from basemodel_pipeline.defs.resources import config_path_from_env, current_env, resources_for
from basemodel_pipeline.defs.shape import data_sources

__all__ = ["build_assets", "build_definitions", "scenarios_partitions"]


def build_assets(config_path: str) -> list[dg.AssetsDefinition]:
    sources = data_sources(config_path)
    extracts = build_extract_assets(sources)
    cache = build_cache_asset([extract_key(s.name) for s in sources])
    return [
        *extracts,
        cache,
        foundation_model,
        scenario_model,
        predictions,
        entity_embeddings,
        metrics_summary,
    ]


def build_definitions(config_path: str | None = None, env: str | None = None) -> dg.Definitions:
    """All definitions for one config file and environment (defaults: BASEMODEL_CONFIG, BASEMODEL_ENV)."""
    env = env or current_env()
    shape_path = config_path or config_path_from_env()
    return dg.Definitions(
        assets=build_assets(shape_path),
        sensors=[scenario_partitions_sensor],
        resources=resources_for(env, config_path),
    )
