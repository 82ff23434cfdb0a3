"""Freshness expectations: `predictions` and `entity_embeddings` must have been written recently.

    predictions         updated within BASEMODEL_PREDICTIONS_MAX_AGE_H hours (default 36: the nightly
                        refresh rewrites them every day); any scenario's partition counts
    entity_embeddings   updated within BASEMODEL_EMBEDDINGS_MAX_AGE_H hours (default 36)

Dagster's last-update freshness checks (severity ERROR, so a stale asset alerts through
alert_on_check_failure), evaluated by `freshness_checks_sensor` whenever a check could have turned.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg

from basemodel_pipeline.settings import setting

PREDICTIONS_MAX_AGE_ENV_VAR = "BASEMODEL_PREDICTIONS_MAX_AGE_H"
EMBEDDINGS_MAX_AGE_ENV_VAR = "BASEMODEL_EMBEDDINGS_MAX_AGE_H"
DEFAULT_MAX_AGE_H = 36.0


def max_age(env_var: str, default_h: float = DEFAULT_MAX_AGE_H) -> dt.timedelta:
    """The bound from `env_var` (hours, a positive number) or the default."""
    raw = setting(env_var)
    try:
        hours = float(raw) if raw else default_h
    except ValueError:
        raise ValueError(f"{env_var}={raw!r} is not a number of hours") from None
    if not hours > 0:
        raise ValueError(f"{env_var}={raw!r} must be more than 0 hours")
    return dt.timedelta(hours=hours)


def build_freshness_checks() -> list[dg.AssetChecksDefinition]:
    """One last-update freshness check on predictions and one on entity_embeddings (bounds read now)."""
    return [
        *dg.build_last_update_freshness_checks(
            assets=[dg.AssetKey("predictions")],
            lower_bound_delta=max_age(PREDICTIONS_MAX_AGE_ENV_VAR),
            severity=dg.AssetCheckSeverity.ERROR,
        ),
        *dg.build_last_update_freshness_checks(
            assets=[dg.AssetKey("entity_embeddings")],
            lower_bound_delta=max_age(EMBEDDINGS_MAX_AGE_ENV_VAR),
            severity=dg.AssetCheckSeverity.ERROR,
        ),
    ]


def build_freshness_sensor(
    checks: list[dg.AssetChecksDefinition], default_status: dg.DefaultSensorStatus
) -> dg.SensorDefinition:
    return dg.build_sensor_for_freshness_checks(
        freshness_checks=checks,
        name="freshness_checks_sensor",
        minimum_interval_seconds=600,
        default_status=default_status,
    )
