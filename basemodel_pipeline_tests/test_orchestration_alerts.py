"""Alerts and freshness: real failed runs and checks in a real instance reach a real local webhook (or the
log), never with a secret; the freshness checks fail for a stale materialization and pass for a fresh one."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from basemodel_pipeline.defs import build_assets, build_checks, build_definitions
from basemodel_pipeline.defs.alerts.freshness import build_freshness_checks
from basemodel_pipeline.defs.alerts.resources import AlertSinks, slack_text
from basemodel_pipeline.defs.alerts.sensors import build_alert_sensors
from basemodel_pipeline.defs.shared.resources import resources_for
from basemodel_pipeline.ops.alerts import Alert, AlertDeliveryError, WebhookSink, deliver, redact

SECRET = "T0SECRET/B0TOKEN/xyzzy42"
PRODUCTS = dg.AssetKey(["extracts", "products"])


class Hook:
    """A local HTTP server that records JSON POSTs and answers `status`."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.status = 200
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.received.append({"path": self.path, "json": json.loads(body)})
                self.send_response(hook.status)
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/{SECRET}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.server.shutdown()
    h.server.server_close()


@dg.asset
def scored() -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata={"rows": 3})


@dg.asset_check(asset=scored, blocking=True)
def scores_in_range() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=False, description="3 scores above 1.0\nsecond line")


@dg.asset_check(asset=scored)
def few_rows() -> dg.AssetCheckResult:  # WARN only: no alert
    return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN, description="only 3 rows")


def tick(defs: dg.Definitions, name: str, instance: dg.DagsterInstance, cursor: str | None) -> Any:
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources=dict(defs.resources))
    return defs.get_sensor_def(name).evaluate_tick(context)


