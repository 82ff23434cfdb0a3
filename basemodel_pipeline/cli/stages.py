"""The data and training stages: validate, extract, suggest-config, data-report, cache-info, cache, pretrain and
finetune, registered on the one `app` of basemodel_pipeline.cli.common."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from basemodel_pipeline import pipeline
from basemodel_pipeline.cli.common import (
    RUN_FAILED,
    ConfigArg,
    app,
    err,
    fail,
    metadata_table,
    out,
    run_stage,
    scenario_name,
    user_errors,
)
from basemodel_pipeline.config import PipelineConfig, load_config
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.progress import Progress


@app.command()
def validate(config: ConfigArg) -> None:
    """Check the config: YAML, fields, references, (when the data is readable) that it fits the data, and that
    each Python target's module imports."""
    with user_errors():
        cfg = load_config(config)
        try:
            from basemodel_pipeline.sources.data_checks import check_config_against_data
        except ImportError:
            check_config_against_data = None
        if check_config_against_data is not None:
            check_config_against_data(cfg, config)
        for sc in cfg.scenarios:  # a python target's module imports (within target.timeout_s)
            if sc.target.kind == "python":
                from basemodel_pipeline.targets.python import load_function

                load_function(sc)
    table = Table(title=f"{config}: OK", title_justify="left")
    for col in ("kind", "name", "details"):
        table.add_column(col)
    for src in cfg.data_sources:
        table.add_row(f"source ({src.type})", src.name, escape(src.data_location.display()))
    for sc in cfg.scenarios:
        table.add_row(f"scenario ({sc.task})", sc.name, f"horizon {sc.target.horizon_days} d")
    out.print(table)


@app.command()
def extract(
    config: ConfigArg,
    source: Annotated[str | None, typer.Option("--source", help="Only this data source.")] = None,
    start: Annotated[
        str | None, typer.Option("--from", help="First event day to re-extract, YYYY-MM-DD.")
    ] = None,
    end: Annotated[
        str | None, typer.Option("--to", help="Day after the last one to re-extract (exclusive).")
    ] = None,
) -> None:
    """Extract data sources into <workspace>/extracts/ (all event days, or only [--from, --to))."""
    if (start is None) != (end is None):
        fail("--from and --to go together: the day range [--from, --to) to re-extract")
    days = (_date("--from", start), _date("--to", end)) if start and end else None

    def stage(cfg: PipelineConfig, p: Progress) -> Mapping[str, Any]:
        names = [s.name for s in cfg.data_sources]
        if source is not None and source not in names:
            from basemodel_pipeline.errors import ConfigError

            raise ConfigError(
                f"--source: unknown data source '{source}'; the config defines: {', '.join(names)}"
            )
        return pipeline.run_extract(cfg, source, progress=p, days=days)  # type: ignore[arg-type]

    run_stage("extract", config, stage)


def _date(option: str, value: str) -> dt.date:
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        fail(f"{option}: '{value}' is not a date; write YYYY-MM-DD")
    raise AssertionError("unreachable")


@app.command("suggest-config")
def suggest_config(
    config: ConfigArg,
    out_path: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Where to write it (default: suggested_config.yaml beside CONFIG)."),
    ] = None,
    rows: Annotated[int, typer.Option("--rows", help="Rows sampled per source.")] = 200_000,
) -> None:
    """Inspect the sources: infer column types, flag ID-like, constant, leakage-like and time-series columns,
    check that join keys match, and write a suggested config."""
    from basemodel_pipeline.sources.suggest import suggest_config as suggest

    target = out_path or config.parent / "suggested_config.yaml"
    run_stage("suggest-config", config, lambda cfg, p: suggest(cfg, config, target, rows))


@app.command("data-report")
def data_report(config: ConfigArg) -> None:
    """Measured data volume per event source (entities, events per month, history) against the guidelines."""
    from basemodel_pipeline.sources.volume import volume_report

    with user_errors():
        report = volume_report(load_config(config))
    table = Table(title="Data volume (from the extracts)", title_justify="left")
    for col in ("source", "main entities", "events/month", "months", "interactions", "guidelines"):
        table.add_column(col, justify="left" if col in ("source", "interactions", "guidelines") else "right")
    for name, r in report.items():
        missed = [k for k, ok in r["checks"].items() if not ok]
        verdict = (
            "[green]met[/green]"
            if not missed
            else "[yellow]below: " + escape("; ".join(missed)) + "[/yellow]"
        )
        table.add_row(
            name,
            f"{r['main_entities']:,}",
            f"{r['events_per_month']:,}",
            f"{r['months_of_history']:.1f}",
            r["interactions"],
            verdict,
        )
    out.print(table)


