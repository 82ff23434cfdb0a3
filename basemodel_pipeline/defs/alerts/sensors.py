"""Alert sensors: a failing run, and a failing check that blocks or has ERROR severity, alert once per incident.

    alert_on_run_failure    failed runs: job, run id, assets, partition, the first failed step's error (one
                            line, redacted); incident = the job and its asset (and check) selection
    alert_on_check_failure  failed asset check evaluations that are blocking or have severity ERROR (WARN-only
                            failures, e.g. volume_within_guidelines, do not alert); incident = the asset and
                            the check

Both read the runs that finished since their cursor (the last run update time; on the first tick they
start from now, no backlog) with their step-failure and check-evaluation events. An incident is one failing
thing; its key leaves out a day partition or a partition range, which changes between retries, and keeps a
partition that names a thing (a scenario). The first failure alerts. Further failures of the open incident
are counted, and alert again only as a reminder ("still failing: N failures since ...") once
BASEMODEL_ALERT_REMINDER_S (default 4 h; 0: no reminders) has passed since its last alert. The next success
(a successful run of that job and selection; a passed evaluation of that check) closes it with one
"recovered" alert. The open incidents live in the sensor's cursor, so they last across ticks and restarts.

A failed blocking check therefore opens two incidents: the check, and the runs it stops.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import dagster as dg

from basemodel_pipeline.defs.alerts.resources import AlertSinks
from basemodel_pipeline.ops.alerts import Alert, Incidents, deliver, failures_since, short_reason, utc_minute
from basemodel_pipeline.settings import seconds_setting

EXCEPTION_PREFIX = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Failure)?: ")
TIME_PARTITION = re.compile(r"^\d{4}-\d{2}(?:-\d{2})?(?:[ T-]\d{2}(?::\d{2})?)?$")  # a day, an hour, a month
RANGE_START = "dagster/asset_partition_range_start"
BATCH = 100
SEEN = 500  # run ids remembered in the cursor (a run updated again is not counted twice)
FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
REMINDER_ENV_VAR = "BASEMODEL_ALERT_REMINDER_S"
DEFAULT_REMINDER_S = 4 * 3600.0


@dataclass(frozen=True)
class Outcome:
    """How one watched thing fared in a finished run: its incident key, and the alert of its failure (None
    when it succeeded) or what a "recovered" alert says."""

    key: str
    at: float  # when the run ended (Unix time)
    failure: Alert | None  # the first alert of its failure; None: it succeeded
    what: str  # "job refresh (extracts/transactions)", "check extracts/transactions:schema_unchanged"
    how: str  # "run 1a2b3c4d succeeded", "passed in run 1a2b3c4d"
    fields: dict[str, str]  # the fields of a "recovered" alert


def _logger(context: dg.SensorEvaluationContext) -> logging.Logger:
    return (
        context.log
        if isinstance(context.log, logging.Logger)
        else logging.getLogger("basemodel_pipeline.alerts")
    )


def named_partition(partition: str | None) -> str | None:
    """`partition` when it names a thing (a scenario), None for a time partition (a day), which changes
    between the retries of one failing thing."""
    return partition if partition and not TIME_PARTITION.match(partition) else None


def ended_at(record: dg.RunRecord) -> float:
    return record.end_time or record.update_timestamp.timestamp()


def first_event(instance: dg.DagsterInstance, run_id: str, of_type: dg.DagsterEventType) -> Any:
    records = instance.get_records_for_run(run_id, of_type=of_type, limit=1).records
    return records[0].event_log_entry.dagster_event if records else None


def run_failure_reason(instance: dg.DagsterInstance, run_id: str) -> str:
    """The first failed step's error (`step: message`, without the exception's class), else the run's
    failure message."""
    step = first_event(instance, run_id, dg.DagsterEventType.STEP_FAILURE)
    if step is not None and step.step_failure_data.error is not None:
        message = EXCEPTION_PREFIX.sub("", step.step_failure_data.error.message.strip())
        return f"{step.step_key or 'a step'}: {message}"
    failure = first_event(instance, run_id, dg.DagsterEventType.RUN_FAILURE)
    return (failure.message if failure is not None else None) or "the run failed"


def selection_words(assets: list[str], partition: str | None) -> str:
    """` (a, b[partition])` after a job's name, empty without assets."""
    return f" ({', '.join(assets)}{f'[{partition}]' if partition else ''})" if assets else ""


def run_failure_alert(run: dg.DagsterRun, reason: str) -> Alert:
    """The alert of a failed run: what ran, and why (a step's error or the run's failure)."""
    assets = sorted(k.to_user_string() for k in run.asset_selection or ())
    fields = {"run_id": run.run_id, "job": run.job_name}
    if assets:
        fields["assets"] = ", ".join(assets)
    if run.tags.get("dagster/partition"):
        fields["partition"] = run.tags["dagster/partition"]
    what = selection_words(assets, fields.get("partition"))
    return Alert(
        "run_failure",
        f"run {run.run_id[:8]} of job {run.job_name}{what} failed",
        short_reason(reason),
        fields,
    )


