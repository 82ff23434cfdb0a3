"""Declarative automation on the real definitions, evaluated against a persistent test instance.

Materializations are recorded as runless asset events (what a finished run records), so each test runs in
about a second: a new foundation requests every scenario exactly once; a new scenario partition requests
exactly one scenario_model (with its baselines and predictions, in the same run); a missing foundation is
trained once.
"""

import uuid
from collections.abc import Mapping
from pathlib import Path

import dagster as dg
import pytest

# The type of AssetCheckEvaluation's public target_materialization_data argument, which dagster does not export:
# a private import in the tests only (reporting a check evaluation against a given materialization).
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)

from basemodel_pipeline.defs import build_definitions
from basemodel_pipeline.defs.extracts.assets import extract_key

DATA_VERSION_TAG = "dagster/data_version"
MODEL, PREDICTIONS = dg.AssetKey("scenario_model"), dg.AssetKey("predictions")
BASELINES = dg.AssetKey("scenario_baselines")
UPSTREAM = ["event_cache", "foundation_model", "entity_embeddings"]


@pytest.fixture
def defs(tiny_dataset: Path, monkeypatch: pytest.MonkeyPatch) -> dg.Definitions:
    monkeypatch.delenv("BASEMODEL_UPLOAD_URL", raising=False)
    return build_definitions(str(tiny_dataset), env="ci")


CHECKS = {
    **{f"extracts/{source}": ["schema_unchanged"] for source in ("transactions", "products", "demographics")},
    "event_cache": ["manifest_sha256"],
    "foundation_model": ["checkpoint_sha256", "loss_finite_and_improving"],
    "scenario_model": [
        "checkpoint_sha256",
        "test_metric_above_floor",
        "beats_popularity",
        "refit_outputs_finite",
    ],
    "predictions": ["output_sha256"],
}


def _materialized(
    instance: dg.DagsterInstance,
    key: str | dg.AssetKey,
    partition: str | None = None,
    checks: bool | None = True,
    version: str | None = None,
    metadata: Mapping[str, object] | None = None,
) -> None:
    """A materialization (new content: a new data version unless `version` is given; with the step's
    `metadata`) and its blocking checks' evaluations, as a finished run records them: passed, failed
    (`checks=False`) or none (`checks=None`)."""
    key = dg.AssetKey.from_user_string(key) if isinstance(key, str) else key
    tags = {DATA_VERSION_TAG: version or uuid.uuid4().hex}
    instance.report_runless_asset_event(
        dg.AssetMaterialization(asset_key=key, partition=partition, tags=tags, metadata=metadata)
    )
    (record,) = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None), limit=1
    ).records
    target = AssetCheckEvaluationTargetMaterializationData(
        storage_id=record.storage_id, run_id=record.run_id, timestamp=record.timestamp
    )
    for name in CHECKS.get(key.to_user_string(), []) if checks is not None else []:
        instance.report_runless_asset_event(
            dg.AssetCheckEvaluation(
                asset_key=key,
                check_name=name,
                passed=checks,
                partition=None if key.path[0] == "extracts" else partition,  # the extracts' are unpartitioned
                target_materialization_data=target,  # evaluated against this materialization, as in a run
            )
        )


def _everything_materialized(instance: dg.DagsterInstance, scenarios: list[str]) -> None:
    for source in ("products", "demographics"):
        _materialized(instance, extract_key(source))
    _materialized(instance, extract_key("transactions"), "2023-01-02")
    for key in UPSTREAM:
        _materialized(instance, key)
    for name in scenarios:
        _materialized(instance, BASELINES, name)
        _materialized(instance, MODEL, name)
        _materialized(instance, PREDICTIONS, name)
    _materialized(instance, "metrics_summary")