@app.command("cache-info")
def cache_info(config: ConfigArg) -> None:
    """Sizing report of the cache: bytes vs source bytes, entities, events, dates, recommended working volume."""
    from basemodel_pipeline.cache.sizing import cache_sizing

    with user_errors():
        info = cache_sizing(load_config(config))
    gib = {k: f"{v / 2**30:.3f} GiB ({v:,} B)" for k, v in info.items() if k.endswith("_bytes")}
    out.print(metadata_table("cache-info", {**info, **gib}))


@app.command()
def cache(config: ConfigArg) -> None:
    """Build (or reuse) the event cache from the extracts."""
    run_stage("cache", config, lambda cfg, p: pipeline.run_cache(cfg, progress=p))


def _fail_rejected(verdicts: Mapping[str, Mapping[str, Any]], config: Path) -> None:
    """Exit 1 with one line per version its quality gates rejected (what still serves, how to override)."""
    rejected = {name: m for name, m in verdicts.items() if m.get("promoted") is False}
    for name, m in rejected.items():
        flag = f" --scenario {name}" if name != "foundation" else ""
        err.print(
            f"[bold red]rejected:[/bold red] {escape(name)} version {m.get('version')} failed its quality gates "
            f"({escape(str(m.get('rejected_by')))}); still serving {m.get('serving_version') or 'nothing'}. "
            f"`basemodel promote {escape(str(config))}{flag} --version {m.get('version')} --force` serves it anyway",
            soft_wrap=True,
            highlight=False,
        )
    if rejected:
        raise typer.Exit(RUN_FAILED)


@app.command()
def pretrain(config: ConfigArg) -> None:
    """Train the foundation model on the cache; it is served once its checksums and losses pass their gates."""
    meta = run_stage("pretrain", config, lambda cfg, p: pipeline.run_pretrain(cfg, progress=p))
    _fail_rejected({"foundation": meta}, config)


@app.command()
def finetune(
    config: ConfigArg,
    scenario: Annotated[
        list[str] | None,
        typer.Option("--scenario", "-s", help="Scenario name from the config; repeat it for several."),
    ] = None,
    all_scenarios: Annotated[bool, typer.Option("--all", help="Every scenario in the config.")] = False,
) -> None:
    """Fine-tune scenarios from the foundation checkpoint and evaluate them against the baselines.

    Several scenarios (`-s a -s b` or `--all`) share one featurisation pass; each stops on its own metric.
    A new version is served only when it passes the config's quality_gates; a rejected one stays on disk and
    the command exits with code 1."""
    with user_errors():
        names = [s.name for s in load_config(config).scenarios] if all_scenarios else list(scenario or [])
        if not names:
            raise UserError("name a scenario with --scenario NAME (repeatable) or use --all")
    meta = run_stage(
        f"finetune {', '.join(names)}",
        config,
        lambda cfg, p: pipeline.run_finetune_many(cfg, [scenario_name(cfg, n) for n in names], progress=p),
    )
    _fail_rejected({names[0]: meta} if len(names) == 1 else meta, config)


@app.command()
def promote(
    config: ConfigArg,
    scenario: Annotated[
        str | None, typer.Option("--scenario", "-s", help="Scenario name (default: the foundation).")
    ] = None,
    version: Annotated[
        str | None, typer.Option("--version", help="Version to serve (default: the newest).")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Serve it even though a quality gate fails (recorded).")
    ] = False,
    list_only: Annotated[
        bool,
        typer.Option("--list", help="Only list the versions: served, promoted earlier, rejected and why."),
    ] = False,
) -> None:
    """Serve a checkpoint version by hand, or roll back to an earlier one, after its quality gates run again.

    `--list` shows every version with its status and, for a rejected one, the gates it failed."""
    what = f"scenario {scenario}" if scenario else "foundation"
    with user_errors():
        cfg = load_config(config)
        if list_only:
            table = Table(title=f"{what} versions", title_justify="left")
            for col in ("version", "status", "detail"):
                table.add_column(col, overflow="fold")
            for row in pipeline.list_versions(cfg, scenario):
                table.add_row(row["version"], row["status"], escape(row["detail"]))
            out.print(table)
            return
        meta = pipeline.run_promote(cfg, scenario, version, force)
    out.print(metadata_table(f"promote {what}", meta))
    out.print(f"{what}: now serving {meta['version']} (before: {meta['previous'] or 'nothing'})")
