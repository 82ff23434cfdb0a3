"""Declarative automation: what re-materializes by itself when upstream data changes.

    event_cache       after any extract (any day partition) was updated
    foundation_model  once when it is missing, then after each FOUNDATION_CRON tick (default weekly,
                      Sunday 03:00 UTC) once the cache has been updated since that tick
    scenario_model    eager: a new scenario partition runs once; a new foundation or cache retrains every
                      scenario once (waits while a dependency is requested or running)
    predictions       eager with its scenario_model, in the same run (after its blocking checks) or while
                      they pass
    entity_embeddings eager with a new foundation or cache, gated by their blocking checks
    published_artifacts  eager after predictions (when publishing is on)
    metrics_summary   after any scenario partition was updated

The automation sensor `basemodel_automation` evaluates these conditions every 30 s and is running by default;
stop it in the UI (Automation tab) to pause all of it.
"""

from __future__ import annotations

import os

import dagster as dg

AC = dg.AutomationCondition
FOUNDATION_CRON = os.environ.get("BASEMODEL_FOUNDATION_CRON", "0 3 * * 0")
NIGHTLY_CRON = os.environ.get("BASEMODEL_NIGHTLY_CRON", "0 2 * * *")
TIMEZONE = "UTC"
# Run monitoring gives up on runs longer than this (seconds); training runs get a day.
MAX_RUNTIME_TAG = "dagster/max_runtime"
MAX_RUNTIME = {"extract": 4 * 3600, "train": 24 * 3600}

_quiet = ~AC.any_deps_in_progress() & ~AC.in_progress()

# Unlike eager(), days without data (missing upstream day partitions) never hold this back.
AFTER_DEPS_UPDATED = (AC.any_deps_updated().since_last_handled() & _quiet).with_label("after_deps_updated")

FOUNDATION = (
    AC.on_cron(FOUNDATION_CRON, TIMEZONE)
    | (AC.missing().since_last_handled() & ~AC.any_deps_missing() & _quiet)
).with_label(f"missing, or weekly ({FOUNDATION_CRON}) after the cache changed")

# A dependency requested on this tick (a new cache or foundation) runs first; the scenario follows after it.
SCENARIO = (AC.eager() & ~AC.any_deps_match(AC.will_be_requested())).with_label(
    "eager, after the cache and foundation settle"
)


def gated_eager(*same_run: str) -> dg.AutomationCondition:
    """eager(), but never beside a dependency requested on this tick unless that one joins the same run
    (`same_run`: dependencies with the same partitions), and only while the dependencies' blocking checks
    pass, or when such a dependency is requested now (its checks then run first in that run and gate this).
    """
    together = dg.AssetSelection.assets(*same_run)
    requested = AC.any_deps_match(AC.will_be_requested())
    return (
        AC.eager()
        & ~requested.ignore(together)
        & (AC.all_deps_blocking_checks_passed() | requested.allow(together))
    ).with_label(f"eager, gated by blocking checks, together with {', '.join(same_run)}")


def automation_sensor(
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.RUNNING,
    run_tags: dict[str, str] | None = None,
) -> dg.AutomationConditionSensorDefinition:
    """Evaluates every asset's automation condition every 30 s; running by default."""
    return dg.AutomationConditionSensorDefinition(
        "basemodel_automation",
        target=dg.AssetSelection.all(),
        default_status=default_status,
        minimum_interval_seconds=30,
        run_tags={MAX_RUNTIME_TAG: str(MAX_RUNTIME["train"]), **(run_tags or {})},
    )
