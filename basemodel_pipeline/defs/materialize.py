"""Materialize the whole asset graph in-process against a DagsterInstance (`basemodel demo`, tests).

Runs: (1) the extracts (event sources: every day partition from data_start_date to the newest event day, as
one range run), event_cache, foundation_model and entity_embeddings; (2) one run per scenario partition for
scenario_baselines + scenario_model + predictions; (3) metrics_summary. Asset checks run with their assets (blocking ones stop a
run before what depends on them). The runs land in the instance's event log, so `dagster dev` on the same
DAGSTER_HOME shows them.
"""

import datetime as dt
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg

from basemodel_pipeline.config import load_config
from basemodel_pipeline.defs import build_assets, build_checks
from basemodel_pipeline.defs.extracts.sensors import range_tags
from basemodel_pipeline.defs.shared.partitions import sync_scenario_partitions
from basemodel_pipeline.defs.shared.resources import resources_for
from basemodel_pipeline.errors import UserError

DAGSTER_YAML = """\
# Written by `basemodel demo`: default SQLite storage in this directory; no telemetry.
telemetry:
  enabled: false
# pools gpu and cache_writer: one step at a time each (raise gpu with `dagster instance concurrency set`)
concurrency:
  pools:
    default_limit: 1
# under `dagster dev` (make ui): the daemon frees a terminated run's pool slots 10 s after it ended, and ends a
# CANCELING run whose worker died after 150 s (docs/orchestration.md, "Terminating a run")
run_monitoring:
  enabled: true
  cancel_timeout_seconds: 150
  free_slots_after_run_end_seconds: 10
"""

PER_SCENARIO = ("scenario_baselines", "scenario_model", "predictions")
LAST = ("metrics_summary",)


class RunFailed(RuntimeError):
    """A Dagster run failed; the message names the failing step and its error."""


@dataclass
class MaterializeReport:
    run_ids: list[str] = field(default_factory=list)
    step_seconds: dict[str, float] = field(default_factory=dict)
    materialized: list[str] = field(default_factory=list)


def demo_instance(workspace: Path) -> dg.DagsterInstance:
    """A persistent instance in <workspace>/dagster_home (sets DAGSTER_HOME for this process)."""
    home = (workspace / "dagster_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.write_text(DAGSTER_YAML)
    os.environ["DAGSTER_HOME"] = str(home)
    return dg.DagsterInstance.get()


def _failed_checks(result: dg.ExecuteInProcessResult) -> list[str]:
    out = []
    for event in result.all_events:
        if event.event_type_value == "ASSET_CHECK_EVALUATION":
            evaluation = event.event_specific_data
            if not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.ERROR:
                key = evaluation.asset_check_key
                out.append(
                    f"check {key.asset_key.to_user_string()}:{key.name} failed: {evaluation.description}"
                )
    return out


def _failure_message(result: dg.ExecuteInProcessResult) -> str:
    checks = _failed_checks(result)
    if checks:
        return "; ".join(checks)
    for event in result.get_step_failure_events():
        data = event.step_failure_data
        user = data.user_failure_data
        message = user.description if user is not None and user.description else None
        if message is None and data.error is not None:
            cause = data.error.cause
            message = (cause.message if cause is not None else data.error.message).strip()
        return f"step {event.step_key} failed: {message}"
    return "run failed (see the Dagster event log)"


def _step_seconds(instance: dg.DagsterInstance, run_id: str, suffix: str) -> dict[str, float]:
    kinds = {
        dg.DagsterEventType.STEP_START,
        dg.DagsterEventType.STEP_SUCCESS,
        dg.DagsterEventType.STEP_FAILURE,
    }
    starts: dict[str, float] = {}
    out: dict[str, float] = {}
    for entry in instance.all_logs(run_id, of_type=kinds):
        step, event = entry.step_key, entry.dagster_event
        if step is None or event is None:
            continue
        if event.event_type == dg.DagsterEventType.STEP_START:
            starts[step] = entry.timestamp
        elif step in starts:
            out[step.replace("__", "/") + suffix] = entry.timestamp - starts[step]
    return out


def materialize_all(
    config_path: str | os.PathLike[str],
    instance: dg.DagsterInstance,
    env: str = "local",
    on_run: Callable[[str], None] | None = None,
    log_level: str = "INFO",
    resource_overrides: dict[str, Any] | None = None,
) -> MaterializeReport:
    """Materialize every asset for `config_path`; raise RunFailed with the failing step's message."""
    config_path = str(Path(config_path).resolve())
    scenarios = [sc.name for sc in load_config(config_path).scenarios]
    sync_scenario_partitions(instance, scenarios)

    assets = build_assets(config_path)
    checks = build_checks(config_path)
    resources = {**resources_for(env, config_path), **(resource_overrides or {})}
    keys = {key.to_user_string(): key for a in assets for key in a.keys}
    upstream = [k for name, k in keys.items() if name not in PER_SCENARIO + LAST]
    try:
        days = _event_days(config_path)
    except UserError as err:  # e.g. the source is missing: the same one-line message as a failed step
        raise RunFailed(f"extract, cache, pretrain: {err}") from None
    plan: list[tuple[str, list[dg.AssetKey], str | None, dict[str, str]]] = [
        ("extract, cache, pretrain", upstream, None, range_tags(*days))
    ]
    plan += [(f"scenario {name}", [keys[n] for n in PER_SCENARIO], name, {}) for name in scenarios]
    plan.append(("summary", [keys[n] for n in LAST], None, {}))

    report = MaterializeReport()
    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    for label, selection, partition, tags in plan:
        if on_run is not None:
            on_run(label)
        result = dg.materialize(
            [*assets, *checks],
            instance=instance,
            resources=resources,
            selection=selection,
            partition_key=partition,
            raise_on_error=False,
            run_config={"loggers": {"console": {"config": {"log_level": log_level}}}},
            tags={"basemodel/stage": label, **tags},
        )
        report.run_ids.append(result.run_id)
        report.step_seconds.update(
            _step_seconds(instance, result.run_id, f"[{partition}]" if partition else "")
        )
        if not result.success:
            raise RunFailed(f"{label}: {_failure_message(result)}")
        for event in result.get_asset_materialization_events():
            mat = event.event_specific_data.materialization
            suffix = f"[{mat.partition}]" if mat.partition else ""
            name = mat.asset_key.to_user_string()
            if mat.partition and partition is None:  # a day range: one entry per asset
                suffix, name = "", name if name not in report.materialized else ""
            if name:
                report.materialized.append(name + suffix)
    return report


def _event_days(config_path: str) -> tuple[dt.date, dt.date]:
    """(data_start_date, newest event day over all event sources): the day partitions the demo extracts."""
    from basemodel_pipeline.sources import watermark

    cfg = load_config(config_path)
    marks = [m for s in cfg.data_sources if s.type == "event" and (m := watermark(cfg, s)) is not None]
    start = cfg.data_params.data_start_date
    return start, max([*marks, start])
