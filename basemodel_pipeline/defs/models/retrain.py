"""Retraining on new data: which scenarios a new foundation or a new cache retrains.

Every tick compares, per scenario, the versions its latest model was trained on (recorded in the
scenario_model materialization as `foundation_version` and `cache_data_version`) with the current ones:

    a new foundation   always retrain (a promoted one: a version its gates rejected is never served)
    a new cache        as the scenario's `retrain` policy says:
        every_cache    retrain now
        weekly         retrain once the latest model is `min_days` old
        drift          retrain once the predictions scored on the new cache report `drift_psi` >=
                       drift_threshold (the mean PSI of the input features against the population the
                       model was first scored on)

Because the comparison is between versions, not events: an unchanged cache retrains nothing; a run that read
inputs which changed under it records the old versions, so it is retrained once more; the run key
`retrain:<scenario>:<trained on>-><current>` never asks twice for the same pair. Nothing is requested while the
cache or the foundation is being rebuilt, nor for a scenario whose own run is queued or running (its result is
compared on the next tick).
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
DATA_VERSION_TAG = "dagster/data_version"
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
    if latest.drift is None or latest.scored_at < latest.cache_at:
        return None  # waiting for the predictions on the new cache to measure the drift
    if latest.drift >= policy.drift_threshold:
        return f"{changed}; drift_psi {latest.drift:.3f} >= {policy.drift_threshold}"
    return None


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
    )


def busy(instance: dg.DagsterInstance) -> tuple[set[str], set[str]]:
    """(upstream assets being rebuilt: event_cache / foundation_model, scenarios with a queued or running run)."""
    upstream, scenarios = set(), set()
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=ACTIVE)):
        keys = set(run.asset_selection or [])
        upstream |= {k.to_user_string() for k in keys & {CACHE, FOUNDATION}}
        if keys & {BASELINES, MODEL} and run.tags.get("dagster/partition"):
            scenarios.add(run.tags["dagster/partition"])
    return upstream, scenarios


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
        says."""
        if not Path(basemodel_config.config_path).is_file():
            return dg.SkipReason(f"config {basemodel_config.config_path} does not exist yet")
        upstream, running = busy(context.instance)
        if upstream:
            return dg.SkipReason(f"waiting for {', '.join(sorted(upstream))} to finish")
        existing = set(context.instance.get_dynamic_partitions(scenarios_partitions.name))
        requests, waiting = [], []
        for sc in load_config(basemodel_config.config_path).scenarios:
            if sc.name not in existing or sc.name in running:
                continue
            latest = latest_state(context.instance, sc.name)
            reason = retrain_reason(sc.retrain, latest, time.time())
            if reason is None:
                if latest.trained_on and latest.cache_now and latest.trained_on != latest.cache_now:
                    waiting.append(f"{sc.name} ({sc.retrain.when})")
                continue
            context.log.info(f"retraining {sc.name}: {reason}")
            if reason.startswith("foundation"):
                pair, trigger = f"{latest.foundation_used}->{latest.foundation_now}", "retrain_foundation"
            else:
                pair, trigger = f"{latest.trained_on}->{latest.cache_now}", f"retrain_{sc.retrain.when}"
            requests.append(
                dg.RunRequest(
                    run_key=f"retrain:{sc.name}:{pair}",
                    asset_selection=RETRAIN_ASSETS,
                    partition_key=sc.name,
                    tags={"basemodel/trigger": trigger},
                )
            )
        if not requests:
            detail = f"; older than the cache, held by their policy: {', '.join(waiting)}" if waiting else ""
            return dg.SkipReason(f"no scenario to retrain{detail}")
        return dg.SensorResult(run_requests=requests)

    return scenario_retrain_sensor
