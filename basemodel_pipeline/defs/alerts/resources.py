"""The `alerts` resource: which sinks receive alerts, configured from the environment.

    BASEMODEL_ALERT_WEBHOOK_URL                   POST JSON to this URL
    BASEMODEL_SLACK_TOKEN + BASEMODEL_SLACK_CHANNEL  a Slack message (dagster-slack)
    neither                                       one WARNING log line per alert

Both may be set (every configured sink gets each alert). The values are dg.EnvVar: read at run time, shown
in the UI by name only, never written to logs, metadata or error messages.
"""

from __future__ import annotations

import logging
import os

import dagster as dg

from basemodel_pipeline.ops.alerts import Alert, AlertDeliveryError, AlertSink, LogSink, WebhookSink

WEBHOOK_ENV_VAR = "BASEMODEL_ALERT_WEBHOOK_URL"
SLACK_TOKEN_ENV_VAR = "BASEMODEL_SLACK_TOKEN"
SLACK_CHANNEL_ENV_VAR = "BASEMODEL_SLACK_CHANNEL"
SLACK_ICONS = {"first": ":rotating_light:", "reminder": ":repeat:", "recovered": ":white_check_mark:"}


def slack_text(alert: Alert) -> str:
    """The Slack message of an alert: an icon for first / reminder / recovered, then the alert's text."""
    return f"{SLACK_ICONS[alert.incident]} {alert.text()}"


class SlackSink:
    """A Slack message per alert through dagster-slack's SlackResource."""

    name = "slack"

    def __init__(self, token: str, channel: str) -> None:
        self._token, self.channel = token, channel

    def __repr__(self) -> str:
        return f"SlackSink(channel={self.channel!r}, token=***)"

    def send(self, alert: Alert) -> None:
        from dagster_slack import SlackResource
        from slack_sdk.errors import SlackApiError

        try:
            SlackResource(token=self._token).get_client().chat_postMessage(
                channel=self.channel, text=slack_text(alert)
            )
        except SlackApiError as err:
            raise AlertDeliveryError(f"Slack answered {err.response.get('error', 'an error')}") from None


class AlertSinks(dg.ConfigurableResource):
    """Where alerts go (see the module docstring); nothing configured: a log line."""

    webhook_url: str | None = None
    slack_token: str | None = None
    slack_channel: str | None = None

    def sinks(self, logger: logging.Logger | None = None) -> list[AlertSink]:
        sinks: list[AlertSink] = []
        if self.webhook_url:
            sinks.append(WebhookSink(self.webhook_url))
        if self.slack_token and self.slack_channel:
            sinks.append(SlackSink(self.slack_token, self.slack_channel))
        return sinks or [LogSink(logger)]


def alert_sinks_from_env() -> AlertSinks:
    """The resource with a dg.EnvVar for each variable that is set now (unset ones stay off)."""

    def env(name: str) -> dg.EnvVar | None:
        return dg.EnvVar(name) if os.environ.get(name) else None

    return AlertSinks(
        webhook_url=env(WEBHOOK_ENV_VAR),
        slack_token=env(SLACK_TOKEN_ENV_VAR),
        slack_channel=env(SLACK_CHANNEL_ENV_VAR),
    )