def test_new_foundation_rewrites_embeddings_and_leaves_scenarios_to_the_retrain_sensor(
    defs: dg.Definitions,
) -> None:
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("scenarios", ["churn", "department_propensity"])
        _everything_materialized(instance, ["churn", "department_propensity"])
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        assert first.total_requested == 0  # everything is up to date

        _materialized(instance, "foundation_model")
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
        assert result.get_num_requested(dg.AssetKey("entity_embeddings")) == 1
        # scenario_retrain_sensor compares the foundation version each model used (test_orchestration_retrain)
        assert result.get_num_requested(MODEL) == result.get_num_requested(BASELINES) == 0

        again = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=result.cursor)
        assert again.total_requested == 0  # requested once, not on every tick


def test_new_scenario_partition_requests_exactly_one_run(defs: dg.Definitions) -> None:
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("scenarios", ["churn"])
        _everything_materialized(instance, ["churn"])
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        assert first.total_requested == 0

        instance.add_dynamic_partitions("scenarios", ["department_propensity"])
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
        assert result.get_requested_partitions(MODEL) == {"department_propensity"}
        # its baselines (the CPU step) and predictions join the same run; nothing else is requested
        assert result.get_requested_partitions(BASELINES) == {"department_propensity"}
        assert result.get_requested_partitions(PREDICTIONS) == {"department_propensity"}
        assert result.total_requested == 3

        again = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=result.cursor)
        assert again.total_requested == 0


def test_a_new_cache_is_left_to_the_retrain_sensor(defs: dg.Definitions) -> None:
    """Retraining and scoring a new cache are scenario_retrain_sensor's, per policy; the automation scores a new
    model (test_orchestration_scoring: once per scenario, model and cache)."""
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("scenarios", ["churn"])
        _everything_materialized(instance, ["churn"])
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)

        _materialized(instance, extract_key("transactions"), "2023-01-03")  # a new day landed
        tick = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
        assert tick.get_num_requested(dg.AssetKey("event_cache")) == 1

        _materialized(instance, "event_cache")
        after = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=tick.cursor)
        assert after.get_num_requested(PREDICTIONS) == after.get_num_requested(MODEL) == 0
        assert after.get_num_requested(dg.AssetKey("foundation_model")) == 0  # weekly, not per cache


def test_a_scenario_trained_before_its_checks_existed_is_still_rescored(defs: dg.Definitions) -> None:
    """A model materialized before its blocking checks existed (no evaluation at all) does not hold its
    predictions back for ever: only an update whose blocking checks have not passed does."""
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("scenarios", ["churn"])
        _everything_materialized(instance, [])
        for key in (BASELINES, MODEL, PREDICTIONS):
            _materialized(instance, key, "churn", checks=None)
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)

        released = _with_spec(defs, PREDICTIONS, code_version="next-release")  # a release of the scores' code
        tick = dg.evaluate_automation_conditions(defs=released, instance=instance, cursor=first.cursor)
        assert tick.get_requested_partitions(PREDICTIONS) == {"churn"}


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


def test_an_unchanged_data_version_triggers_nothing(defs: dg.Definitions) -> None:
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("scenarios", ["churn"])
        _everything_materialized(instance, ["churn"])
        _materialized(instance, "event_cache", version="cache-v1")
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)

        # a nightly refresh re-extracts an unchanged day and the cache run reuses the same content
        _materialized(instance, extract_key("transactions"), "2023-01-02", version="day-v1")
        _materialized(instance, extract_key("transactions"), "2023-01-02", version="day-v1")
        _materialized(instance, "event_cache", version="cache-v1")
        tick = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
        assert tick.total_requested == 0

        _materialized(instance, "event_cache", version="cache-v2")  # new content: new embeddings
        tick = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=tick.cursor)
        assert tick.get_num_requested(dg.AssetKey("entity_embeddings")) == 1


