"""Split points: which (entity, time) pairs are training, validation and test examples."""

from __future__ import annotations

import datetime as dt

import numpy as np

from basemodel_pipeline.config.models import DataParams
from basemodel_pipeline.dates import epoch_seconds
from basemodel_pipeline.errors import ConfigError


def scenario_split_times(dp: DataParams, horizon_days: int, field: str) -> dict[str, np.ndarray]:
    """Weekly split points: train targets end by validation_start_date, validation targets by
    training_end_date; the test split point is training_end_date."""
    step = dt.timedelta(days=dp.split_interval_days)
    horizon = dt.timedelta(days=horizon_days)

    def points(first: dt.date, last_target_end: dt.date) -> list[int]:
        out, t = [], first
        while t + horizon <= last_target_end:
            out.append(epoch_seconds(t))
            t += step
        return out

    train = points(dp.first_split, dp.validation_start)
    val = points(dp.validation_start, dp.test_date)
    if not train:
        raise ConfigError(
            f"{field}: a {horizon_days}-day target window does not fit between training_start_date "
            f"({dp.first_split}) and validation_start_date ({dp.validation_start}); shorten the horizon "
            "or move the dates"
        )
    if not val:
        raise ConfigError(
            f"{field}: a {horizon_days}-day target window does not fit between validation_start_date "
            f"({dp.validation_start}) and training_end_date ({dp.test_date})"
        )
    return {
        "train": np.array(train, np.int64),
        "val": np.array(val, np.int64),
        "test": np.array([epoch_seconds(dp.test_date)], np.int64),
    }
