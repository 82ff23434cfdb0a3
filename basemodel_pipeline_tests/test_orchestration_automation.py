"""Declarative automation on the real definitions, evaluated against a persistent test instance.

Materializations are recorded as runless asset events (what a finished run records), so each test runs in
about a second: a new foundation requests every scenario exactly once; a new scenario partition requests
exactly one scenario_model (and its predictions, in the same run); a missing foundation is trained once.
"""

from pathlib import Path

import dagster as dg
import pytest

from basemodel_pipeline.defs import build_definitions
from basemodel_pipeline.defs.extracts.assets import extract_key

MODEL, PREDICTIONS = dg.AssetKey("scenario_model"), dg.AssetKey("predictions")
UPSTREAM = ["event_cache", "foundation_model", "entity_embeddings"]


@pytest.fixture
def defs(tiny_dataset: Path, monkeypatch: pytest.MonkeyPatch) -> dg.Definitions:
    monkeypatch.delenv("BASEMODEL_PUBLISH_URL", raising=False)
    return build_definitions(str(tiny_dataset), env="ci")


CHECKS = {
    "event_cache": ["manifest_sha256"],
    "foundation_model": ["loss_finite_and_improving"],
    "scenario_model": ["test_metric_above_floor", "beats_popularity"],
}


def _materialized(
    instance: dg.DagsterInstance, key: str | dg.AssetKey, partition: str | None = None, checks: bool = True
) -> None:
    """A materialization and its blocking checks' evaluations, as a finished run records them."""
    key = dg.AssetKey.from_user_string(key) if isinstance(key, str) else key
    instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=key, partition=partition))
    for name in CHECKS.get(key.to_user_string(), []) if checks else []:
        instance.report_runless_asset_event(
            dg.AssetCheckEvaluation(asset_key=key, check_name=name, passed=checks, partition=partition)
        )


def _everything_materialized(instance: dg.DagsterInstance, scenarios: list[str]) -> None:
    for source in ("products", "demographics"):
        _materialized(instance, extract_key(source))
    _materialized(instance, extract_key("transactions"), "2023-01-02")
    for key in UPSTREAM:
        _materialized(instance, key)
    for name in scenarios:
        _materialized(instance, MODEL, name)
        _materialized(instance, PREDICTIONS, name)
    _materialized(instance, "metrics_summary")


def test_new_foundation_requests_every_scenario_once(defs: dg.Definitions) -> None:
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("scenarios", ["churn", "department_propensity"])
        _everything_materialized(instance, ["churn", "department_propensity"])
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        assert first.total_requested == 0  # everything is up to date

        _materialized(instance, "foundation_model")
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
        assert result.get_requested_partitions(MODEL) == {"churn", "department_propensity"}
        assert result.get_requested_partitions(PREDICTIONS) == {"churn", "department_propensity"}
        assert result.get_num_requested(dg.AssetKey("entity_embeddings")) == 1

        again = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=result.cursor)
        assert again.get_num_requested(MODEL) == 0  # requested once, not on every tick


def test_new_scenario_partition_requests_exactly_one_run(defs: dg.Definitions) -> None:
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("scenarios", ["churn"])
        _everything_materialized(instance, ["churn"])
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        assert first.total_requested == 0

        instance.add_dynamic_partitions("scenarios", ["department_propensity"])
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
        assert result.get_requested_partitions(MODEL) == {"department_propensity"}
        # predictions of the same partition join the same run; nothing else is requested
        assert result.get_requested_partitions(PREDICTIONS) == {"department_propensity"}
        assert result.total_requested == 2

        again = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=result.cursor)
        assert again.total_requested == 0


def test_new_cache_retrains_scenarios_after_the_cache_settles(defs: dg.Definitions) -> None:
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("scenarios", ["churn"])
        _everything_materialized(instance, ["churn"])
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)

        _materialized(instance, extract_key("transactions"), "2023-01-03")  # a new day landed
        tick = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
        assert tick.get_num_requested(dg.AssetKey("event_cache")) == 1
        assert tick.get_num_requested(MODEL) == 0  # waits for the cache requested on this tick

        _materialized(instance, "event_cache")
        after = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=tick.cursor)
        assert after.get_requested_partitions(MODEL) == {"churn"}
        assert after.get_num_requested(dg.AssetKey("foundation_model")) == 0  # weekly, not per cache


def test_missing_foundation_is_trained_once_the_cache_exists(defs: dg.Definitions) -> None:
    with dg.instance_for_test() as instance:
        for source in ("products", "demographics"):
            _materialized(instance, extract_key(source))
        _materialized(instance, extract_key("transactions"), "2023-01-02")
        _materialized(instance, "event_cache")
        counts, cursor = [], None
        for _ in range(3):  # the first tick only records the state; the request follows once
            result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
            counts.append(result.get_num_requested(dg.AssetKey("foundation_model")))
            cursor = result.cursor
        assert sum(counts) == 1 and counts[-1] == 0


def test_automation_sensor_runs_by_default(defs: dg.Definitions) -> None:
    sensor = defs.resolve_sensor_def("basemodel_automation")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert sensor.asset_selection is not None
