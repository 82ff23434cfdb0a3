"""Retrain policy per scenario (defs/models/retrain.py): a new cache retrains every_cache scenarios, weekly ones
once their model is old enough, drift ones when the population scored on the new cache drifted."""

from pathlib import Path

import dagster as dg
import pytest
import yaml

from basemodel_pipeline.config.scenarios import RetrainPolicy
from basemodel_pipeline.dates import DAY
from basemodel_pipeline.defs import build_definitions
from basemodel_pipeline.defs.models.retrain import Latest, retrain_reason
from basemodel_pipeline.defs.shared.resources import BasemodelConfigResource
from basemodel_pipeline_tests.test_orchestration_automation import _materialized

NOW = 1_800_000_000.0


def _latest(**kw: object) -> Latest:
    base = {"trained_on": "c1", "trained_at": NOW - 2 * DAY, "cache_now": "c2", "cache_at": NOW - 60}
    return Latest(**{**base, **kw})  # type: ignore[arg-type]


def test_retrain_reasons_follow_the_policy() -> None:
    every, weekly = RetrainPolicy(), RetrainPolicy(when="weekly", min_days=7)
    drift = RetrainPolicy(when="drift", drift_threshold=0.2)
    assert retrain_reason(every, _latest(), NOW) == "cache c1 -> c2"
    assert retrain_reason(every, _latest(cache_now="c1"), NOW) is None  # up to date
    assert retrain_reason(every, _latest(trained_on=None), NOW) is None  # never trained: the automation's
    assert retrain_reason(weekly, _latest(), NOW) is None  # 2 days old
    assert "8.0 days old" in (retrain_reason(weekly, _latest(trained_at=NOW - 8 * DAY), NOW) or "")
    assert retrain_reason(drift, _latest(), NOW) is None  # not scored on the new cache yet
    stale = _latest(drift=0.5, scored_at=NOW - 3600)  # scored before the new cache
    assert retrain_reason(drift, stale, NOW) is None
    assert retrain_reason(drift, _latest(drift=0.05, scored_at=NOW), NOW) is None
    assert "drift_psi 0.300 >= 0.2" in (retrain_reason(drift, _latest(drift=0.3, scored_at=NOW), NOW) or "")
    # a new foundation retrains whatever the policy, also when the cache is unchanged
    moved = _latest(cache_now="c1", foundation_used="f1", foundation_now="f2")
    assert retrain_reason(weekly, moved, NOW) == "foundation f1 -> f2"


def _materialize(
    instance: dg.DagsterInstance, key: str, partition: str | None = None, **meta: object
) -> None:
    tags = {"dagster/data_version": str(meta.pop("version"))} if "version" in meta else None
    instance.report_runless_asset_event(
        dg.AssetMaterialization(asset_key=key, partition=partition, metadata=meta, tags=tags)
    )


def _tick(defs: dg.Definitions, instance: dg.DagsterInstance, config: Path):
    sensor = defs.resolve_sensor_def("scenario_retrain_sensor")
    context = dg.build_sensor_context(
        instance=instance,
        definitions=defs,
        resources={"basemodel_config": BasemodelConfigResource(config_path=str(config))},
    )
    with dg.partition_loading_context(dynamic_partitions_store=instance):
        return sensor.evaluate_tick(context)


