"""Declarative automation conditions, shared by every domain's assets: what re-materializes by itself, keyed
on data versions, not on events.

A dependency "changed" when its new materialization carries another data version (a cache run that reused
or re-derived the same content changes nothing), or when the asset's own code version changed (a release
that touches its code).

Every asset behind a blocking check waits for it (BLOCKING_CHECKS_PASSED): it is requested only once the
blocking checks of each dependency's latest update have executed and passed. A check that has not run yet on
that update (later in the same run, or in none: a run that left it out), is running, crashed or was skipped
holds it like a failed one; a failed check holds it until it passes again. A materialization from before a
check existed, never evaluated since, and a day partition never materialized (a day without data) hold
nothing. metrics_summary alone is not gated: it reads the served versions, which the training step's own
gates decide.

    event_cache       after an extract (any day partition) changed, once the extracts' blocking checks passed
    foundation_model  once when it is missing, then at each FOUNDATION_CRON tick (default weekly, Sunday
                      03:00 UTC) after which the cache or its code changed; gated by the cache's blocking check
    scenario_baselines, scenario_model
                      a new scenario partition runs once, a release of their code reruns them once (the
                      baselines step, then the model step, in one run), gated by the blocking checks of the
                      cache and the foundation; data changes retrain them through scenario_retrain_sensor
                      (models/retrain.py): a new foundation always, a new cache per the scenario's `retrain`
                      policy, and again when a run read inputs that changed under it
    predictions       after a new scenario_model (in the same run, after its blocking checks, or once they
                      passed) or a release of its code; a new cache is scored by scenario_retrain_sensor
                      (models/retrain.py): in the retrain run of a scenario its policy retrains, else in a run
                      of the scores alone, so each (scenario, served model, cache) is scored once
    entity_embeddings after a changed foundation or cache, gated by their blocking checks
    uploaded_artifacts after predictions (when uploading is on)
    metrics_summary   after any scenario partition changed

The automation sensor `basemodel_automation` (defs/automation/) evaluates these conditions every 30 s and is
running by default; stop it in the UI (Automation tab) to pause all of it.
"""

from __future__ import annotations

import dagster as dg

from basemodel_pipeline.settings import setting

AC = dg.AutomationCondition
FOUNDATION_CRON = setting("BASEMODEL_FOUNDATION_CRON", "0 3 * * 0")
NIGHTLY_CRON = setting("BASEMODEL_NIGHTLY_CRON", "0 2 * * *")
TIMEZONE = "UTC"
# Run monitoring gives up on runs longer than this (seconds); training runs get a day.
MAX_RUNTIME_TAG = "dagster/max_runtime"
MAX_RUNTIME = {"extract": 4 * 3600, "train": 24 * 3600}

_quiet = ~AC.any_deps_in_progress() & ~AC.in_progress()
_requested = AC.newly_requested() | AC.initial_evaluation()


def changed_inputs(label: str = "inputs changed", only: tuple[str, ...] = ()) -> dg.AutomationCondition:
    """True from the tick a dependency's data version (or the asset's code version) changes until the asset is
    next requested or updated. A dependency requested on this tick counts as changed (an asset may join its
    dependency's run). An update of the asset in the same run as its dependency's counts as handling it,
    so predictions that ran with their scenario are not requested again. `only`: the dependencies whose
    changes count (default: every one)."""
    new_input = AC.any_deps_match(AC.data_version_changed() | AC.will_be_requested())
    if only:
        new_input = new_input.allow(dg.AssetSelection.assets(*only))
    changed = new_input | AC.code_version_changed()
    return changed.since(_requested | AC.newly_updated()).with_label(label)


# Unlike eager(), missing day partitions (days without data) never hold these back. Not gated by blocking
# checks: metrics_summary reads the served versions, which the training step's own gates decide.
AFTER_INPUTS_CHANGED = (changed_inputs() & _quiet).with_label("after an input changed")

