"""The test windows: the test split point (training_end_date) and the split points after it whose target
windows end inside the data, up to data_params.test_split_points, so the test metrics rest on several weeks."""

import datetime as dt

import numpy as np

from basemodel_pipeline.config.params import DataParams
from basemodel_pipeline.dates import epoch_seconds
from basemodel_pipeline.training.splits import scenario_split_times

D = dt.date


def _dates(times: np.ndarray) -> list[dt.date]:
    return [dt.datetime.fromtimestamp(int(t), dt.UTC).date() for t in times]


def _params(**extra) -> DataParams:
    return DataParams(
        data_start_date=D(2017, 1, 1),
        validation_start_date=D(2017, 10, 4),
        training_end_date=D(2017, 11, 15),
        **extra,
    )


def test_every_weekly_test_point_whose_window_ends_by_the_last_event_day_is_tested() -> None:
    # the last event day counts as partial (as for training_end_date: auto): a window must end by its start
    t = scenario_split_times(_params(), 28, "scenario 'churn'", last_day=D(2018, 1, 1))
    assert _dates(t["test"]) == [D(2017, 11, 15), D(2017, 11, 22), D(2017, 11, 29)]
    assert t["test"][0] == epoch_seconds(D(2017, 11, 15))
    # a shorter horizon fits more points, up to test_split_points (4 by default)
    t = scenario_split_times(_params(), 14, "scenario 'dept'", last_day=D(2018, 1, 1))
    assert _dates(t["test"]) == [D(2017, 11, 15), D(2017, 11, 22), D(2017, 11, 29), D(2017, 12, 6)]
    t = scenario_split_times(_params(test_split_points=6), 14, "scenario 'dept'", last_day=D(2018, 1, 1))
    assert len(t["test"]) == 5  # Dec 13 + 14 days = Dec 27 fits; Dec 20 + 14 = Jan 3 does not


def test_one_test_point_when_asked_or_when_no_later_window_fits() -> None:
    t = scenario_split_times(_params(test_split_points=1), 7, "s", last_day=D(2018, 1, 1))
    assert _dates(t["test"]) == [D(2017, 11, 15)]
    # training_end_date = the last event day minus the horizon (auto): only the test split point itself
    t = scenario_split_times(_params(), 28, "s", last_day=D(2017, 12, 13))
    assert _dates(t["test"]) == [D(2017, 11, 15)]
    # no data end known (a caller without a cache): the test split point alone
    assert _dates(scenario_split_times(_params(), 7, "s")["test"]) == [D(2017, 11, 15)]
    # the test points follow split_interval_days
    t = scenario_split_times(_params(split_interval_days=3), 28, "s", last_day=D(2018, 1, 1))
    assert _dates(t["test"]) == [D(2017, 11, 15), D(2017, 11, 18), D(2017, 11, 21), D(2017, 11, 24)]
