"""The event cache: its asset (in-process) and its manifest check."""

from __future__ import annotations

import dagster as dg

from basemodel_pipeline.defs.cache.assets import build_cache_asset
from basemodel_pipeline.defs.cache.checks import build_cache_check
from basemodel_pipeline.defs.extracts.assets import extract_key
from basemodel_pipeline.defs.shared.deployment import Deployment


def defs(deployment: Deployment) -> dg.Definitions:
    extracts = [extract_key(s.name) for s in deployment.shape.data_sources]
    return dg.Definitions(
        assets=[build_cache_asset(extracts)], asset_checks=[build_cache_check(dg.AssetKey("event_cache"))]
    )
