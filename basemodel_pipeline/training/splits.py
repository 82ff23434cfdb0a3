"""Split points: which (entity, time) pairs are training, validation and test examples."""

from __future__ import annotations

import datetime as dt

import numpy as np

from basemodel_pipeline.config.models import DataParams
from basemodel_pipeline.dates import epoch_seconds
from basemodel_pipeline.errors import ConfigError


def scenario_split_times(
    dp: DataParams, horizon_days: int, field: str, last_day: dt.date | None = None, newest: bool = False
) -> dict[str, np.ndarray]:
    """Weekly split points: train targets end by validation_start_date, validation targets by
    training_end_date; the test split points are training_end_date and, when the data's last event day
    `last_day` is known, the points after it whose targets end by that day (``test_points``). With `newest`,
    "newest" holds the points after the test points whose targets also end by that day (beyond
    test_split_points: only the production refit learns from them); it is left out when there are none."""
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
    tested = test_points(dp, horizon_days, last_day)
    out = {
        "train": np.array(train, np.int64),
        "val": np.array(val, np.int64),
        "test": np.array([epoch_seconds(t) for t in tested], np.int64),
    }
    if newest and last_day is not None:
        later = points(tested[-1] + step, last_day)
        if later:
            out["newest"] = np.array(later, np.int64)
    return out


def test_points(dp: DataParams, horizon_days: int, last_day: dt.date | None) -> list[dt.date]:
    """training_end_date, then every split_interval_days while the target window ends by `last_day` (the last
    event day, counted as partial like ``training_end_date: auto`` does), at most ``dp.test_split_points``.
    The first point is always there: the config check (sources/cross_checks.py) makes sure its window fits."""
    step, horizon = dt.timedelta(days=dp.split_interval_days), dt.timedelta(days=horizon_days)
    out = [dp.test_date]
    while last_day is not None and len(out) < dp.test_split_points and out[-1] + step + horizon <= last_day:
        out.append(out[-1] + step)
    return out