def selected_assets(instance: dg.DagsterInstance, run: dg.DagsterRun) -> list[str]:
    """The assets a run selected; for a run without a selection (a whole job, an in-process materialize),
    those it planned to materialize."""
    keys = set(run.asset_selection or ())
    if not keys:
        planned = dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED
        for event in instance.get_records_for_run(run.run_id, of_type=planned).records:
            if event.event_log_entry.dagster_event is not None:
                keys.add(event.event_log_entry.dagster_event.asset_key)
    return sorted(k.to_user_string() for k in keys if k is not None)


def run_outcome(instance: dg.DagsterInstance, record: dg.RunRecord) -> list[Outcome]:
    """A failed or successful run as the outcome of its job and asset (and check) selection; a canceled
    run counts as neither."""
    run = record.dagster_run
    if run.status not in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.SUCCESS):
        return []
    checks = sorted(f"{k.asset_key.to_user_string()}:{k.name}" for k in run.asset_check_selection or ())
    partition = None if run.tags.get(RANGE_START) else named_partition(run.tags.get("dagster/partition"))
    selection = ",".join(selected_assets(instance, run)) + (f"[{partition}]" if partition else "")
    key = f"run:{run.job_name}:{selection}" + (f":{','.join(checks)}" if checks else "")
    assets = sorted(k.to_user_string() for k in run.asset_selection or ())  # named as in the failure alert
    fields = {"job": run.job_name, "run_id": run.run_id}
    if assets:
        fields["assets"] = ", ".join(assets)
    if partition:
        fields["partition"] = partition
    failure = None
    if run.status == dg.DagsterRunStatus.FAILURE:
        failure = run_failure_alert(run, run_failure_reason(instance, run.run_id))
    what = f"job {run.job_name}{selection_words(assets, partition)}"
    return [Outcome(key, ended_at(record), failure, what, f"run {run.run_id[:8]} succeeded", fields)]


def check_failure_alert(evaluation: dg.AssetCheckEvaluation, run_id: str) -> Alert:
    asset = evaluation.asset_key.to_user_string()
    partition = f"[{evaluation.partition}]" if evaluation.partition else ""
    fields = {
        "asset": asset,
        "check": evaluation.check_name,
        "severity": evaluation.severity.value,
        "blocking": str(bool(evaluation.blocking)).lower(),
        "run_id": run_id,
    }
    if evaluation.partition:
        fields["partition"] = evaluation.partition
    title = f"check {asset}{partition}:{evaluation.check_name} failed ({evaluation.severity.value.lower()})"
    return Alert("check_failure", title, short_reason(evaluation.description or "no description"), fields)


def check_evaluations(instance: dg.DagsterInstance, run_id: str) -> list[dg.AssetCheckEvaluation]:
    """The asset check evaluations a run recorded."""
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION).records
    out = []
    for record in records:
        event = record.event_log_entry.dagster_event
        data = event.event_specific_data if event is not None else None
        if isinstance(data, dg.AssetCheckEvaluation):
            out.append(data)
    return out


def alerts_on(evaluation: dg.AssetCheckEvaluation) -> bool:
    """A failed evaluation alerts when the check blocks or its severity is ERROR."""
    return not evaluation.passed and (
        bool(evaluation.blocking) or evaluation.severity == dg.AssetCheckSeverity.ERROR
    )


def check_outcomes(instance: dg.DagsterInstance, record: dg.RunRecord) -> list[Outcome]:
    """The run's check evaluations that alert when they fail (failures) or may close an incident (passes)."""
    out = []
    run_id = record.dagster_run.run_id
    for evaluation in check_evaluations(instance, run_id):
        if not evaluation.passed and not alerts_on(evaluation):
            continue  # a WARN-only failure: neither an incident nor a recovery
        asset = evaluation.asset_key.to_user_string()
        partition = named_partition(evaluation.partition)
        what = f"check {asset}{f'[{partition}]' if partition else ''}:{evaluation.check_name}"
        fields = {"asset": asset, "check": evaluation.check_name, "run_id": run_id}
        if partition:
            fields["partition"] = partition
        failure = None if evaluation.passed else check_failure_alert(evaluation, run_id)
        key = f"check:{asset}:{evaluation.check_name}" + (f"[{partition}]" if partition else "")
        out.append(Outcome(key, ended_at(record), failure, what, f"passed in run {run_id[:8]}", fields))
    return out


