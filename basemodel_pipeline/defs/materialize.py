"""Materialize the whole asset graph in-process against a DagsterInstance (`basemodel demo`, tests).

Runs: (1) every unpartitioned upstream asset (extracts, event_cache, foundation_model) in one run; (2) one run
per scenario partition for scenario_model + predictions; (3) metrics_summary. The runs land in the
instance's event log, so `dagster dev` on the same DAGSTER_HOME shows them.
"""

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

from basemodel_pipeline.config import load_config
from basemodel_pipeline.defs import build_assets, scenarios_partitions
from basemodel_pipeline.defs.resources import resources_for

DAGSTER_YAML = """\
# Written by `basemodel demo`: default SQLite storage in this directory; no telemetry.
telemetry:
  enabled: false
"""

PER_SCENARIO = ("scenario_model", "predictions")
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


def _failure_message(result: dg.ExecuteInProcessResult) -> str:
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
) -> MaterializeReport:
    """Materialize every asset for `config_path`; raise RunFailed with the failing step's message."""
    config_path = str(Path(config_path).resolve())
    scenarios = [sc.name for sc in load_config(config_path).scenarios]
    existing = set(instance.get_dynamic_partitions(scenarios_partitions.name))
    missing = [name for name in scenarios if name not in existing]
    if missing:
        instance.add_dynamic_partitions(scenarios_partitions.name, missing)

    assets = build_assets(config_path)
    resources = resources_for(env, config_path)
    keys = {key.to_user_string(): key for a in assets for key in a.keys}
    upstream = [k for name, k in keys.items() if name not in PER_SCENARIO + LAST]
    plan: list[tuple[str, list[dg.AssetKey], str | None]] = [("extract, cache, pretrain", upstream, None)]
    plan += [(f"scenario {name}", [keys[n] for n in PER_SCENARIO], name) for name in scenarios]
    plan.append(("summary", [keys[n] for n in LAST], None))

    report = MaterializeReport()
    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    for label, selection, partition in plan:
        if on_run is not None:
            on_run(label)
        result = dg.materialize(
            assets,
            instance=instance,
            resources=resources,
            selection=selection,
            partition_key=partition,
            raise_on_error=False,
            run_config={"loggers": {"console": {"config": {"log_level": log_level}}}},
            tags={"basemodel/stage": label},
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
            report.materialized.append(mat.asset_key.to_user_string() + suffix)
    return report
