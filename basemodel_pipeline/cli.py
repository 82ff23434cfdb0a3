"""`basemodel`: the pipeline's stages from a terminal, over the same library functions Dagster runs.

    basemodel validate CONFIG                check the YAML and that it fits the data
    basemodel suggest-config CONFIG          profile the sources, write suggested_config.yaml
    basemodel data-report CONFIG             data volume per event source vs the guidelines
    basemodel cache-info CONFIG              cache sizing and the recommended working volume
    basemodel extract|cache|pretrain CONFIG  run one stage
    basemodel extract CONFIG --from D1 --to D2   re-extract event days [D1, D2) only
    basemodel finetune CONFIG --scenario NAME
    basemodel predict CONFIG --scenario NAME [--as-of YYYY-MM-DD]
    basemodel embed CONFIG [--as-of YYYY-MM-DD]   float16 foundation embeddings per entity
    basemodel explain CONFIG --scenario NAME [--entity ID] [--population N] [--class LABEL]
    basemodel demo [--workspace demo_workspace]   The Complete Journey end to end through Dagster
    basemodel prune --config CONFIG [--dry-run]  delete old checkpoints/predictions/embeddings (retention)
    basemodel verify CONFIG                  check the cache and checkpoints against their checksums

A mistake the user can fix prints one red line `error: ...` on stderr and exits with code 2.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from basemodel_pipeline import pipeline
from basemodel_pipeline.config import PipelineConfig, load_config
from basemodel_pipeline.errors import ArgumentError, UserError
from basemodel_pipeline.progress import Progress, rich_progress

USER_ERROR = 2
RUN_FAILED = 1

app = typer.Typer(
    name="basemodel",
    help="Behavioral foundation models and scenario models from event data.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)

ConfigArg = Annotated[Path, typer.Argument(help="Path to the pipeline's YAML config.", show_default=False)]
AsOfOpt = Annotated[
    str | None, typer.Option("--as-of", help="As of this date, YYYY-MM-DD (default: the day after the data).")
]
ScenarioOpt = Annotated[str, typer.Option("--scenario", "-s", help="Scenario name from the config.")]


def fail(message: str, code: int = USER_ERROR) -> None:
    """Print one red line on stderr and exit."""
    line = " ".join(str(message).split())
    err.print(f"[bold red]error:[/bold red] {escape(line)}", soft_wrap=True, highlight=False)
    raise typer.Exit(code)


# The library names its arguments (ArgumentError); the CLI speaks of its flags. Any other argument's flag is
# its name with dashes (as_of -> --as-of).
FLAGS = {"destination": "--output", "label": "--class", "entity_id": "--entity"}


def flag(argument: str) -> str:
    return FLAGS.get(argument, "--" + argument.replace("_", "-"))


@contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except ArgumentError as exc:
        fail(exc.named(flag(exc.argument)))
    except UserError as exc:
        fail(str(exc))


def metadata_table(title: str, meta: Mapping[str, Any]) -> Table:
    from basemodel_pipeline.metadata import flatten_metadata

    table = Table(title=title, title_justify="left")
    table.add_column("field", style="cyan")
    table.add_column("value", overflow="fold")
    for key, (_, value) in flatten_metadata(meta).items():
        text = (
            f"{value:.4g}"
            if isinstance(value, float)
            else json.dumps(value)
            if isinstance(value, list)
            else value
        )
        table.add_row(key, escape(str(text)))
    return table


def run_stage(title: str, config: Path, fn: Callable[[PipelineConfig, Progress], Mapping[str, Any]]) -> None:
    with user_errors():
        cfg = load_config(config)
        start = time.perf_counter()
        with rich_progress() as progress:
            meta = fn(cfg, progress)
        out.print(metadata_table(f"{title} ({time.perf_counter() - start:.1f} s)", meta))


@app.command()
def validate(config: ConfigArg) -> None:
    """Check the config: YAML, fields, references, and (when the data is readable) that it fits the data."""
    with user_errors():
        cfg = load_config(config)
        try:
            from basemodel_pipeline.sources.data_checks import check_config_against_data
        except ImportError:
            check_config_against_data = None
        if check_config_against_data is not None:
            check_config_against_data(cfg, config)
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


@app.command()
def pretrain(config: ConfigArg) -> None:
    """Train the foundation model on the cache."""
    run_stage("pretrain", config, lambda cfg, p: pipeline.run_pretrain(cfg, progress=p))


def _scenario(cfg: PipelineConfig, name: str) -> str:
    cfg.scenario(name)  # unknown -> ConfigError naming the known scenarios
    return name


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

    Several scenarios (`-s a -s b` or `--all`) share one featurisation pass; each stops on its own metric."""
    with user_errors():
        names = [s.name for s in load_config(config).scenarios] if all_scenarios else list(scenario or [])
        if not names:
            raise UserError("name a scenario with --scenario NAME (repeatable) or use --all")
    run_stage(
        f"finetune {', '.join(names)}",
        config,
        lambda cfg, p: pipeline.run_finetune_many(cfg, [_scenario(cfg, n) for n in names], progress=p),
    )


