"""Disk faults as one-line errors: a full volume (ENOSPC, EDQUOT) and a workspace that cannot be written
(EROFS, EACCES, EPERM). Every stage runs inside `disk_faults(workspace)` (pipeline.py); the writers
themselves discard their staging on any error, so nothing partial is left. DuckDB and safetensors report
these faults as their own exceptions: their messages are recognised too."""

from __future__ import annotations

import contextlib
import errno
import re
import shutil
from collections.abc import Callable, Iterator
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

from basemodel_pipeline.errors import UserError

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)
NO_SPACE_TEXT = ("no space left on device", "disk quota exceeded", "os error 28", "storagefull")
NOT_WRITABLE_TEXT = ("read-only file system", "os error 30")
QUOTED_PATH = re.compile(r"""["'](/[^"']+)["']""")

F = TypeVar("F", bound=Callable[..., Any])


class DiskFull(UserError):
    """The volume being written has no space left."""


class NotWritable(UserError):
    """The workspace (or a directory in it) cannot be written."""


def _shown(path: Path) -> Path:
    """The path to name: the nearest one that is not a hidden temporary (staging names mean nothing)."""
    while path.name.startswith(".") and path != path.parent:
        path = path.parent
    return path


def existing_ancestor(path: Path) -> Path:
    """`path`, or its nearest parent that exists (what disk_usage can be asked about)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _where(exc: BaseException, workspace: Path) -> Path:
    """The file the fault happened on when the exception says, else the workspace."""
    name = getattr(exc, "filename", None)
    if not name and (m := QUOTED_PATH.search(str(exc))):
        name = m.group(1)
    path = Path(name) if name else workspace
    return _shown(path if path.is_absolute() else workspace / path)


def _in_workspace(exc: BaseException, workspace: Path) -> bool:
    name = getattr(exc, "filename", None)
    if not name:
        return False
    return Path(name).resolve().is_relative_to(workspace.resolve())


def no_space(path: Path) -> DiskFull:
    free = shutil.disk_usage(existing_ancestor(path)).free
    return DiskFull(
        f"no space left on {path} ({free:,} bytes free on its volume): free space or move the workspace "
        "(`workspace:` in the config) to a larger volume, then run the stage again"
    )


def require_space(path: Path, needed: int, what: str) -> None:
    """Preflight of a writer whose size is known before it writes: fail in one line, before any byte, when
    the volume of `path` has less free space than `needed` bytes (plus 5% and 1 MiB of slack)."""
    free = shutil.disk_usage(existing_ancestor(path)).free
    if free < needed * 1.05 + (1 << 20):
        raise DiskFull(
            f"no space left on {_shown(existing_ancestor(path))} for {what}: it needs about {needed:,} bytes and "
            f"{free:,} are free on its volume; free space or move the workspace (`workspace:` in the config) "
            "to a larger volume, then run the stage again"
        )


def not_writable(path: Path, reason: str) -> NotWritable:
    directory = path if path.is_dir() else existing_ancestor(path.parent)
    return NotWritable(
        f"{directory} is not writable ({reason}): make it writable or point `workspace:` in the config at a "
        "writable directory"
    )


def translate(exc: BaseException, workspace: Path) -> UserError | None:
    """The one-line error for a disk fault, None for anything else."""
    text = str(exc).lower()
    code = exc.errno if isinstance(exc, OSError) else None
    if code in NO_SPACE or (code is None and any(t in text for t in NO_SPACE_TEXT)):
        return no_space(_where(exc, workspace))
    if code in (errno.EACCES, errno.EPERM) and not _in_workspace(exc, workspace):
        return None  # e.g. a source file the user may not read: not a fault of the workspace
    if code in NOT_WRITABLE or (code is None and any(t in text for t in NOT_WRITABLE_TEXT)):
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "read-only file system"
        return not_writable(_where(exc, workspace), reason.lower())
    return None


@contextlib.contextmanager
def disk_faults(workspace: Path) -> Iterator[None]:
    """Run the block; a full or unwritable disk leaves it as a one-line UserError."""
    try:
        yield
    except UserError as err:  # e.g. a source read that failed writing its output: the disk is the cause
        cause = err.__cause__
        error = translate(cause, Path(workspace)) if cause is not None else None
        if error is None:
            raise
        raise error from cause
    except Exception as exc:
        error = translate(exc, Path(workspace))
        if error is None:
            raise
        raise error from exc


def guarded(fn: F) -> F:
    """A stage `fn(cfg, ...)` run inside disk_faults(cfg.workspace)."""

    @wraps(fn)
    def run(cfg: Any, *args: Any, **kwargs: Any) -> Any:
        with disk_faults(Path(cfg.workspace)):
            return fn(cfg, *args, **kwargs)

    return run  # type: ignore[return-value]
