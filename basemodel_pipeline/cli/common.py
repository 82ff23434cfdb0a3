"""What every `basemodel` command shares: the one Typer `app` the commands register on, the consoles, the
exit codes, the argument and option types, and the helpers that turn user errors into one red line and a stage's
metadata into a table."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from basemodel_pipeline.config import PipelineConfig, load_config
from basemodel_pipeline.errors import ArgumentError, UserError
from basemodel_pipeline.progress import Progress, rich_progress
from basemodel_pipeline.stops import Stopped, stopped_line, stopping_cleanly

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


def run_stage(
    title: str, config: Path, fn: Callable[[PipelineConfig, Progress], Mapping[str, Any]]
) -> Mapping[str, Any]:
    """Run a stage with progress bars, print its metadata as a table and return it. SIGTERM or SIGINT stops it
    cleanly: its staging is removed, one line says so and the exit code is 128 + the signal (stops.py)."""
    with stopping_cleanly():
        try:
            with user_errors():
                cfg = load_config(config)
                start = time.perf_counter()
                with rich_progress() as progress:
                    meta = fn(cfg, progress)
                out.print(metadata_table(f"{title} ({time.perf_counter() - start:.1f} s)", meta))
        except Stopped as stop:
            err.print(escape(stopped_line(title, stop)), soft_wrap=True, highlight=False)
            raise typer.Exit(stop.exit_code) from None
    return meta


def scenario_name(cfg: PipelineConfig, name: str) -> str:
    cfg.scenario(name)  # unknown -> ConfigError naming the known scenarios
    return name


def as_of_date(as_of: str | None) -> dt.date | None:
    if as_of is None:
        return None
    try:
        return dt.date.fromisoformat(as_of)
    except ValueError:
        fail(f"--as-of: '{as_of}' is not a date; write YYYY-MM-DD")
    return None