@app.command()
def predict(
    config: ConfigArg,
    scenario: ScenarioOpt,
    as_of: AsOfOpt = None,
    entities: Annotated[
        Path | None,
        typer.Option(
            "--entities",
            help="Score only these ids: a text file (one per line), or CSV/Parquet with an entity_id column. "
            "Written as a subset beside the full table, which stays as it is.",
        ),
    ] = None,
    subset: Annotated[
        str | None,
        typer.Option(
            "--subset", help="Name of the --entities output (default: the file's name without suffix)."
        ),
    ] = None,
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="Destination name from the config's outputs section.")
    ] = None,
    precision: Annotated[
        str, typer.Option("--precision", help="auto | fp32 | bf16 | int8 (int8: CPU dynamic quantization).")
    ] = "auto",
    device: Annotated[str, typer.Option("--device", help="cpu | cuda | auto.")] = "cpu",
    top_k: Annotated[
        int | None, typer.Option("--top-k", help="Recommendations / multilabel: k best.")
    ] = None,
    threshold: Annotated[
        float | None, typer.Option("--threshold", help="Multilabel: keep labels scoring at least this.")
    ] = None,
    shard: Annotated[
        str | None, typer.Option("--shard", help="I/K: score the I-th of K slices into a part file.")
    ] = None,
    merge_shards: Annotated[
        int | None, typer.Option("--merge-shards", help="K: write the K part files to the output.")
    ] = None,
    workers: Annotated[
        int | None, typer.Option("--workers", help="K local processes, one shard each, then merge.")
    ] = None,
    replay: Annotated[
        bool, typer.Option("--replay", help="Recompute features from the history even as of the latest date.")
    ] = False,
) -> None:
    """Score every entity (or --entities) for one scenario and write the table to the output."""
    date = _as_of(as_of)
    options: dict[str, Any] = {
        "top_k": top_k, "threshold": threshold, "precision": precision, "device": device,
        "destination": output, "replay": replay,
    }  # fmt: skip

    def stage(cfg: PipelineConfig, p: Progress) -> Mapping[str, Any]:
        from basemodel_pipeline.inference.predict import read_entity_ids
        from basemodel_pipeline.inference.shards import ScoringPlan, parse_shard

        plan = ScoringPlan(workers or 1, parse_shard(shard) if shard else None, merge_shards)
        if entities is not None:
            options["entities"] = read_entity_ids(entities)
            options["subset"] = subset or entities.stem
        elif subset is not None:
            options["subset"] = subset
        return pipeline.run_predict(cfg, _scenario(cfg, scenario), date, plan, progress=p, **options)

    run_stage(f"predict {scenario}", config, stage)


@app.command()
def embed(
    config: ConfigArg,
    as_of: AsOfOpt = None,
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="Destination name from the config's outputs section.")
    ] = None,
    precision: Annotated[str, typer.Option("--precision", help="auto | fp32 | bf16 | int8.")] = "auto",
    device: Annotated[str, typer.Option("--device", help="cpu | cuda | auto.")] = "cpu",
    replay: Annotated[
        bool, typer.Option("--replay", help="Recompute features from the history even as of the latest date.")
    ] = False,
) -> None:
    """Export float16 foundation embeddings of every entity (Parquet + client_ids.npy/embeddings.npy)."""
    date = _as_of(as_of)
    options = {"destination": output, "precision": precision, "device": device, "replay": replay}
    run_stage("embed", config, lambda cfg, p: pipeline.run_embed(cfg, date, progress=p, **options))


