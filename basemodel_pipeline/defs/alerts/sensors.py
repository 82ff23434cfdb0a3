"""Alert sensors: a failed run, and a failed check that blocks or has ERROR severity, become one alert each.

    alert_on_run_failure    dg.run_failure_sensor: job, run id, assets, partition, the first failed step's
                            error (one line, redacted)
    alert_on_check_failure  the asset check evaluations of each run that finished since its cursor (the
                            last run update time; on its first tick it starts from now, no backlog): a
                            failed evaluation that is blocking or has severity ERROR alerts (WARN-only
                            failures, e.g. volume_within_guidelines, do not)

A failed blocking check therefore gives two alerts: the check, and the run it stopped.
"""

import datetime as dt
import json
import logging
import re
import time

import dagster as dg

from basemodel_pipeline.alerts import Alert, deliver, short_reason
from basemodel_pipeline.defs.alerts.resources import AlertSinks

EXCEPTION_PREFIX = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Failure)?: ")
BATCH = 100
SEEN = 500  # run ids remembered in the cursor (a run updated again is not alerted twice)
FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]


def _logger(context: dg.SensorEvaluationContext) -> logging.Logger:
    return (
        context.log
        if isinstance(context.log, logging.Logger)
        else logging.getLogger("basemodel_pipeline.alerts")
    )


def run_failure_alert(context: dg.RunFailureSensorContext) -> Alert:
    """The alert of a failed run: what ran, and the first failed step's error (or the run's failure)."""
    run = context.dagster_run
    steps = context.get_step_failure_events()
    if steps and steps[0].step_failure_data.error is not None:
        step = steps[0].step_key or "a step"
        reason = f"{step}: {EXCEPTION_PREFIX.sub('', steps[0].step_failure_data.error.message.strip())}"
    else:
        reason = context.failure_event.message or "the run failed"
    assets = sorted(k.to_user_string() for k in run.asset_selection or ())
    fields = {"run_id": run.run_id, "job": run.job_name}
    if assets:
        fields["assets"] = ", ".join(assets)
    if run.tags.get("dagster/partition"):
        fields["partition"] = run.tags["dagster/partition"]
    what = (
        f" ({fields['assets']}{'[' + fields['partition'] + ']' if 'partition' in fields else ''})"
        if assets
        else ""
    )
    return Alert(
        "run_failure",
        f"run {run.run_id[:8]} of job {run.job_name}{what} failed",
        short_reason(reason),
        fields,
    )


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


def build_alert_sensors(default_status: dg.DefaultSensorStatus) -> list[dg.SensorDefinition]:
    @dg.run_failure_sensor(
        name="alert_on_run_failure", default_status=default_status, minimum_interval_seconds=30
    )
    def alert_on_run_failure(context: dg.RunFailureSensorContext, alerts: AlertSinks) -> None:
        """Send an alert (webhook, Slack or a log line) for every failed run of this code location."""
        alert = run_failure_alert(context)
        delivered = deliver(alert, alerts.sinks(), _logger(context))
        context.log.info(
            f"alert for run {context.dagster_run.run_id}: {', '.join(delivered) or 'not delivered'}"
        )

    @dg.sensor(name="alert_on_check_failure", default_status=default_status, minimum_interval_seconds=60)
    def alert_on_check_failure(context: dg.SensorEvaluationContext, alerts: AlertSinks) -> dg.SkipReason:
        """Send an alert for every failed asset check evaluation that is blocking or has severity ERROR,
        once the run that evaluated it has finished."""
        if context.cursor is None:  # first tick: alert on what happens from now on
            context.update_cursor(json.dumps({"after": time.time(), "seen": []}))
            return dg.SkipReason("started; alerting on check evaluations of runs that finish from now on")
        cursor = json.loads(context.cursor)
        after = dt.datetime.fromtimestamp(cursor["after"], dt.UTC)
        seen = list(cursor["seen"])
        runs = context.instance.get_run_records(
            dg.RunsFilter(statuses=FINISHED, updated_after=after),
            limit=BATCH,
            order_by="update_timestamp",
            ascending=True,
        )
        sent = 0
        for record in runs:
            if record.dagster_run.run_id in seen:
                continue
            for evaluation in check_evaluations(context.instance, record.dagster_run.run_id):
                if alerts_on(evaluation):
                    alert = check_failure_alert(evaluation, record.dagster_run.run_id)
                    deliver(alert, alerts.sinks(), _logger(context))
                    sent += 1
            seen.append(record.dagster_run.run_id)
        if runs:
            after_ts = runs[-1].update_timestamp.timestamp()
            context.update_cursor(json.dumps({"after": after_ts - 1, "seen": seen[-SEEN:]}))
        return dg.SkipReason(f"{len(runs)} finished runs, {sent} check alerts")

    return [alert_on_run_failure, alert_on_check_failure]