def _with_spec(defs: dg.Definitions, key: dg.AssetKey, **attributes: object) -> dg.Definitions:
    """The same definitions, with attributes of one asset's spec replaced (a release that changed its code:
    `code_version`; another `automation_condition`)."""
    assets = []
    for asset in defs.assets or []:
        if isinstance(asset, dg.AssetsDefinition) and key in asset.keys:
            asset = asset.map_asset_specs(lambda spec: spec.replace_attributes(**attributes))
        assets.append(asset)
    return dg.Definitions(
        assets=assets,
        asset_checks=defs.asset_checks,
        resources=defs.resources,
        sensors=defs.sensors,
        jobs=defs.jobs,
    )


def test_every_asset_has_a_code_version_and_a_new_one_retrains(defs: dg.Definitions) -> None:
    graph = defs.resolve_asset_graph()
    missing = [k.to_user_string() for k in graph.get_all_asset_keys() if not graph.get(k).code_version]
    assert missing == []
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("scenarios", ["churn", "department_propensity"])
        _everything_materialized(instance, ["churn", "department_propensity"])
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        assert first.total_requested == 0

        released = _with_spec(defs, MODEL, code_version="next-release")
        tick = dg.evaluate_automation_conditions(defs=released, instance=instance, cursor=first.cursor)
        assert tick.get_requested_partitions(MODEL) == {"churn", "department_propensity"}
        assert tick.get_num_requested(dg.AssetKey("foundation_model")) == 0


def test_foundation_retrains_at_the_weekly_tick_only_after_its_inputs_changed(defs: dg.Definitions) -> None:
    import datetime as dt

    saturday = dt.datetime(2030, 1, 5, 12, tzinfo=dt.UTC)  # the default cron: Sunday 03:00 UTC
    monday = saturday + dt.timedelta(days=2)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("scenarios", ["churn"])
        _everything_materialized(instance, ["churn"])
        tick = dg.evaluate_automation_conditions(defs=defs, instance=instance, evaluation_time=saturday)
        tick = dg.evaluate_automation_conditions(
            defs=defs, instance=instance, cursor=tick.cursor, evaluation_time=monday
        )
        assert (
            tick.get_num_requested(dg.AssetKey("foundation_model")) == 0
        )  # the tick passed, nothing changed

        _materialized(instance, "event_cache")  # new content on Monday
        week = [monday + dt.timedelta(hours=h) for h in (6, 100, 136, 142)]  # ..., Sunday 04:00, 10:00
        requested = []
        for when in week:
            tick = dg.evaluate_automation_conditions(
                defs=defs, instance=instance, cursor=tick.cursor, evaluation_time=when
            )
            requested += [when] * tick.get_num_requested(dg.AssetKey("foundation_model"))
        assert len(requested) == 1 and requested[0].weekday() == 6  # once, at the Sunday tick


def test_a_cache_whose_blocking_check_failed_trains_no_foundation(defs: dg.Definitions) -> None:
    import datetime as dt

    saturday = dt.datetime(2030, 1, 5, 12, tzinfo=dt.UTC)  # the default cron: Sunday 03:00 UTC
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("scenarios", ["churn"])
        _everything_materialized(instance, ["churn"])
        tick = dg.evaluate_automation_conditions(defs=defs, instance=instance, evaluation_time=saturday)

        _materialized(instance, "event_cache", checks=False)  # manifest_sha256 failed
        requested = []
        for hours in (1, 16, 22):  # Saturday 13:00, Sunday 04:00, Sunday 10:00
            if hours == 22:  # the cache's check, run again after a repair, passes
                evaluation = dg.AssetCheckEvaluation(
                    asset_key=dg.AssetKey("event_cache"), check_name="manifest_sha256", passed=True
                )
                instance.report_runless_asset_event(evaluation)
            tick = dg.evaluate_automation_conditions(
                defs=defs,
                instance=instance,
                cursor=tick.cursor,
                evaluation_time=saturday + dt.timedelta(hours=hours),
            )
            requested.append(tick.get_num_requested(dg.AssetKey("foundation_model")))
        assert requested == [0, 0, 1]  # held at the weekly tick, trained once the check passed