@app.command()
def explain(
    config: ConfigArg,
    scenario: ScenarioOpt,
    entity: Annotated[str | None, typer.Option("--entity", help="Explain this entity id.")] = None,
    as_of: AsOfOpt = None,
    population: Annotated[
        int,
        typer.Option("--population", help="Without --entity: mean |attribution| over N sampled entities."),
    ] = 2000,
    label: Annotated[
        str | None,
        typer.Option("--class", help="Multiclass/multilabel: explain this class (default: the top one)."),
    ] = None,
    baseline: Annotated[
        str, typer.Option("--baseline", help="mean (the training mean) | empty (the entity with no events).")
    ] = "mean",
    steps: Annotated[int, typer.Option("--steps", help="Integrated-gradients quadrature steps.", min=2)] = 32,
) -> None:
    """Integrated-gradients attributions of a scenario's output per source, column and value (docs/explain.md)."""
    from basemodel_pipeline.reports.explanations import run_explain

    date = _as_of(as_of)
    with user_errors():
        cfg = load_config(config)
        start = time.perf_counter()
        result = run_explain(cfg, cfg.scenario(scenario), entity, date, population, label, steps, baseline)
    out.print(explanation_table(result, time.perf_counter() - start))


def explanation_table(result: Mapping[str, Any], seconds: float, top: int = 15) -> Table:
    """The top sources, columns and values of an explanation, and where the JSON and plot went."""
    single = "entity_id" in result
    key = "attribution" if single else "mean_abs_attribution"
    who = f"entity {result['entity_id']}" if single else f"{result['entities']} entities (mean |attribution|)"
    value = result["output"]["value" if single else "mean_value"]
    table = Table(
        title=f"explain {result['scenario']} as of {result['as_of']}: {who} ({seconds:.1f} s)",
        caption=f"{result['output']['description']}: {value:.4g}; baseline {result['baseline']['kind']} "
        f"{result['baseline']['output']:.4g}; JSON {result['json_path']}; plot {result['plot_path']}",
        title_justify="left",
        caption_justify="left",
    )
    for col in ("level", "source", "column", "value", key):
        table.add_column(col, justify="right" if col == key else "left")
    for level in ("sources", "columns", "values"):
        for row in result[level][:top]:
            table.add_row(
                level[:-1],
                escape(str(row.get("source", ""))),
                escape(str(row.get("column", ""))),
                escape(str(row.get("value", ""))),
                f"{row[key]:+.4f}" if single else f"{row[key]:.4f}",
            )
    return table


