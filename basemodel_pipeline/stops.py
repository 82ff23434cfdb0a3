"""Clean stops: SIGTERM and SIGINT end a stage by unwinding it, so that it removes its own staging.

A stage (a `basemodel` command, a Pipes entrypoint) runs inside `stopping_cleanly()`. There the first SIGTERM or
SIGINT raises `Stopped` in the main thread, wherever it is: every ``finally`` block and context manager on the
way out runs, which is what removes staging directories, half-written part files, a cache build's DuckDB spill
and a checkpoint's staging; the resume state of pretraining and fine-tuning is kept, so the same command run
again resumes. The face then prints one line (`stopped_line`) and exits with 128 + the signal's number (143
for SIGTERM, 130 for SIGINT), what a shell or an orchestrator expects of a process ended by that signal.

`Stopped` derives from KeyboardInterrupt (a BaseException): ``except Exception`` in library or user code does
not swallow it, and code that already cleans up on Ctrl-C does the same on SIGTERM. Signals that arrive while
the stage unwinds are ignored, so an impatient second Ctrl-C or an orchestrator's repeated SIGTERM cannot cut the
cleanup short (SIGKILL still ends the process at once; the next run of the stage then removes what it left).
A stage's worker processes (`predict --workers`) are stopped with it: SIGTERM is passed on to them and each
unwinds its own job the same way.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import threading
from collections.abc import Iterator
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGINT)
RESUMABLE = ("pretrain", "finetune")  # stages whose rerun resumes from the state they saved


class Stopped(KeyboardInterrupt):
    """The process received SIGTERM or SIGINT while a stage ran: unwind, clean up, exit 128 + signum."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(self.signal_name)

    @property
    def signal_name(self) -> str:
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __reduce__(self) -> tuple[type, tuple[int]]:
        return type(self), (self.signum,)


def stopped_line(stage: str, stop: Stopped) -> str:
    """The one line a stopped stage prints, e.g. ``stopped: pretrain received SIGTERM; its staging is removed;
    run it again to resume``."""
    again = "run it again to resume" if stage.split()[0] in RESUMABLE else "run it again to redo it"
    return f"stopped: {stage} received {stop.signal_name}; its staging is removed; {again}"


@contextlib.contextmanager
def stopping_cleanly() -> Iterator[None]:
    """Within the block, the first SIGTERM or SIGINT raises Stopped in the main thread and later ones are
    ignored; the previous handlers are put back on exit. Outside the main thread (where Python cannot handle
    signals) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if received:
            return  # already unwinding: let the cleanup finish
        received.append(signum)
        end_children()
        raise Stopped(signum)

    previous = {s: signal.signal(s, on_signal) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            if handler is not None:  # None: installed from C, cannot be put back from Python
                signal.signal(s, handler)


def end_children() -> None:
    """Send SIGTERM to this process's multiprocessing children (a pool's workers, which run their jobs inside
    `stopping_cleanly` and ignore SIGINT: `in_worker`), so that they unwind now instead of finishing their
    work while the stage waits for them."""
    for child in multiprocessing.active_children():
        with contextlib.suppress(OSError, ValueError):
            child.terminate()


def in_worker() -> None:
    """Initialise a worker process of a stage: Ctrl-C, which the terminal sends to the whole process group, is
    left to the stage, which ends its workers itself (end_children); between jobs SIGTERM ends the worker."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
