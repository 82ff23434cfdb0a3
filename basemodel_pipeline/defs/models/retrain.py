"""Retraining and scoring on new data: which scenarios a new foundation or a new cache retrains, and which
it only rescores.

Every tick compares, per scenario, the versions its latest model was trained on (recorded in the
scenario_model materialization as `foundation_version` and `cache_data_version`) with the current ones:

    a new foundation   always retrain (a promoted one: a version its gates rejected is never served)
    a new cache        as the scenario's `retrain` policy says:
        every_cache    retrain now
        weekly         retrain once the latest model is `min_days` old
        drift          retrain once the predictions scored on the new cache report `drift_psi` >=
                       drift_threshold (the mean PSI of the input features against the population the
                       model was first scored on)

A retrain is one run: baselines, model, scores. This sensor also owns scoring a new cache: a scenario that is
not retrained for it (its policy holds it, or its retrain for this cache ended without a model) gets a run of
its scores alone, with the model it serves, once its latest scores (metadata `model_version`,
`cache_data_version`) are of that model on an older cache and the cache's blocking check passed. A new model
is scored by the automation instead (defs/shared/conditions.py: SCORES), so each (scenario, served model,
cache) is scored once.

Because the comparison is between versions, not events: an unchanged cache retrains nothing; a run that read
inputs which changed under it records the old versions, so it is retrained once more; the run keys
`retrain:<scenario>:<trained on>-><current>` and `score:<scenario>:<served model>@<cache>` never ask twice for
the same versions. Nothing is requested while the cache or the foundation is being rebuilt, nor for a scenario
whose own run (one that trains or scores it) is queued or running: its result is compared on the next tick.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from basemodel_pipeline.config import load_config
from basemodel_pipeline.config.scenarios import RetrainPolicy
from basemodel_pipeline.dates import DAY
from basemodel_pipeline.defs.shared.partitions import scenarios_partitions
from basemodel_pipeline.defs.shared.resources import BasemodelConfigResource

CACHE, FOUNDATION = dg.AssetKey("event_cache"), dg.AssetKey("foundation_model")
BASELINES, MODEL = dg.AssetKey("scenario_baselines"), dg.AssetKey("scenario_model")
PREDICTIONS = dg.AssetKey("predictions")
RETRAIN_ASSETS = [BASELINES, MODEL, PREDICTIONS]  # one run: the CPU step, the GPU step, the scores
CACHE_CHECK = dg.AssetCheckKey(CACHE, "manifest_sha256")  # the cache's blocking check
DATA_VERSION_TAG = "dagster/data_version"
RUN_KEY_TAG = "dagster/run_key"
ACTIVE = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


@dataclass(frozen=True)
class Latest:
    """What the instance knows of one scenario, the cache and the foundation."""

    trained_on: str | None  # cache data version of the latest model (None: never trained, or before versions)
    trained_at: float  # its materialization time (epoch seconds)
    cache_now: str | None  # the cache's current data version
    cache_at: float  # when the cache was materialized
    drift: float | None = None  # drift_psi of the latest predictions
    scored_at: float = 0.0  # when those predictions were materialized
    foundation_used: str | None = None  # foundation version of the latest model
    foundation_now: str | None = None  # the foundation's current version
    served: str | None = None  # the model version served (LATEST) after the latest model's gates
    scored_model: str | None = None  # model version of the latest predictions
    scored_cache: str | None = None  # cache data version they were scored on

    def trained_before_cache(self) -> bool:
        return bool(self.trained_on and self.cache_now and self.trained_on != self.cache_now)

    def scored_on_current_cache(self) -> bool:
        if self.scored_cache is not None:
            return self.scored_cache == self.cache_now
        return self.scored_at >= self.cache_at  # scores that do not record their cache version

    def scored_served_model(self) -> bool:
        if self.scored_model is not None and self.served is not None:
            return self.scored_model == self.served
        return self.scored_at >= self.trained_at  # scores that do not record their model version


def retrain_reason(policy: RetrainPolicy, latest: Latest, now: float) -> str | None:
    """Why the scenario should be retrained now, or None."""
    if latest.foundation_used and latest.foundation_now and latest.foundation_used != latest.foundation_now:
        return f"foundation {latest.foundation_used} -> {latest.foundation_now}"
    if latest.cache_now is None or latest.trained_on is None or latest.trained_on == latest.cache_now:
        return None  # nothing trained yet (the automation trains new scenarios), or up to date
    changed = f"cache {latest.trained_on} -> {latest.cache_now}"
    if policy.when == "every_cache":
        return changed
    if policy.when == "weekly":
        age = (now - latest.trained_at) / DAY
        return f"{changed}; model {age:.1f} days old" if age >= policy.min_days else None
    if latest.drift is None or not latest.scored_on_current_cache():
        return None  # waiting for the predictions on the new cache to measure the drift
    if latest.drift >= policy.drift_threshold:
        return f"{changed}; drift_psi {latest.drift:.3f} >= {policy.drift_threshold}"
    return None


def score_reason(latest: Latest) -> str | None:
    """Why the served model should score the new cache in a run of its own, or None: its latest scores are of
    that model on an older cache. A scenario never trained, or whose model changed since its latest scores, is
    the automation's (a new model is scored once its checks passed; a rejected one never)."""
    if latest.trained_on is None or latest.cache_now is None or latest.served is None:
        return None
    if not latest.scored_served_model() or latest.scored_on_current_cache():
        return None
    return f"model {latest.served} scored on cache {latest.scored_cache or 'before'} -> {latest.cache_now}"