@app.command()
def prune(
    config_arg: Annotated[
        Path | None, typer.Argument(help="Path to the YAML config.", show_default=False)
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Path to the YAML config.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list what would be deleted.")] = False,
) -> None:
    """Delete checkpoints, predictions and embeddings beyond the config's `retention` policy (docs/orchestration.md).

    Keeps the newest versions of each and everything still in use (LATEST, a version being published, the
    checkpoints kept scenarios and outputs were made from)."""
    from basemodel_pipeline.retention import prune as prune_workspace

    path = config or config_arg
    if path is None:
        fail("name the config: basemodel prune --config PATH [--dry-run]")
    with user_errors():
        cfg = load_config(path)  # type: ignore[arg-type]
        plan = prune_workspace(cfg, dry_run=dry_run)
    verb = "would delete" if dry_run else "deleted"
    for e in plan.entries:  # what goes, and what stays beyond the newest N because it is in use
        if not e.keep or not e.reason.startswith(("one of the newest", "retention keeps all")):
            action = f"[red]{verb}[/red]" if not e.keep else "[green]keep[/green]"
            out.print(
                f"{action}  {escape(e.label)}  {e.bytes / 2**20:.2f} MiB  ({escape(e.reason)})",
                soft_wrap=True,
                highlight=False,
            )
    prefix = "dry run: " if dry_run else ""
    out.print(
        f"{prefix}{verb} {len(plan.delete)} directories, {plan.bytes_freed / 2**20:.2f} MiB "
        f"({plan.bytes_freed:,} bytes); kept {len(plan.keep)}"
    )


@app.command()
def verify(config: ConfigArg) -> None:
    """Check the workspace's cache, checkpoints, per-entity states and predictions against the checksums
    recorded when they were written, and states and predictions against the current cache.

    One line per artifact (ok / FAILED and what to do / stale: built from older cache content / absent);
    exit code 1 when one is damaged (stale ones are not damaged)."""
    from basemodel_pipeline.verify import verify_workspace

    with user_errors():
        findings = verify_workspace(load_config(config))
    colour = {"ok": "green", "FAILED": "bold red", "stale": "yellow", "absent": "yellow"}
    for f in findings:
        line = escape(" ".join(f"{f.kind} {f.label}: {f.detail}".split()))
        out.print(f"[{colour[f.status]}]{f.status}[/]  {line}", soft_wrap=True, highlight=False)
    if any(f.status == "FAILED" for f in findings):
        raise typer.Exit(RUN_FAILED)


def _as_of(as_of: str | None) -> dt.date | None:
    if as_of is None:
        return None
    try:
        return dt.date.fromisoformat(as_of)
    except ValueError:
        fail(f"--as-of: '{as_of}' is not a date; write YYYY-MM-DD")
    return None


def summary_table(summary_file: Path) -> Table:
    scenarios = json.loads(summary_file.read_text()).get("scenarios", {})
    table = Table(title=f"Test metrics ({summary_file})", title_justify="left")
    numbers = ("model", "neural", "lightgbm_aggregates", "repeat_purchases", "popularity")
    for col in ("scenario", "metric", "published", *numbers):
        table.add_column(col, justify="right" if col in numbers else "left")
    for name, row in scenarios.items():
        cells = [row.get(k) for k in numbers]
        table.add_row(
            name,
            str(row.get("metric")),
            str(row.get("published", "")),
            *(f"{c:.4f}" if isinstance(c, float) else "-" for c in cells),
        )
    return table


@app.command()
def demo(
    workspace: Annotated[
        Path, typer.Option("--workspace", "-w", help="Directory for data and artifacts.")
    ] = Path("demo_workspace"),
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="Every scenario of the data set's full config (The Complete Journey: six, default two; much "
            "longer: manufacturer (5,288 labels) and next-basket (68k products) dominate).",
        ),
    ] = False,
    dataset: Annotated[
        str,
        typer.Option(
            "--dataset",
            "-d",
            help="completejourney (grocery baskets, default) or nycflights13 (departures of NYC aircraft, 2013).",
        ),
    ] = "completejourney",
) -> None:
    """A demo data set end to end: materialize every asset through Dagster, then show the test metrics.

    Runs land in <workspace>/dagster_home, so `make ui` shows them afterwards.
    """
    from basemodel_pipeline.defs.materialize import RunFailed, demo_instance, materialize_all
    from basemodel_pipeline.demo import prepare_demo

    start = time.perf_counter()
    with user_errors():
        config = prepare_demo(workspace, full=full, dataset=dataset)
        load_config(config)
    out.print(f"[bold]demo[/bold]: config {config}")
    instance = demo_instance(workspace)
    try:
        report = materialize_all(
            config, instance, on_run=lambda label: out.print(f"[bold]run[/bold]: {label}")
        )
    except RunFailed as exc:
        fail(str(exc), RUN_FAILED)
    finally:
        instance.dispose()

    times = Table(title="Wall time per step", title_justify="left")
    times.add_column("step")
    times.add_column("seconds", justify="right")
    for step, seconds in report.step_seconds.items():
        times.add_row(escape(step), f"{seconds:.1f}")
    times.add_row("[bold]total[/bold]", f"{time.perf_counter() - start:.1f}")
    out.print(times)
    out.print(summary_table(Path(workspace).resolve() / "reports" / "summary.json"))
    out.print(
        f"Dagster instance: {Path(workspace).resolve() / 'dagster_home'} (`make ui` to browse the runs)"
    )


def main() -> None:
    """Console entry point (`basemodel`)."""
    try:
        app()
    except UserError as exc:  # defensive: every command already maps UserError to exit code 2
        err.print(f"[bold red]error:[/bold red] {escape(' '.join(str(exc).split()))}", soft_wrap=True)
        sys.exit(USER_ERROR)


if __name__ == "__main__":
    main()
