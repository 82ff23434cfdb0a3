"""Settings read from the environment (BASEMODEL_*): one reader, so that a variable set to an empty string
means "not set" everywhere. Deployments define every setting their run workers receive (docker-compose.yml
passes `${NAME:-}`; Dagster's DockerRunLauncher refuses to launch when a listed variable is missing), so an
empty value must fall back to the default instead of failing `int("")` deep inside a step."""

from __future__ import annotations

import os


def setting(name: str, default: str = "") -> str:
    """The variable's value, or `default` when it is unset or empty (whitespace counts as empty)."""
    value = os.environ.get(name)
    return default if value is None or not value.strip() else value.strip()


def setting_list(name: str) -> list[str]:
    """A comma-separated setting as a list (empty items dropped)."""
    return [v.strip() for v in setting(name).split(",") if v.strip()]


def seconds_setting(name: str, default: float) -> float:
    """A duration in seconds (a number, 0 or more), or `default` when unset or empty; a ValueError names the
    setting and its value otherwise."""
    raw = setting(name)
    try:
        seconds = float(raw) if raw else float(default)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
    if not seconds >= 0:
        raise ValueError(f"{name}={raw!r} must be 0 or more seconds")
    return seconds