# The gate of every asset behind a blocking check. check_passed / check_failed judge a check's latest
# execution against the dependency's latest materialization (an extract's checks are unpartitioned: they judge
# the extract's newest materialization, whatever its day). A dependency holds the asset back
#   * while its latest materialization failed a blocking check (in that run or a later one), until it passes;
#   * from an update until its blocking checks passed on it: a check that has not executed yet (it runs after
#     the materialization, later in the same run or in another one), is running, crashed or was skipped holds
#     it as a failure does. A pass seen on the same tick as the update releases it (it judged that update).
# Only updates seen by the automation's ticks start the second hold: a materialization from before a check
# existed, never evaluated since, and a day partition never materialized (a day without data) hold nothing.
# (Dagster's all_deps_blocking_checks_passed() waits for a passed evaluation of each dependency's latest
# materialization whatever its age: one from before a check existed would hold the asset for ever.)
_failed_blocking_check = AC.any_checks_match(AC.check_failed(), blocking_only=True)
_update_not_yet_checked = AC.newly_updated().since(AC.all_checks_match(AC.check_passed(), blocking_only=True))
BLOCKING_CHECKS_PASSED = (~AC.any_deps_match(_failed_blocking_check | _update_not_yet_checked)).with_label(
    "every dependency's blocking checks passed on its latest update"
)

AFTER_DEPS_UPDATED = (changed_inputs() & _quiet & BLOCKING_CHECKS_PASSED).with_label(
    "after an extract changed, once every extract's blocking checks passed on its latest update"
)

FOUNDATION = (
    (
        ((AC.cron_tick_passed(FOUNDATION_CRON, TIMEZONE) & changed_inputs()).since(_requested) & _quiet)
        | (AC.missing().since_last_handled() & ~AC.any_deps_missing() & _quiet)
    )
    & BLOCKING_CHECKS_PASSED
).with_label(f"missing, or at a tick of {FOUNDATION_CRON} after its inputs changed; gated by blocking checks")


def eager_on_versions(label: str, only: tuple[str, ...] = ()) -> dg.AutomationCondition:
    """eager() keyed on data and code versions: a new partition runs once, changed inputs (`only`: of these
    dependencies) rerun it once."""
    return (
        (AC.newly_missing().since_last_handled() | changed_inputs(only=only))
        & ~AC.any_deps_missing()
        & _quiet
    ).with_label(label)


# New data retrains a scenario through scenario_retrain_sensor (models/retrain.py), which compares the
# versions each model was trained on with the current ones. Here: a new scenario partition, or a release of
# the scenario's code, runs the baselines step, then the model step, in one run.
_new_or_released = (
    (AC.newly_missing() | AC.code_version_changed()).since(_requested | AC.newly_updated())
    & ~AC.any_deps_missing()
    & _quiet
    & BLOCKING_CHECKS_PASSED
)
SCENARIO = (_new_or_released & ~AC.any_deps_match(AC.will_be_requested())).with_label(
    "a new scenario, or a release of its code"
)
SCENARIO_MODEL = (
    _new_or_released
    & ~AC.any_deps_match(AC.will_be_requested()).ignore(dg.AssetSelection.assets("scenario_baselines"))
).with_label("a new scenario, or a release of its code; with its baselines, in one run")


def gated_eager(*same_run: str, only: tuple[str, ...] = ()) -> dg.AutomationCondition:
    """eager_on_versions(), but never beside a dependency requested on this tick unless that one joins the same run
    (`same_run`: dependencies with the same partitions), and only once the dependencies' blocking checks
    passed on their latest update (BLOCKING_CHECKS_PASSED), or when such a dependency is requested now (its
    checks then run first in that run and gate this). `only`: the dependencies whose changes rerun it (the
    others still gate it).
    """
    together = dg.AssetSelection.assets(*same_run)
    requested = AC.any_deps_match(AC.will_be_requested())
    reacts = f"; after a change of {', '.join(only)}" if only else ""
    return (
        eager_on_versions("new, or inputs changed", only)
        & ~requested.ignore(together)
        & (BLOCKING_CHECKS_PASSED | requested.allow(together))
    ).with_label(f"eager, gated by blocking checks, together with {', '.join(same_run)}{reacts}")


# predictions: a new partition, a new scenario_model (joining its run, or once its blocking checks passed: a
# model its gates rejected is never scored) or a release of the scores' code. Not a new cache:
# scenario_retrain_sensor scores it (models/retrain.py), in the retrain run of a scenario whose policy retrains
# it, else in a run of the scores alone. ~in_progress() (in _quiet) keeps a partition that a queued or running
# run will score (its planned materialization) from being requested again while its step waits for its pool;
# Dagster forgets that plan once another run materialized the partition after it, so the retrain sensor never
# lets two runs of one scenario overlap.
SCORES = gated_eager("scenario_model", only=("scenario_model",))
