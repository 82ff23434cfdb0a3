"""Who scores when: one cache update gives exactly one `predictions` materialization per scenario, with the
model that is served after it, whatever the order in which the automation and the retrain sensor see the
update and however many ticks fall while the runs they requested are queued or running.

The real definitions and a real instance; the automation (`dg.evaluate_automation_conditions`) and
`scenario_retrain_sensor` tick as the daemon ticks them, and each run they request is created in the instance
as the daemon creates it: queued, with Dagster's planned materializations, deduplicated by run key. The runs
then execute one step at a time (one slot: a step waits while another run's step runs), each step recording
what the real step records (materialization metadata, the blocking checks' verdicts), with a tick of both
after every step.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import pytest
import yaml

# A queued run needs an origin, and a step records its materialization as StepMaterializationData: Dagster
# exports neither outside a workspace and a step: private imports, in the tests only.
from dagster._core.events import StepMaterializationData
from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin

from basemodel_pipeline.defs import build_definitions
from basemodel_pipeline.defs.shared.resources import BasemodelConfigResource
from basemodel_pipeline_tests.test_orchestration_automation import (
    BASELINES,
    CHECKS,
    DATA_VERSION_TAG,
    MODEL,
    PREDICTIONS,
    AssetCheckEvaluationTargetMaterializationData,
    _everything_materialized,
    _materialized,
    _with_spec,
)

CACHE = dg.AssetKey("event_cache")
POLICIES = {"churn": {"when": "every_cache"}, "department_propensity": {"when": "weekly", "min_days": 7}}


@dataclass
class Run:
    run: dg.DagsterRun
    steps: list[dg.AssetKey]  # still to execute, in the order of the run's plan
    fate: str = "succeeds"  # succeeds | rejected (its model fails its gates) | crashes (its model step dies)


@dataclass
class Nightly:
    """The instance, the two sensors' ticks and the runs they requested, executed a step at a time."""

    defs: dg.Definitions
    instance: dg.DagsterInstance
    config: Path
    served: dict[str, str]  # scenario -> the model version served (LATEST)
    sensor_first: bool = False  # the daemon evaluates them concurrently: either may see an update first
    fates: dict[str, str] = field(default_factory=dict)  # scenario -> fate of its next run that trains
    cursor: str | None = None
    runs: list[Run] = field(default_factory=list)
    versions: itertools.count = field(default_factory=lambda: itertools.count(2))

    def tick(self) -> list[dg.DagsterRun]:
        order = [self._sensor, self._automation] if self.sensor_first else [self._automation, self._sensor]
        return [run for evaluate in order for run in evaluate()]

    def _automation(self) -> list[dg.DagsterRun]:
        result = dg.evaluate_automation_conditions(defs=self.defs, instance=self.instance, cursor=self.cursor)
        self.cursor = result.cursor
        by_partition: dict[str | None, set[dg.AssetKey]] = {}
        for key in self.defs.resolve_asset_graph().toposorted_asset_keys:
            for partition in result.get_requested_partitions(key):
                by_partition.setdefault(partition, set()).add(key)
        return [self.launch(keys, partition, {}) for partition, keys in by_partition.items()]

    def _sensor(self) -> list[dg.DagsterRun]:
        context = dg.build_sensor_context(
            instance=self.instance,
            definitions=self.defs,
            resources={"basemodel_config": BasemodelConfigResource(config_path=str(self.config))},
        )
        with dg.partition_loading_context(dynamic_partitions_store=self.instance):
            result = self.defs.resolve_sensor_def("scenario_retrain_sensor").evaluate_tick(context)
        created = []
        for request in result.run_requests or []:  # the daemon never launches a run key twice
            if not self.instance.get_runs(dg.RunsFilter(tags={"dagster/run_key": request.run_key})):
                tags = {**request.tags, "dagster/run_key": str(request.run_key)}
                created.append(self.launch(set(request.asset_selection or []), request.partition_key, tags))
        return created

    def launch(self, keys: set[dg.AssetKey], partition: str | None, tags: dict[str, str]) -> dg.DagsterRun:
        """Create and queue a run as the daemon does (its materializations and checks planned)."""
        job = self.defs.resolve_implicit_job_def_def_for_assets(list(keys))
        assert job is not None
        origin = RemoteJobOrigin(
            RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("basemodel"), "__repository__"), job.name
        )
        with dg.partition_loading_context(dynamic_partitions_store=self.instance):
            run = self.instance.create_run_for_job(
                job,
                asset_selection=frozenset(keys),
                tags={**tags, **({"dagster/partition": partition} if partition else {})},
                remote_job_origin=origin,
            )
        self._event(run, dg.DagsterEventType.RUN_ENQUEUED)
        steps = [key for key in self.defs.resolve_asset_graph().toposorted_asset_keys if key in keys]
        fate = self.fates.pop(partition or "", "succeeds") if MODEL in keys else "succeeds"
        self.runs.append(Run(run, steps, fate))
        return run

    def _event(self, run: dg.DagsterRun, event: dg.DagsterEventType, data: object = None) -> None:
        self.instance.report_dagster_event(
            dg.DagsterEvent(event_type_value=event.value, job_name=run.job_name, event_specific_data=data),
            run_id=run.run_id,
        )

    def _record(
        self, run: dg.DagsterRun, key: dg.AssetKey, metadata: dict[str, object], passed: bool = True
    ) -> None:
        """The step's materialization, then its blocking checks' verdicts, in its run."""
        partition = run.tags.get("dagster/partition")
        version = str(metadata.get("version") or f"{key.to_user_string()}-{run.run_id[:8]}")
        materialization = dg.AssetMaterialization(
            asset_key=key, partition=partition, metadata=metadata, tags={DATA_VERSION_TAG: version}
        )
        self._event(run, dg.DagsterEventType.ASSET_MATERIALIZATION, StepMaterializationData(materialization))
        (record,) = self.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None), limit=1
        ).records
        target = AssetCheckEvaluationTargetMaterializationData(
            storage_id=record.storage_id, run_id=record.run_id, timestamp=record.timestamp
        )
        for name in CHECKS.get(key.to_user_string(), []):
            evaluation = dg.AssetCheckEvaluation(
                asset_key=key,
                check_name=name,
                passed=passed,
                partition=partition,
                target_materialization_data=target,
            )
            self._event(run, dg.DagsterEventType.ASSET_CHECK_EVALUATION, evaluation)

    def step(self) -> bool:
        """Execute the next step of the oldest unfinished run; False when every run has finished."""
        pending = [r for r in self.runs if r.steps]
        if not pending:
            return False
        current = pending[0]
        run, key = current.run, current.steps.pop(0)
        scenario = run.tags.get("dagster/partition", "")
        if self.instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.QUEUED:
            self._event(run, dg.DagsterEventType.RUN_START)
        cache = self.cache_version()
        if key == MODEL and current.fate == "crashes":
            current.steps = []  # the step's process died: nothing materialized, the run fails
        elif key == MODEL:
            version = f"m{next(self.versions)}-{scenario}"
            promoted = current.fate != "rejected"
            self.served[scenario] = version if promoted else self.served[scenario]
            trained = {"version": version, "cache_data_version": cache, "foundation_version": "f1"}
            trained |= {"promoted": promoted, "serving_version": self.served[scenario]}
            self._record(run, MODEL, trained, passed=promoted)
            if not promoted:
                current.steps = []  # the failed blocking check skips the scores and fails the run
        elif key == PREDICTIONS:
            self._record(run, key, {"model_version": self.served[scenario], "cache_data_version": cache})
        else:
            self._record(run, key, {})
        if not current.steps:
            failed = current.fate != "succeeds"
            self._event(run, dg.DagsterEventType.RUN_FAILURE if failed else dg.DagsterEventType.RUN_SUCCESS)
        return True

    def cache_version(self) -> str:
        (record,) = self.instance.fetch_materializations(CACHE, limit=1).records
        return str(record.asset_materialization.tags[DATA_VERSION_TAG])  # type: ignore[union-attr]

    def scores_after(self, storage_id: int) -> list[tuple[str, object, object]]:
        """(scenario, model version, cache version) of every predictions materialization since storage_id."""
        records = self.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=PREDICTIONS, after_storage_id=storage_id), limit=100
        ).records
        scores = []
        for record in records:
            mat = record.asset_materialization
            assert mat is not None
            meta = {k: v.value for k, v in mat.metadata.items()}
            scores.append((str(mat.partition), meta["model_version"], meta["cache_data_version"]))
        return sorted(scores, key=str)


