"""Locks between processes: an flock the kernel releases when its holder dies, so a killed run never leaves
a stale lock, and the writer lock of a training stage on its checkpoint root."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from basemodel_pipeline.errors import UserError


@contextlib.contextmanager
def exclusive_lock(
    path: Path, what: str, timeout_s: float | None, log: Callable[[str], None], poll_s: float = 0.2
) -> Iterator[None]:
    """Run the block holding an flock on `path` (created when missing) that excludes every other process.
    The kernel releases it when its holder dies, so a killed run never leaves a stale lock. When another
    process holds it: log once and wait up to `timeout_s` seconds (None: for ever; 0: not at all), then
    raise a one-line UserError "another <what> is running (pid N)". The holder's pid is written into the
    lock file and cleared when the block ends, so a pid found there on taking the lock is a holder that died
    (killed or crashed): that is logged, and whatever it left (a resume state) is then this run's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    except IsADirectoryError:
        raise UserError(
            f"{path} is a directory, not the lock file it should be: remove it (the pipeline keeps nothing "
            "there) and run again"
        ) from None
    held = False
    try:
        if not _try_flock(fd):
            busy = f"another {what} is running (pid {_holder(fd)})"
            if timeout_s is not None and timeout_s <= 0:
                raise UserError(f"{busy}; try again when it has finished")
            log(f"{busy}; waiting" + (f" up to {timeout_s:g} s" if timeout_s is not None else "") + " for it")
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while not _try_flock(fd):
                if deadline is not None and time.monotonic() > deadline:
                    raise UserError(
                        f"{busy}; gave up after waiting {timeout_s:g} s, try again when it has finished"
                    )
                time.sleep(poll_s)
        held = True
        previous = _holder(fd)
        if previous != "unknown":
            log(f"{what}: taking over the lock of pid {previous}, which ended without releasing it")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        if held:
            os.ftruncate(fd, 0)  # a clean end: the next holder finds no pid
        os.close(fd)  # releases the lock


TRAIN_LOCK = ".train.lock"  # in a checkpoint root: one pretrain, or one fine-tuning of a scenario, at a time


def training_lock(
    root: Path, what: str, log: Callable[[str], None]
) -> contextlib.AbstractContextManager[None]:
    """The writer lock of a training stage (pretrain, a scenario's finetune) on its checkpoint root: a second
    run fails at once with one line naming the holder, instead of sharing the first one's resume state."""
    return exclusive_lock(root / TRAIN_LOCK, what, 0, log)


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _holder(fd: int) -> str:
    """The pid recorded in a lock file by its holder ("unknown" before it has written one)."""
    return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