def _record(
    instance: dg.DagsterInstance, key: dg.AssetKey, partition: str | None
) -> dg.EventLogRecord | None:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None), limit=1
    ).records
    return records[0] if records else None


def _promoted(instance: dg.DagsterInstance, key: dg.AssetKey) -> dg.EventLogRecord | None:
    """The newest materialization whose version its quality gates promoted (metadata `promoted` not false):
    a rejected foundation is never what scenarios are compared with."""
    for record in instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key), limit=20).records:
        if _value(record, "promoted") is not False:
            return record
    return None


def _value(record: dg.EventLogRecord | None, name: str) -> object:
    mat = record.asset_materialization if record else None
    entry = mat.metadata.get(name) if mat else None
    return entry.value if entry is not None else None


def _version(record: dg.EventLogRecord | None) -> str | None:
    mat = record.asset_materialization if record else None
    return mat.tags.get(DATA_VERSION_TAG) if mat and mat.tags else None


def _served(model: dg.EventLogRecord | None) -> str | None:
    """The version served after this model's gates: itself when promoted, else the one before it."""
    served = _value(model, "serving_version")
    if served is None and _value(model, "promoted") is not False:
        served = _value(model, "version") or _version(model)
    return str(served) if served else None


def _text(value: object) -> str | None:
    return str(value) if value else None


def latest_state(instance: dg.DagsterInstance, scenario: str) -> Latest:
    cache, model = _record(instance, CACHE, None), _record(instance, MODEL, scenario)
    scored = _record(instance, PREDICTIONS, scenario)
    drift, trained_on = _value(scored, "drift_psi"), _value(model, "cache_data_version")
    used = _value(model, "foundation_version")
    return Latest(
        trained_on=str(trained_on) if trained_on else None,
        trained_at=model.timestamp if model else 0.0,
        cache_now=_version(cache),
        cache_at=cache.timestamp if cache else 0.0,
        drift=float(drift) if isinstance(drift, int | float) else None,
        scored_at=scored.timestamp if scored else 0.0,
        foundation_used=str(used) if used else None,
        foundation_now=_version(_promoted(instance, FOUNDATION)),
        served=_served(model),
        scored_model=_text(_value(scored, "model_version")),
        scored_cache=_text(_value(scored, "cache_data_version")),
    )


def cache_verified(instance: dg.DagsterInstance) -> bool:
    """The cache's blocking check passed on its latest materialization (or has never run: a cache from before
    the check existed). One not run on that update yet, running or failed holds the scores back, as the
    automation's gate does."""
    execution = instance.event_log_storage.get_latest_asset_check_execution_by_key([CACHE_CHECK]).get(
        CACHE_CHECK
    )
    cache = _record(instance, CACHE, None)
    if execution is None or cache is None:
        return True
    evaluation = execution.evaluation
    if evaluation is None or not evaluation.passed:
        return False
    target = evaluation.target_materialization_data
    if target is not None:
        return target.storage_id == cache.storage_id
    evaluated_at = execution.event.timestamp if execution.event else execution.create_timestamp
    return evaluated_at >= cache.timestamp  # executed by hand (from the UI) after that materialization