def incident_alert(incidents: Incidents, outcome: Outcome, now: float) -> Alert | None:
    """What `outcome` alerts, if anything: a first failure, a reminder, or a recovery."""
    if outcome.failure is None:
        incident = incidents.passed(outcome.key)
        if incident is None:
            return None
        extra = {"failures": str(incident["failures"]), "since": utc_minute(incident["since"])}
        return Alert(
            "recovered",
            f"{outcome.what} recovered: {outcome.how} after {failures_since(incident)}",
            "",
            {**outcome.fields, **extra, "incident_key": outcome.key},
            "recovered",
        )
    which, incident = incidents.failed(outcome.key, outcome.at, now)
    if which is None:
        return None
    alert = outcome.failure
    fields = {**alert.fields, "incident_key": outcome.key}
    if which == "first":
        return replace(alert, fields=fields)
    # "run 1a2b3c4d of job refresh failed" -> "run 1a2b3c4d of job refresh still failing: 5 failures since ..."
    head, _, tail = alert.title.rpartition(" failed")
    title = f"{head} still failing{tail}: {failures_since(incident)}"
    extra = {"failures": str(incident["failures"]), "since": utc_minute(incident["since"])}
    return replace(alert, title=title, fields={**fields, **extra}, incident="reminder")


def read_cursor(cursor: str | None) -> dict[str, Any] | None:
    """The sensor's state, or None on its first tick (no cursor, or one it did not write: it starts anew)."""
    try:
        state = json.loads(cursor) if cursor else None
    except ValueError:
        return None
    if not isinstance(state, dict) or not isinstance(state.get("after"), int | float):
        return None
    return {
        "after": state["after"],
        "seen": list(state.get("seen", [])),
        "incidents": state.get("incidents", {}),
    }


def same_location(context: dg.SensorEvaluationContext, run: dg.DagsterRun) -> bool:
    """Whether `run` belongs to the sensor's code location (True where either is not known)."""
    origin, mine = run.remote_job_origin, context.code_location_origin
    return origin is None or mine is None or origin.location_name == mine.location_name


def build_incident_sensor(
    name: str,
    description: str,
    what: str,
    outcomes: Callable[[dg.DagsterInstance, dg.RunRecord], list[Outcome]],
    interval_s: int,
    default_status: dg.DefaultSensorStatus,
    clock: Callable[[], float],
) -> dg.SensorDefinition:
    @dg.sensor(
        name=name, description=description, default_status=default_status, minimum_interval_seconds=interval_s
    )
    def _sensor(context: dg.SensorEvaluationContext, alerts: AlertSinks) -> dg.SkipReason:
        state = read_cursor(context.cursor)
        if state is None:  # first tick: alert on what happens from now on
            context.update_cursor(json.dumps({"after": time.time(), "seen": [], "incidents": {}}))
            return dg.SkipReason(f"started; alerting on {what} of runs that finish from now on")
        incidents = Incidents(state["incidents"], seconds_setting(REMINDER_ENV_VAR, DEFAULT_REMINDER_S))
        runs = context.instance.get_run_records(
            dg.RunsFilter(statuses=FINISHED, updated_after=dt.datetime.fromtimestamp(state["after"], dt.UTC)),
            limit=BATCH,
            order_by="update_timestamp",
            ascending=True,
        )
        sent, now, seen = 0, clock(), state["seen"]
        for record in runs:
            if record.dagster_run.run_id in seen:
                continue
            if same_location(context, record.dagster_run):
                for outcome in outcomes(context.instance, record):
                    alert = incident_alert(incidents, outcome, now)
                    if alert is not None:
                        deliver(alert, alerts.sinks(), _logger(context))
                        sent += 1
            seen.append(record.dagster_run.run_id)
        after = runs[-1].update_timestamp.timestamp() - 1 if runs else state["after"]
        context.update_cursor(
            json.dumps({"after": after, "seen": seen[-SEEN:], "incidents": incidents.state})
        )
        return dg.SkipReason(
            f"{len(runs)} finished runs, {sent} {what} alerts, {len(incidents.state)} open incidents"
        )

    return _sensor


def build_alert_sensors(
    default_status: dg.DefaultSensorStatus, clock: Callable[[], float] = time.time
) -> list[dg.SensorDefinition]:
    """The two alert sensors; `clock` (Unix time) times the reminders."""
    runs = build_incident_sensor(
        "alert_on_run_failure",
        "Alert (webhook, Slack or a log line) once per failing job and selection: its first failed run, a "
        "reminder while it keeps failing, and its recovery.",
        "run",
        run_outcome,
        30,
        default_status,
        clock,
    )
    checks = build_incident_sensor(
        "alert_on_check_failure",
        "Alert once per failing asset check that is blocking or has severity ERROR: its first failed "
        "evaluation, a reminder while it keeps failing, and its recovery (a passed evaluation).",
        "check",
        check_outcomes,
        60,
        default_status,
        clock,
    )
    return [runs, checks]