def broken_extract(config: Path, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    """Extract the products table after its source file disappeared: a really failed run."""
    (config.parent / "data" / "products.parquet").unlink()
    return dg.materialize(
        [*build_assets(str(config)), *build_checks(str(config))],
        instance=instance,
        selection=[PRODUCTS],
        resources=resources_for("ci", str(config)),
        raise_on_error=False,
    )


def test_failed_run_and_failed_check_reach_the_webhook_without_secrets(
    tiny_config: Path, hook: Hook, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("BASEMODEL_ALERT_WEBHOOK_URL", hook.url)
    monkeypatch.setenv("BASEMODEL_AUTOMATION", "stopped")
    defs = build_definitions(str(tiny_config), env="ci")
    assert SECRET not in repr(defs.resources["alerts"])  # an EnvVar, read at run time
    caplog.set_level(logging.DEBUG)
    with dg.instance_for_test() as instance:
        runs_cursor = tick(defs, "alert_on_run_failure", instance, None).cursor
        checks_cursor = tick(defs, "alert_on_check_failure", instance, None).cursor
        assert hook.received == []  # nothing before the sensors started

        failed = broken_extract(tiny_config, instance)
        assert not failed.success
        checked = dg.materialize([scored, scores_in_range, few_rows], instance=instance, raise_on_error=False)
        assert not checked.success  # the blocking check stopped it

        tick(defs, "alert_on_run_failure", instance, runs_cursor)
        result = tick(defs, "alert_on_check_failure", instance, checks_cursor)
        assert "1 check alerts" in (result.skip_message or "")
        again = tick(defs, "alert_on_check_failure", instance, result.cursor)  # nothing twice
        assert "0 check alerts" in (again.skip_message or "")

    bodies = [r["json"] for r in hook.received]
    assert {r["path"] for r in hook.received} == {f"/hooks/{SECRET}"}
    runs = {b["run_id"]: b for b in bodies if b["kind"] == "run_failure"}
    assert set(runs) == {failed.run_id, checked.run_id}
    extract = runs[failed.run_id]
    assert extract["title"] == f"run {failed.run_id[:8]} of job __ephemeral_asset_job__ failed"
    assert extract["reason"].startswith("extracts__products: source 'products': no Parquet file matches")
    assert "\n" not in extract["reason"] and "Traceback" not in extract["reason"]
    (check,) = [b for b in bodies if b["kind"] == "check_failure"]
    assert check["title"] == "check scored:scores_in_range failed (error)"
    assert check["reason"] == "3 scores above 1.0"
    assert (check["asset"], check["check"], check["blocking"], check["run_id"]) == (
        "scored",
        "scores_in_range",
        "true",
        checked.run_id,
    )
    assert all(SECRET not in json.dumps(b) for b in bodies)
    assert SECRET not in caplog.text


def test_default_sink_is_one_log_line(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("BASEMODEL_ALERT_WEBHOOK_URL", "BASEMODEL_SLACK_TOKEN", "BASEMODEL_SLACK_CHANNEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BASEMODEL_AUTOMATION", "stopped")
    defs = build_definitions(str(tiny_config), env="ci")
    assert [s.name for s in defs.resources["alerts"].sinks()] == ["log"]
    with dg.instance_for_test() as instance:
        cursor = tick(defs, "alert_on_run_failure", instance, None).cursor
        failed = broken_extract(tiny_config, instance)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="basemodel_pipeline.alerts"):
            tick(defs, "alert_on_run_failure", instance, cursor)
    lines = [r.getMessage() for r in caplog.records if r.name == "basemodel_pipeline.alerts"]
    assert len(lines) == 1
    assert lines[0].startswith(f"ALERT run {failed.run_id[:8]} of job __ephemeral_asset_job__ failed: ")
    assert "no Parquet file matches" in lines[0]


def test_an_unreachable_or_failing_webhook_never_leaks_its_url(
    hook: Hook, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    alert = Alert("run_failure", "run x of job y failed", "boom")
    hook.status = 500
    with pytest.raises(AlertDeliveryError, match="HTTP 500") as err:
        WebhookSink(hook.url).send(alert)
    assert SECRET not in str(err.value)
    dead = f"http://127.0.0.1:9/hooks/{SECRET}"  # nothing listens on port 9
    with caplog.at_level(logging.ERROR, logger="basemodel_pipeline.alerts"):
        assert deliver(alert, [WebhookSink(dead)]) == []
    assert "alert not delivered by webhook" in caplog.text and SECRET not in caplog.text
    assert SECRET not in repr(WebhookSink(dead))

    # reasons are redacted: secret-looking variables and URL credentials
    monkeypatch.setenv("WAREHOUSE_PASSWORD", "hunter2-very-secret")
    text = "login failed for postgresql://bob:pw123@db/x with hunter2-very-secret"
    assert redact(text) == "login failed for postgresql://***@db/x with ***"


def test_freshness_checks_fail_when_stale_and_pass_when_fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BASEMODEL_PREDICTIONS_MAX_AGE_H", raising=False)
    monkeypatch.delenv("BASEMODEL_EMBEDDINGS_MAX_AGE_H", raising=False)

    def evaluate(instance: dg.DagsterInstance) -> dict[str, dg.AssetCheckEvaluation]:
        checks = build_freshness_checks()
        specs = [dg.AssetSpec("predictions"), dg.AssetSpec("entity_embeddings")]
        result = dg.materialize(
            [*specs, *checks], instance=instance, selection=dg.AssetSelection.checks(*checks)
        )
        return {e.asset_key.to_user_string(): e for e in result.get_asset_check_evaluations()}

    def written(instance: dg.DagsterInstance, key: str, hours_ago: float) -> None:
        stamp = dg.MetadataValue.timestamp(time.time() - hours_ago * 3600)
        instance.report_runless_asset_event(
            dg.AssetMaterialization(key, metadata={"dagster/last_updated_timestamp": stamp})
        )

    with dg.instance_for_test() as instance:
        never = evaluate(instance)
        assert not never["predictions"].passed and not never["entity_embeddings"].passed
        written(instance, "predictions", 40)  # the nightly run missed a night and a half
        written(instance, "entity_embeddings", 2)
        verdict = evaluate(instance)
        assert not verdict["predictions"].passed
        assert verdict["predictions"].severity == dg.AssetCheckSeverity.ERROR  # so it alerts
        assert "overdue" in (verdict["predictions"].description or "")
        assert verdict["entity_embeddings"].passed

        written(instance, "predictions", 1)
        assert evaluate(instance)["predictions"].passed

        monkeypatch.setenv("BASEMODEL_EMBEDDINGS_MAX_AGE_H", "1")  # a tighter bound from the environment
        assert not evaluate(instance)["entity_embeddings"].passed

    monkeypatch.setenv("BASEMODEL_PREDICTIONS_MAX_AGE_H", "soon")
    with pytest.raises(ValueError, match="BASEMODEL_PREDICTIONS_MAX_AGE_H='soon' is not a number of hours"):
        build_freshness_checks()


def test_freshness_sensor_requests_the_checks(tiny_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASEMODEL_AUTOMATION", "stopped")
    defs = build_definitions(str(tiny_config), env="ci")
    sensor = defs.get_sensor_def("freshness_checks_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.STOPPED
    with dg.instance_for_test() as instance:
        result = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs))
    keys = {k for r in result.run_requests for k in r.asset_check_keys or []}
    assert keys == {
        dg.AssetCheckKey(dg.AssetKey("predictions"), "freshness_check"),
        dg.AssetCheckKey(dg.AssetKey("entity_embeddings"), "freshness_check"),
    }


def test_sinks_follow_the_environment(tiny_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASEMODEL_AUTOMATION", "stopped")
    monkeypatch.setenv("BASEMODEL_ALERT_WEBHOOK_URL", "https://hooks.example/T/B/secret-path")
    monkeypatch.setenv("BASEMODEL_SLACK_TOKEN", "xoxb-not-a-real-token")
    monkeypatch.setenv("BASEMODEL_SLACK_CHANNEL", "#basemodel-alerts")
    alerts = build_definitions(str(tiny_config), env="ci").resources["alerts"]
    assert isinstance(alerts.slack_token, dg.EnvVar) and isinstance(alerts.webhook_url, dg.EnvVar)
    with dg.build_init_resource_context() as context:
        sinks = alerts.with_replaced_resource_context(context).process_config_and_initialize().sinks()
    assert [s.name for s in sinks] == ["webhook", "slack"]
    assert "xoxb" not in repr(sinks) and "secret-path" not in repr(sinks)


# ---------------------------------------------------------------- incidents: one alert per failing thing

VERDICT = {"passed": False}
SENT: list[Alert] = []
START = 1_700_000_000.0  # the sensors' clock in these tests (2023-11-14 22:13:20 UTC); never the wall clock


class Captured(AlertSinks):
    """The `alerts` resource with one sink that keeps what it is sent (in SENT)."""

    def sinks(self, logger: logging.Logger | None = None) -> list[Any]:
        class Capture:
            name = "capture"

            def send(self, alert: Alert) -> None:
                SENT.append(alert)

        return [Capture()]


@dg.asset
def graded() -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata={"rows": 3})


@dg.asset_check(asset=graded, blocking=True)
def grades_in_range() -> dg.AssetCheckResult:
    if VERDICT["passed"]:
        return dg.AssetCheckResult(passed=True, description="every grade in range")
    return dg.AssetCheckResult(
        passed=False, description=f"3 grades above 1.0 (login {os.environ['WAREHOUSE_PASSWORD']})"
    )


class Alerting:
    """Both alert sensors on one instance, ticked with a clock the test moves, delivering to SENT."""

    def __init__(self, instance: dg.DagsterInstance) -> None:
        self.instance, self.now = instance, START
        self.sensors = {
            s.name: s for s in build_alert_sensors(dg.DefaultSensorStatus.STOPPED, clock=lambda: self.now)
        }
        self.cursors: dict[str, str | None] = dict.fromkeys(self.sensors)
        self.tick()  # started: alerts on what finishes from now on

    def tick(self) -> list[Alert]:
        before = len(SENT)
        for name, sensor in self.sensors.items():
            context = dg.build_sensor_context(
                instance=self.instance, cursor=self.cursors[name], resources={"alerts": Captured()}
            )
            self.cursors[name] = sensor.evaluate_tick(context).cursor
        return SENT[before:]

    def run(self, passed: bool, first_day: str = "2023-01-01", last_day: str = "2023-01-02") -> list[Alert]:
        """One run of `graded` and its blocking check (a day range in its tags, as an extract retry has),
        then a tick of both sensors: the alerts it gave."""
        VERDICT["passed"] = passed
        tags = {
            "dagster/asset_partition_range_start": first_day,
            "dagster/asset_partition_range_end": last_day,
        }
        result = dg.materialize(
            [graded, grades_in_range], instance=self.instance, tags=tags, raise_on_error=False
        )
        assert result.success == passed
        return self.tick()


@pytest.fixture
def alerting(monkeypatch: pytest.MonkeyPatch) -> Iterator[Alerting]:
    monkeypatch.setenv("WAREHOUSE_PASSWORD", "hunter2-very-secret")
    monkeypatch.setenv("BASEMODEL_ALERT_REMINDER_S", "3600")
    SENT.clear()
    with dg.instance_for_test() as instance:
        yield Alerting(instance)
    SENT.clear()


def test_a_check_failing_in_five_runs_alerts_once(alerting: Alerting) -> None:
    """Five failed runs of the same check and job, each with another day range (as retries have): one alert
    for the check and one for the run it stopped, the later failures only counted."""
    first = alerting.run(passed=False)
    assert sorted(a.kind for a in first) == ["check_failure", "run_failure"]
    assert {a.incident for a in first} == {"first"}
    check = next(a for a in first if a.kind == "check_failure")
    assert check.text() == "check graded:grades_in_range failed (error): 3 grades above 1.0 (login ***)"
    assert check.payload()["incident"] == "first"
    for day in ("2023-01-03", "2023-01-04", "2023-01-05", "2023-01-06"):
        alerting.now += 300  # a retry every 5 minutes
        assert alerting.run(passed=False, first_day="2023-01-01", last_day=day) == []
    assert len(SENT) == 2 and "hunter2" not in json.dumps([a.payload() for a in SENT])


def test_a_reminder_after_the_interval_says_how_many_failures_since_when(alerting: Alerting) -> None:
    alerting.run(passed=False)
    for _ in range(3):
        alerting.now += 600
        assert alerting.run(passed=False) == []
    alerting.now = START + 3600  # the reminder interval has passed since the first alert
    reminders = alerting.run(passed=False)
    assert sorted(a.kind for a in reminders) == ["check_failure", "run_failure"]
    assert {a.incident for a in reminders} == {"reminder"}
    check = next(a for a in reminders if a.kind == "check_failure")
    assert check.title.startswith("check graded:grades_in_range still failing (error): 5 failures since ")
    assert check.reason == "3 grades above 1.0 (login ***)"
    payload = check.payload()
    assert (payload["incident"], payload["failures"], payload["kind"]) == ("reminder", "5", "check_failure")
    assert payload["since"].endswith("UTC")
    run = next(a for a in reminders if a.kind == "run_failure")
    assert " of job __ephemeral_asset_job__ still failing: 5 failures since " in run.title
    assert run.fields["incident_key"] == "run:__ephemeral_asset_job__:graded"  # a run of this job and asset
    alerting.now += 60
    assert alerting.run(passed=False) == []  # the next reminder is an interval later
    alerting.now += 3600
    assert {a.fields["failures"] for a in alerting.run(passed=False)} == {"7"}


def test_a_passing_run_closes_the_incident_with_one_recovered_alert(alerting: Alerting) -> None:
    alerting.run(passed=False)
    alerting.now += 300
    alerting.run(passed=False)
    alerting.now += 300
    recovered = alerting.run(passed=True)
    assert len(recovered) == 2 and {a.kind for a in recovered} == {"recovered"}
    assert {a.incident for a in recovered} == {"recovered"}
    check = next(a for a in recovered if "check" in a.fields)
    assert check.title.startswith("check graded:grades_in_range recovered: passed in run ")
    assert " after 2 failures since " in check.title
    run = next(a for a in recovered if "job" in a.fields)
    assert run.text().startswith("job __ephemeral_asset_job__ recovered: run ")
    assert run.payload()["incident"] == "recovered" and run.fields["failures"] == "2"
    assert slack_text(run).startswith(":white_check_mark: job __ephemeral_asset_job__ recovered")
    alerting.now += 300
    assert alerting.run(passed=True) == []  # nothing to recover any more
    again = alerting.run(passed=False)  # a new incident: alerted at once
    assert sorted(a.kind for a in again) == ["check_failure", "run_failure"]
    assert {a.incident for a in again} == {"first"}
