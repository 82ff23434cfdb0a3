"""Progress reporting without a UI dependency: the CLI plugs in rich bars, Pipes jobs plug in log lines."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Progress(Protocol):
    def start(self, task: str, total: int | None) -> None: ...

    def advance(self, task: str, amount: int = 1, **metrics: float) -> None: ...

    def log(self, message: str) -> None: ...


class NullProgress:
    """Default: report nothing."""

    def start(self, task: str, total: int | None) -> None:
        pass

    def advance(self, task: str, amount: int = 1, **metrics: float) -> None:
        pass

    def log(self, message: str) -> None:
        pass


class LogProgress:
    """Log a line every `every` percent of a task (used by the Dagster Pipes entrypoints)."""

    def __init__(self, log_fn, every: float = 10.0) -> None:
        self._log = log_fn
        self._every = every
        self._state: dict[str, tuple[int, int | None, float]] = {}

    def start(self, task: str, total: int | None) -> None:
        self._state[task] = (0, total, 0.0)
        self._log(f"{task}: started" + (f" ({total} steps)" if total else ""))

    def advance(self, task: str, amount: int = 1, **metrics: float) -> None:
        done, total, last = self._state.get(task, (0, None, 0.0))
        done += amount
        pct = 100.0 * done / total if total else 0.0
        if total and (pct - last >= self._every or done >= total):
            extra = " ".join(f"{k}={v:.4g}" for k, v in metrics.items())
            self._log(f"{task}: {done}/{total} ({pct:.0f}%) {extra}".rstrip())
            last = pct
        self._state[task] = (done, total, last)

    def log(self, message: str) -> None:
        self._log(message)


@contextmanager
def rich_progress() -> Iterator[Progress]:
    """Rich progress bars for the CLI."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress

    console = Console(stderr=True)
    bars = RichProgress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[metrics]}"),
        console=console,
    )

    class _Adapter:
        def __init__(self) -> None:
            self.ids: dict[str, int] = {}

        def start(self, task: str, total: int | None) -> None:
            self.ids[task] = bars.add_task(task, total=total, metrics="")

        def advance(self, task: str, amount: int = 1, **metrics: float) -> None:
            if task not in self.ids:
                self.start(task, None)
            text = " ".join(f"{k}={v:.4g}" for k, v in metrics.items())
            bars.update(self.ids[task], advance=amount, metrics=text)

        def log(self, message: str) -> None:
            bars.console.print(message)

    with bars:
        yield _Adapter()