@pytest.fixture
def nightly(tiny_config: Path, monkeypatch: pytest.MonkeyPatch):
    """churn retrains on every new cache, department_propensity weekly; both trained and scored on cache c1."""
    monkeypatch.delenv("BASEMODEL_UPLOAD_URL", raising=False)
    cfg = yaml.safe_load(tiny_config.read_text())
    for sc in cfg["scenarios"]:
        sc["retrain"] = POLICIES[sc["name"]]
    tiny_config.write_text(yaml.safe_dump(cfg))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("scenarios", list(POLICIES))
        _everything_materialized(instance, [])
        _materialized(instance, CACHE, version="c1")
        _materialized(instance, "foundation_model", version="f1")
        _materialized(instance, "entity_embeddings")
        served = {name: f"m1-{name}" for name in POLICIES}
        for name, version in served.items():
            _materialized(instance, BASELINES, name)
            trained = {"version": version, "serving_version": version, "promoted": True}
            trained |= {"cache_data_version": "c1", "foundation_version": "f1"}
            _materialized(instance, MODEL, name, version=version, metadata=trained)
            scored = {"model_version": version, "cache_data_version": "c1"}
            _materialized(instance, PREDICTIONS, name, metadata=scored)
        state = Nightly(build_definitions(str(tiny_config), env="ci"), instance, tiny_config, served)
        assert state.tick() == []  # everything is up to date (the automation's first tick records the state)
        yield state


