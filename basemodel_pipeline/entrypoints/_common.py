"""Shared machinery of the Pipes entrypoints: arguments, Pipes or plain-stdout session, metadata, errors.

An entrypoint is ``python -m basemodel_pipeline.entrypoints.<stage> --config PATH [--scenario NAME] [--as-of DATE]``.
Launched by Dagster (``DAGSTER_PIPES_*`` env vars set) it logs through Pipes and reports one asset
materialization; launched by hand it logs to stdout and prints the metadata as JSON. A ``UserError`` ends the
process with exit code 2 and one line ``error: ...`` on stderr; under Pipes the error is also logged to
Dagster and closes the session as a ``StepUserError`` carrying that line, which the launcher reads back from
the Pipes messages (defs/shared/step_failures.py), so that the orchestrating asset fails with the user's message instead of
"process failed with code 2" on every backend, a pod or an ECS task included. SIGTERM (Dagster's terminate, a
container's stop) or SIGINT stops the step cleanly (stops.py): its staging is removed, the line
``stopped: <stage> received SIGTERM; ...`` goes to stderr (and to Dagster's log under Pipes) and the process exits
with 128 + the signal (143, 130).

This module may import dagster_pipes but never dagster.
"""

from __future__ import annotations

import argparse
import datetime as dt
import faulthandler
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from basemodel_pipeline.config import PipelineConfig, load_config
from basemodel_pipeline.errors import StepUserError, UserError
from basemodel_pipeline.inference.options import EmbedOptions
from basemodel_pipeline.metadata import (
    FORWARDED_ENV_VAR,
    data_version_of,
    flatten_metadata,
    to_pipes_metadata,
)
from basemodel_pipeline.progress import LogProgress, Progress
from basemodel_pipeline.stops import Stopped, stopped_line, stopping_cleanly

USER_ERROR_EXIT_CODE = 2


@dataclass(frozen=True)
class EntrypointArgs:
    config: str
    scenario: str | None = None
    as_of: dt.date | None = None
    source: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # finetune: gates
    scoring: EmbedOptions | None = None  # predict and embed: their options (inference/options.py)


StageFn = Callable[[PipelineConfig, EntrypointArgs, Progress], Mapping[str, Any]]


# ---------------------------------------------------------------- sessions


def rank() -> int:
    """This process's rank under torchrun (0 when started alone)."""
    return int(os.environ.get("RANK", "0"))


def _in_pipes() -> bool:
    from dagster_pipes import PipesEnvVarParamsLoader

    return PipesEnvVarParamsLoader().is_dagster_pipes_process()


class _LocalSession:
    """Stand-in for the Pipes context when the entrypoint runs outside Dagster."""

    partition_key: str | None = None
    extras: Mapping[str, Any] = {}

    def info(self, message: str) -> None:
        print(message, flush=True)

    def error(self, message: str) -> None:
        pass  # the caller prints the one-line error on stderr

    def report(self, metadata: Mapping[str, Any], data_version: str) -> None:
        flat = {k: v for k, (_, v) in flatten_metadata(metadata).items()}
        print(json.dumps({"data_version": data_version, "metadata": flat}, indent=2, default=str), flush=True)


class _QuietSession(_LocalSession):
    """Ranks > 0 of a torchrun stage: they train but rank 0 alone logs and reports."""

    def info(self, message: str) -> None:
        pass

    def report(self, metadata: Mapping[str, Any], data_version: str) -> None:
        pass


class _PipesSession:
    def __init__(self, pipes: Any) -> None:
        self._pipes = pipes
        self.partition_key: str | None = pipes.partition_key if pipes.is_partition_step else None
        self.extras: Mapping[str, Any] = pipes.extras or {}

    def info(self, message: str) -> None:
        self._pipes.log.info(message)

    def error(self, message: str) -> None:
        self._pipes.log.error(message)

    def report(self, metadata: Mapping[str, Any], data_version: str) -> None:
        self._pipes.report_asset_materialization(
            metadata=to_pipes_metadata(metadata), data_version=data_version
        )


# ---------------------------------------------------------------- entrypoint


def parse_args(
    stage: str,
    argv: list[str] | None,
    *,
    scenario: bool,
    as_of: bool,
    source: bool,
    scoring: type[EmbedOptions] | None = None,
    gates: bool = False,
) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"python -m basemodel_pipeline.entrypoints.{stage}", description=__doc__
    )
    parser.add_argument("--config", required=True, help="path to the pipeline's YAML config")
    if scenario:
        parser.add_argument("--scenario", help="scenario name (default: the Dagster partition key)")
    if as_of:
        parser.add_argument("--as-of", dest="as_of", help="score entities as of this date (YYYY-MM-DD)")
    if source:
        parser.add_argument("--source", help="extract only this data source (default: all)")
    if scoring is not None:  # one flag per field of the options (their --as-of included)
        scoring.add_arguments(parser)
        parser.set_defaults(scoring_options=scoring)
    if gates:
        parser.add_argument(
            "--gates",
            help="JSON overrides of the config's quality_gates (metric_floor, popularity_margin...)",
        )
    return parser.parse_args(argv)