def busy(instance: dg.DagsterInstance) -> tuple[set[str], set[str]]:
    """(upstream assets being rebuilt: event_cache / foundation_model, scenarios with a queued or running run
    that trains or scores them)."""
    upstream, scenarios = set(), set()
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=ACTIVE)):
        keys = set(run.asset_selection or [])
        upstream |= {k.to_user_string() for k in keys & {CACHE, FOUNDATION}}
        if keys & {BASELINES, MODEL, PREDICTIONS} and run.tags.get("dagster/partition"):
            scenarios.add(run.tags["dagster/partition"])
    return upstream, scenarios


def _launched(instance: dg.DagsterInstance, run_key: str) -> bool:
    """A run with this run key exists (the daemon launches a sensor's run key once)."""
    return bool(instance.get_runs(filters=dg.RunsFilter(tags={RUN_KEY_TAG: run_key}), limit=1))


def _retrain_request(scenario: str, policy: str, latest: Latest, reason: str) -> dg.RunRequest:
    if reason.startswith("foundation"):
        pair, trigger = f"{latest.foundation_used}->{latest.foundation_now}", "retrain_foundation"
    else:
        pair, trigger = f"{latest.trained_on}->{latest.cache_now}", f"retrain_{policy}"
    return dg.RunRequest(
        run_key=f"retrain:{scenario}:{pair}",
        asset_selection=RETRAIN_ASSETS,
        partition_key=scenario,
        tags={"basemodel/trigger": trigger},
    )


def build_retrain_sensor(default_status: dg.DefaultSensorStatus) -> dg.SensorDefinition:
    @dg.sensor(
        name="scenario_retrain_sensor",
        minimum_interval_seconds=60,
        default_status=default_status,
        asset_selection=RETRAIN_ASSETS,
    )
    def scenario_retrain_sensor(
        context: dg.SensorEvaluationContext, basemodel_config: BasemodelConfigResource
    ) -> dg.SensorResult | dg.SkipReason:
        """Retrain the scenarios whose model predates the foundation, or the cache as their `retrain` policy
        says; score the new cache with the served model of the others. Both wait for the cache's blocking
        check to pass on its latest materialization, as the automation's gate does."""
        if not Path(basemodel_config.config_path).is_file():
            return dg.SkipReason(f"config {basemodel_config.config_path} does not exist yet")
        upstream, running = busy(context.instance)
        if upstream:
            return dg.SkipReason(f"waiting for {', '.join(sorted(upstream))} to finish")
        existing = set(context.instance.get_dynamic_partitions(scenarios_partitions.name))
        verified = cache_verified(context.instance)
        requests, held, unverified = [], [], []
        for sc in load_config(basemodel_config.config_path).scenarios:
            if sc.name not in existing or sc.name in running:
                continue
            latest = latest_state(context.instance, sc.name)
            reason = retrain_reason(sc.retrain, latest, time.time())
            retrain = _retrain_request(sc.name, sc.retrain.when, latest, reason) if reason else None
            if retrain is not None and not verified:  # trains on the cache: wait for its blocking check
                unverified.append(sc.name)
                continue
            if retrain is not None and not _launched(context.instance, str(retrain.run_key)):
                context.log.info(f"retraining {sc.name}: {reason}")
                requests.append(retrain)
                continue
            # not retrained for these versions (its policy holds it, or its retrain ran and trained no model
            # on them): the model it serves scores the new cache
            if reason is None and latest.trained_before_cache():
                held.append(f"{sc.name} ({sc.retrain.when})")
            scoring = score_reason(latest)
            if scoring is not None and not verified:
                unverified.append(sc.name)
            elif scoring is not None:
                context.log.info(f"scoring {sc.name}: {scoring}")
                requests.append(
                    dg.RunRequest(
                        run_key=f"score:{sc.name}:{latest.served}@{latest.cache_now}",
                        asset_selection=[PREDICTIONS],
                        partition_key=sc.name,
                        tags={"basemodel/trigger": "score_new_cache"},
                    )
                )
        if not requests:
            detail = f"; older than the cache, held by their policy: {', '.join(held)}" if held else ""
            if unverified:
                detail += f"; retrains and scores wait for the cache's blocking check to pass: {', '.join(unverified)}"
            return dg.SkipReason(f"no scenario to retrain or score{detail}")
        return dg.SensorResult(run_requests=requests)

    return scenario_retrain_sensor