def _new_cache(nightly: Nightly) -> int:
    """The nightly refresh published cache c2 (its check passed); returns the storage id of that update."""
    _materialized(nightly.instance, CACHE, version="c2")
    return nightly.instance.fetch_materializations(CACHE, limit=1).records[0].storage_id


def _scenario_runs(runs: list[dg.DagsterRun]) -> list[tuple[str, list[str], str | None]]:
    """(scenario, assets, run key) of the runs that touch a scenario (not entity_embeddings', the summary's)."""
    return sorted(
        (
            r.tags["dagster/partition"],
            sorted(k.to_user_string() for k in r.asset_selection or []),
            r.tags.get("dagster/run_key"),
        )
        for r in runs
        if "dagster/partition" in r.tags
    )


def _run_everything(nightly: Nightly) -> list[dg.DagsterRun]:
    """Execute a step, then tick, until every run finished; the runs the ticks requested meanwhile."""
    created = []
    while nightly.step():
        created += nightly.tick()
    return created + nightly.tick()


@pytest.mark.parametrize("sensor_first", [False, True], ids=["automation_first", "sensor_first"])
def test_one_cache_update_scores_each_scenario_exactly_once(nightly: Nightly, sensor_first: bool) -> None:
    nightly.sensor_first = sensor_first
    update = _new_cache(nightly)
    # one run per scenario: churn's retrain (baselines, model, scores), department_propensity's scores alone
    assert _scenario_runs(nightly.tick()) == [
        ("churn", ["predictions", "scenario_baselines", "scenario_model"], "retrain:churn:c1->c2"),
        ("department_propensity", ["predictions"], "score:department_propensity:m1-department_propensity@c2"),
    ]
    for _ in range(3):  # queued: repeated ticks request nothing more
        assert _scenario_runs(nightly.tick()) == []
    # nor while a step runs or waits for the slot (churn's scores wait while its model trains)
    assert _scenario_runs(_run_everything(nightly)) == []

    # one materialization each: churn scored by its new model only, department_propensity by its served one
    assert nightly.served["churn"] != "m1-churn"
    assert nightly.scores_after(update) == [
        ("churn", nightly.served["churn"], "c2"),
        ("department_propensity", "m1-department_propensity", "c2"),
    ]


@pytest.mark.parametrize("fate", ["rejected", "crashes"])
def test_a_retrain_that_is_not_served_leaves_the_served_model_scored_once(
    nightly: Nightly, fate: str
) -> None:
    """A retrain its gates reject is never scored (its run skips the scores); a retrain whose step died
    trained nothing. Either way the model still served is scored on the new cache, once."""
    nightly.fates["churn"] = fate
    update = _new_cache(nightly)
    assert len(_scenario_runs(nightly.tick())) == 2
    assert _scenario_runs(_run_everything(nightly)) == [("churn", ["predictions"], "score:churn:m1-churn@c2")]
    assert nightly.served["churn"] == "m1-churn"
    assert nightly.scores_after(update) == [
        ("churn", "m1-churn", "c2"),
        ("department_propensity", "m1-department_propensity", "c2"),
    ]


def test_a_new_model_outside_the_retrain_sensor_is_scored_by_the_automation(nightly: Nightly) -> None:
    """A model trained by a run without its scores (launched from the UI) is scored once, by the automation;
    the retrain sensor leaves a new model alone."""
    before = nightly.instance.fetch_materializations(PREDICTIONS, limit=1).records[0].storage_id
    nightly.launch({MODEL}, "department_propensity", {})
    assert _scenario_runs(_run_everything(nightly)) == [("department_propensity", ["predictions"], None)]
    assert nightly.served["department_propensity"] != "m1-department_propensity"
    assert nightly.scores_after(before) == [
        ("department_propensity", nightly.served["department_propensity"], "c1")
    ]


def test_dagster_in_progress_covers_queued_runs_until_another_run_scores_the_partition(
    nightly: Nightly,
) -> None:
    """What AutomationCondition.in_progress() sees (Dagster 1.13): a partition planned by a queued run, or by a
    started run whose step has not run yet (waiting for its pool), is in progress; once another run
    materialized that partition after the plan, it no longer is, although the first run will still score it.
    So two runs that score the same scenario must never overlap: the retrain sensor asks nothing for a
    scenario with a queued or running run, and the automation scores a new model only."""
    probe = _with_spec(nightly.defs, PREDICTIONS, automation_condition=dg.AutomationCondition.in_progress())

    def in_progress() -> set[str | None]:
        return dg.evaluate_automation_conditions(
            defs=probe, instance=nightly.instance
        ).get_requested_partitions(PREDICTIONS)

    _new_cache(nightly)
    nightly.tick()
    assert in_progress() == {"churn", "department_propensity"}  # both queued
    (retrain,) = [r for r in nightly.runs if MODEL in r.steps]
    while retrain.steps != [PREDICTIONS]:  # churn's run started; its scores wait for the slot
        nightly.step()
    assert in_progress() == {"churn", "department_propensity"}
    _materialized(nightly.instance, PREDICTIONS, "churn", checks=None)  # another run scored churn meanwhile
    assert in_progress() == {"department_propensity"}