def _entrypoint_args(ns: argparse.Namespace, session: Any, needs_scenario: bool) -> EntrypointArgs:
    scenario = getattr(ns, "scenario", None) or session.partition_key
    if needs_scenario and not scenario:
        raise UserError("no scenario given: pass --scenario NAME (or run it as a scenario partition)")
    as_of = None
    raw = getattr(ns, "as_of", None)
    if raw:
        try:
            as_of = dt.date.fromisoformat(raw)
        except ValueError:
            raise UserError(f"--as-of: '{raw}' is not a date; write YYYY-MM-DD") from None
    options: dict[str, Any] = {}
    scoring = getattr(ns, "scoring_options", None)
    if getattr(ns, "gates", None):
        try:
            options["gates"] = dict(json.loads(ns.gates))
        except (ValueError, TypeError):
            raise UserError(
                f"--gates: {ns.gates!r} is not a JSON object of quality_gates overrides"
            ) from None
    source = getattr(ns, "source", None)
    return EntrypointArgs(
        ns.config, scenario, as_of, source, options, scoring.from_namespace(ns) if scoring else None
    )


def _run(session: Any, ns: argparse.Namespace, fn: StageFn, stage: str, needs_scenario: bool) -> None:
    try:
        args = _entrypoint_args(ns, session, needs_scenario)
        cfg = load_config(args.config)
        where = f", scenario {args.scenario}" if args.scenario else ""
        session.info(f"{stage}: config {args.config}{where}")
        meta = dict(fn(cfg, args, LogProgress(session.info)))
    except UserError as err:
        line = f"{stage}: {err}"
        session.error(line)
        raise StepUserError(line) from None
    except Stopped as stop:  # Dagster's terminate (SIGTERM), or Ctrl-C: the step's staging is removed by now
        session.error(stopped_line(stage, stop))
        raise
    version = data_version_of(meta)  # of the artifact, not of where the step ran
    session.report({**meta, "step": step_facts()}, version)


def step_facts() -> dict[str, Any]:
    """Where the step ran, for the materialization's metadata: its uid:gid, whether in a container, and the
    names of the forwarded variables it received (their values are never reported)."""
    names = [n for n in os.environ.get(FORWARDED_ENV_VAR, "").split(",") if n]
    return {
        "user": f"{os.getuid()}:{os.getgid()}",
        "in_container": Path("/.dockerenv").exists(),
        "forwarded_env": [n for n in names if os.environ.get(n)],
    }


def main(
    stage: str,
    fn: StageFn,
    argv: list[str] | None = None,
    *,
    scenario: bool = False,
    needs_scenario: bool = False,
    as_of: bool = False,
    source: bool = False,
    scoring: type[EmbedOptions] | None = None,
    gates: bool = False,
) -> None:
    """Run one stage as a Pipes entrypoint (or standalone); exits 2 with one line on stderr on a UserError.

    A crash in native code (a segmentation fault in a library) prints every thread's Python stack on stderr
    first (faulthandler): the launcher retries such a step once and points at that stack."""
    faulthandler.enable()
    ns = parse_args(stage, argv, scenario=scenario, as_of=as_of, source=source, scoring=scoring, gates=gates)
    with stopping_cleanly():
        try:
            _session_run(ns, fn, stage, needs_scenario)
        except StepUserError as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            sys.exit(USER_ERROR_EXIT_CODE)
        except UserError as err:
            print(f"error: {stage}: {err}", file=sys.stderr, flush=True)
            sys.exit(USER_ERROR_EXIT_CODE)
        except Stopped as stop:
            print(stopped_line(stage, stop), file=sys.stderr, flush=True)
            sys.exit(stop.exit_code)


def _session_run(ns: argparse.Namespace, fn: StageFn, stage: str, needs_scenario: bool) -> None:
    if rank() != 0:  # under torchrun only rank 0 speaks Pipes (one session, one materialization)
        _run(_QuietSession(), ns, fn, stage, needs_scenario)
    elif _in_pipes():
        from dagster_pipes import open_dagster_pipes

        with open_dagster_pipes() as pipes:
            _run(_PipesSession(pipes), ns, fn, stage, needs_scenario)
    else:
        _run(_LocalSession(), ns, fn, stage, needs_scenario)
