"""Alerts: what went wrong, in a short message without secrets, delivered to a sink.

An `Alert` names the failed run or check and gives a one-line reason. Sinks deliver it:

    LogSink       one WARNING line on the `basemodel_pipeline.alerts` logger (the default)
    WebhookSink   POST of the alert as JSON to a URL (BASEMODEL_ALERT_WEBHOOK_URL)

Any object with `name` and `send(alert)` is a sink; Slack (dagster-slack) lives with the Dagster sensors in
defs/alerts/. Reasons are redacted before they leave: values of environment variables whose names look
secret (…TOKEN, …PASSWORD, …SECRET, the webhook URL) and credentials inside URLs become `***`. A failed
delivery raises AlertDeliveryError whose message never contains the URL.

Alerts come once per incident (`Incidents`): the first failure of a thing alerts, its further failures are
counted and alert again only as a reminder once `reminder_s` has passed since the last alert, and its next
success closes the incident with one "recovered" alert. `Alert.incident` says which of the three it is.
"""

from __future__ import annotations

import json
import logging
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from basemodel_pipeline.metadata import SECRET_KEY

MAX_REASON = 300
MAX_INCIDENTS = 500  # open incidents kept (the ones that failed longest ago are forgotten first)
LOGGER = logging.getLogger("basemodel_pipeline.alerts")
SECRET_NAME = re.compile(SECRET_KEY.pattern + "|webhook", re.I)  # the metadata's secret keys, and the webhook
URL_CREDENTIALS = re.compile(r"(?<=://)[^/\s:@]+:[^/\s@]+@")


class AlertDeliveryError(RuntimeError):
    """A sink could not deliver an alert (the message names the sink, never its URL or token)."""


@dataclass(frozen=True)
class Alert:
    """One failed run or failed check, a reminder that it still fails, or its recovery."""

    kind: Literal["run_failure", "check_failure", "recovered"]
    title: str  # e.g. "run 1a2b3c4d of job refresh failed"
    reason: str  # one short line
    fields: dict[str, str] = field(default_factory=dict)  # run_id, job, asset, check, partition, severity
    incident: Literal["first", "reminder", "recovered"] = "first"

    def text(self) -> str:
        return f"{self.title}: {self.reason}" if self.reason else self.title

    def payload(self) -> dict[str, Any]:
        """The JSON body a webhook receives."""
        return {"source": "basemodel_pipeline", "kind": self.kind, "incident": self.incident, "title": self.title,
                "reason": self.reason, "text": self.text(), **self.fields}  # fmt: skip


def utc_minute(timestamp: float) -> str:
    """A Unix time as `2024-03-01 02:04 UTC`."""
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M UTC")


def failures_since(incident: dict[str, Any]) -> str:
    """`5 failures since 2024-03-01 02:04 UTC` for an incident of `Incidents`."""
    count = incident["failures"]
    return f"{count} failure{'s' if count != 1 else ''} since {utc_minute(incident['since'])}"


class Incidents:
    """The open incidents of an alert sensor, one per failing thing (its key), kept in the sensor's cursor
    as {key: {"since", "failures", "alerted_at", "last"}} (Unix times; `alerted_at` and the reminder interval
    are on the sensor's clock, `since` and `last` are the failed runs' times)."""

    def __init__(self, state: dict[str, dict[str, Any]], reminder_s: float) -> None:
        self.state, self.reminder_s = state, reminder_s

    def failed(self, key: str, at: float, now: float) -> tuple[Literal["first", "reminder"] | None, dict]:
        """Count a failure of `key` (its run ended at `at`; the clock says `now`): ("first", incident) when it
        opens an incident, ("reminder", incident) when the reminder interval has passed since the incident's
        last alert (0: never), else (None, incident)."""
        incident = self.state.get(key)
        if incident is None:
            incident = self.state[key] = {"since": at, "failures": 1, "alerted_at": now, "last": at}
            self._forget_oldest()
            return "first", incident
        incident["failures"] += 1
        incident["last"] = max(incident["last"], at)
        if self.reminder_s > 0 and now - incident["alerted_at"] >= self.reminder_s:
            incident["alerted_at"] = now
            return "reminder", incident
        return None, incident

    def passed(self, key: str) -> dict[str, Any] | None:
        """Close the incident of `key` (it succeeded): the closed incident, None when there was none."""
        return self.state.pop(key, None)

    def _forget_oldest(self) -> None:
        excess = len(self.state) - MAX_INCIDENTS
        if excess > 0:
            for key in sorted(self.state, key=lambda k: self.state[k]["last"])[:excess]:
                del self.state[key]


class AlertSink(Protocol):
    name: str

    def send(self, alert: Alert) -> None: ...


def redact(text: str, environ: dict[str, str] | None = None) -> str:
    """`text` without the values of secret-looking environment variables and without URL credentials."""
    env = os.environ if environ is None else environ
    secrets = sorted(
        (v for k, v in env.items() if SECRET_NAME.search(k) and len(v) >= 6), key=len, reverse=True
    )
    for value in secrets:
        text = text.replace(value, "***")
    return URL_CREDENTIALS.sub("***@", text)


def short_reason(text: str | None, limit: int = MAX_REASON) -> str:
    """The first meaningful line of an error message, redacted and cut to `limit` characters."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    line = redact(lines[0]) if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


class LogSink:
    """One WARNING line per alert (the default sink: the run worker's or daemon's log)."""

    name = "log"

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or LOGGER

    def send(self, alert: Alert) -> None:
        self.logger.warning("ALERT %s", alert.text())


class WebhookSink:
    """POST the alert as JSON (Content-Type: application/json) to a URL; any 2xx answer is delivered."""

    name = "webhook"

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise AlertDeliveryError("the alert webhook URL must start with http:// or https://")
        self._url = url
        self.timeout_s = timeout_s

    def __repr__(self) -> str:  # never the URL: it is a secret
        return "WebhookSink(url=***)"

    def send(self, alert: Alert) -> None:
        body = json.dumps(alert.payload()).encode()
        request = urllib.request.Request(
            self._url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:  # noqa: S310 (http/https only)
                status = answer.status
        except urllib.error.HTTPError as err:
            raise AlertDeliveryError(f"alert webhook answered HTTP {err.code}") from None
        except (urllib.error.URLError, OSError) as err:
            why = getattr(err, "reason", None) or type(err).__name__
            raise AlertDeliveryError(f"alert webhook unreachable ({redact(str(why))})") from None
        if not 200 <= status < 300:
            raise AlertDeliveryError(f"alert webhook answered HTTP {status}")


def deliver(alert: Alert, sinks: list[AlertSink], logger: logging.Logger | None = None) -> list[str]:
    """Send to every sink; a failing sink is logged (one line, no secrets) and the others still get it.
    Returns the names of the sinks that delivered."""
    log = logger or LOGGER
    delivered = []
    for sink in sinks:
        try:
            sink.send(alert)
        except AlertDeliveryError as err:
            log.error(f"alert not delivered by {sink.name}: {err}")
        except Exception as err:  # a sink's own library failing: never leak its message (it may hold a URL)
            log.error(f"alert not delivered by {sink.name}: {type(err).__name__}")
        else:
            delivered.append(sink.name)
    return delivered