def test_the_sensor_retrains_what_the_policy_says(tiny_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BASEMODEL_UPLOAD_URL", raising=False)
    cfg = yaml.safe_load(tiny_config.read_text())
    for sc in cfg["scenarios"]:
        if sc["name"] == "department_propensity":
            sc["retrain"] = {"when": "drift", "drift_threshold": 0.2}
    tiny_config.write_text(yaml.safe_dump(cfg))
    defs = build_definitions(str(tiny_config), env="ci")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("scenarios", ["churn", "department_propensity"])
        _materialize(instance, "event_cache", version="c1")
        for name in ("churn", "department_propensity"):
            _materialize(instance, "scenario_model", name, cache_data_version="c1", version=f"m1-{name}")
            _materialize(instance, "predictions", name, model_version=f"m1-{name}", cache_data_version="c1")
        assert not _tick(defs, instance, tiny_config).run_requests  # trained on the current cache

        _materialize(instance, "event_cache", version="c2")  # new data
        retrain, score = sorted(_tick(defs, instance, tiny_config).run_requests, key=lambda r: str(r.run_key))
        assert retrain.partition_key == "churn" and retrain.run_key == "retrain:churn:c1->c2"
        assert retrain.tags["basemodel/trigger"] == "retrain_every_cache"
        assert set(retrain.asset_selection or []) == {
            dg.AssetKey(k) for k in ("scenario_baselines", "scenario_model", "predictions")
        }
        # the drift scenario is not retrained yet: its served model scores the new cache, which measures the drift
        assert score.run_key == "score:department_propensity:m1-department_propensity@c2"
        assert score.partition_key == "department_propensity"
        assert set(score.asset_selection or []) == {dg.AssetKey("predictions")}
        assert score.tags["basemodel/trigger"] == "score_new_cache"

        scored = {"model_version": "m1-department_propensity", "cache_data_version": "c2"}
        _materialize(instance, "predictions", "department_propensity", drift_psi=0.05, **scored)  # stable
        assert [r.run_key for r in _tick(defs, instance, tiny_config).run_requests] == [
            "retrain:churn:c1->c2"
        ]
        _materialize(instance, "predictions", "department_propensity", drift_psi=0.31, **scored)  # drifted
        keys = {r.partition_key for r in _tick(defs, instance, tiny_config).run_requests}
        assert keys == {"churn", "department_propensity"}

        _materialize(instance, "scenario_model", "churn", cache_data_version="c2")  # the retrain ran
        keys = {r.partition_key for r in _tick(defs, instance, tiny_config).run_requests}
        assert keys == {"department_propensity"}


@pytest.mark.parametrize(
    ("policy", "held", "request_key"),
    [
        ({"when": "weekly", "min_days": 7}, "scores wait", "score:churn:m1@c2"),  # its served model scores
        ({"when": "every_cache"}, "retrains and scores wait", "retrain:churn:c1->c2"),
    ],
    ids=["score", "retrain"],
)
def test_runs_on_a_new_cache_wait_for_its_blocking_check(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch, policy: dict, held: str, request_key: str
) -> None:
    """A new cache is scored by the served model (weekly policy) or retrained on (every_cache) only once the
    cache's blocking check passed on it: a cache that failed manifest_sha256 trains and scores nothing."""
    monkeypatch.delenv("BASEMODEL_UPLOAD_URL", raising=False)
    cfg = yaml.safe_load(tiny_config.read_text())
    cfg["scenarios"] = [{**sc, "retrain": policy} for sc in cfg["scenarios"]]
    tiny_config.write_text(yaml.safe_dump(cfg))
    defs = build_definitions(str(tiny_config), env="ci")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("scenarios", ["churn"])
        _materialized(instance, "event_cache", version="c1")
        _materialize(instance, "scenario_model", "churn", cache_data_version="c1", version="m1")
        _materialize(instance, "predictions", "churn", model_version="m1", cache_data_version="c1")

        _materialized(instance, "event_cache", version="c2", checks=False)  # manifest_sha256 failed
        tick = _tick(defs, instance, tiny_config)
        assert not tick.run_requests
        assert f"{held} for the cache's blocking check to pass: churn" in (tick.skip_message or "")
        evaluation = dg.AssetCheckEvaluation(
            asset_key=dg.AssetKey("event_cache"), check_name="manifest_sha256", passed=True
        )
        instance.report_runless_asset_event(evaluation)  # run again after a repair: it passes
        (request,) = _tick(defs, instance, tiny_config).run_requests
        assert request.run_key == request_key


def test_a_model_trained_while_the_foundation_changed_is_retrained_once_more(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """churn's run read foundation f1 while f2 was being published: its materialization records f1, so the
    sensor retrains it once on f2; nothing is asked while a rebuild or churn's own run is in progress."""
    monkeypatch.delenv("BASEMODEL_UPLOAD_URL", raising=False)
    defs = build_definitions(str(tiny_config), env="ci")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("scenarios", ["churn", "department_propensity"])
        _materialize(instance, "event_cache", version="c1")
        _materialize(instance, "foundation_model", version="f2")
        _materialize(instance, "scenario_model", "churn", cache_data_version="c1", foundation_version="f1")
        _materialize(
            instance,
            "scenario_model",
            "department_propensity",
            cache_data_version="c1",
            foundation_version="f2",
        )
        (request,) = _tick(defs, instance, tiny_config).run_requests
        assert (request.partition_key, request.run_key) == ("churn", "retrain:churn:f1->f2")
        assert request.tags["basemodel/trigger"] == "retrain_foundation"

        instance.add_run(  # churn's run is in progress
            dg.DagsterRun(
                job_name="__ASSET_JOB",
                status=dg.DagsterRunStatus.STARTED,
                asset_selection=frozenset({dg.AssetKey("scenario_model")}),
                tags={"dagster/partition": "churn"},
            )
        )
        assert not _tick(defs, instance, tiny_config).run_requests  # compared again after that run
        instance.add_run(
            dg.DagsterRun(
                job_name="__ASSET_JOB",
                status=dg.DagsterRunStatus.STARTED,
                asset_selection=frozenset({dg.AssetKey("event_cache")}),
            )
        )
        assert "waiting for event_cache" in (_tick(defs, instance, tiny_config).skip_message or "")
