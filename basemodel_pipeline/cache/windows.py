"""Rolling windows: a config's relative split dates resolved against the data in the cache.

`training_end_date: auto` follows the data: each run trains and tests on the newest labelled windows, so a
retrain after new days land learns from them (docs/orchestration.md, "Rolling windows").
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from basemodel_pipeline.config import PipelineConfig


def resolve_windows(cfg: PipelineConfig, last_event_day: dt.date | None = None) -> PipelineConfig:
    """`cfg` with concrete split dates (itself when they are fixed). The last event day defaults to the cache's."""
    if not cfg.data_params.rolling:
        return cfg
    if last_event_day is None:
        from basemodel_pipeline.cache.store import EventCache
        from basemodel_pipeline.workspace import cache_dir

        last_event_day = EventCache(cache_dir(cfg)).max_date
    dp = cfg.data_params.resolved(last_event_day, cfg.longest_horizon_days)
    return cfg.model_copy(update={"data_params": dp})


def windows_metadata(cfg: PipelineConfig) -> dict[str, Any]:
    """The split dates a run used (recorded in checkpoints and in the asset metadata)."""
    dp = cfg.data_params
    return {
        "training_start_date": dp.first_split.isoformat(),
        "validation_start_date": dp.validation_start.isoformat(),
        "training_end_date": dp.test_date.isoformat(),
    }
