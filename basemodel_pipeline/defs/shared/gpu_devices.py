"""Distinct GPUs for concurrent docker steps on one host.

Docker's ``device_requests`` with a count gives every container the *first* N GPUs, so two one-GPU steps
running at once would share GPU 0 while the others idle. Instead each step reserves device ids: one lock
file per GPU (``<workspace>/.gpu-locks/gpu<ID>.lock``, held with ``flock`` for as long as the step's
container runs) in the workspace that every run worker of the host mounts. A one-GPU step takes the first
free device; a data-parallel step (pretraining) takes all of them. A step that finds none free waits,
saying so in its log; a lock dies with the process that held it, so a killed run worker frees its GPU.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

POLL_S = 2.0


def _release(held: list[tuple[str, int]]) -> None:
    for _, fd in held:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _try(lock_dir: Path, devices: Sequence[str], count: int) -> list[tuple[str, int]]:
    """Locks on the first `count` free devices, or none at all."""
    held: list[tuple[str, int]] = []
    for device in devices:
        fd = os.open(lock_dir / f"gpu{device}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        held.append((device, fd))
        if len(held) == count:
            return held
    _release(held)
    return []


@contextmanager
def reserve_devices(
    lock_dir: Path,
    devices: Sequence[str],
    count: int,
    log: Callable[[str], None] | None = None,
    poll_s: float = POLL_S,
) -> Iterator[list[str]]:
    """Hold `count` of `devices` (ids as Docker's ``device_ids`` take them) until the block ends."""
    if count > len(devices):
        raise ValueError(f"{count} GPUs asked for, but only {len(devices)} configured ({', '.join(devices)})")
    lock_dir.mkdir(parents=True, exist_ok=True)
    waited_since = None
    while True:
        held = _try(lock_dir, devices, count)
        if held:
            break
        if waited_since is None:
            waited_since = time.monotonic()
            if log:
                log(f"waiting for {count} free GPU(s) of {', '.join(devices)} (held by other steps)")
        time.sleep(poll_s)
    if log and waited_since is not None:
        log(f"GPU(s) free after {time.monotonic() - waited_since:.0f} s")
    try:
        yield [device for device, _ in held]
    finally:
        _release(held)
