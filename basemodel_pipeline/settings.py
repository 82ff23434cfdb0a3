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
