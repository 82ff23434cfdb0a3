"""Versions of the event cache: every build, append or compaction publishes a new immutable directory and
switches one symlink to it; readers keep the version they opened; a version is deleted once it is neither
current nor held by a reader.

    cache/<fingerprint>                    symlink to <fingerprint>.versions/<version> (relative)
    cache/<fingerprint>.versions/<version>/  one version: the layout of build.py, plus READERS_LOCK
    cache/<fingerprint>.lock               the writer lock (build.py cache_lock)

A reader (EventCache) holds a shared flock on its version's READERS_LOCK for as long as it uses the cache
(until close() or the process ends: the kernel drops the lock of a dead process, SIGKILL included). The
writer never waits for readers: it publishes beside them, then deletes every other version whose lock it
can take exclusively without waiting (sweep). An append hard-links the unchanged files of the current
version into the new one, so it costs the new segment and one directory entry per file, not a copy.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from basemodel_pipeline import files as fs
from basemodel_pipeline.errors import UserError

READERS_LOCK = ".readers.lock"
OPEN_ATTEMPTS = 50  # pointer switches survived while opening before giving up


def versions_dir(final: Path) -> Path:
    """Directory of the versions behind the cache pointer `final` (cache/<fingerprint>)."""
    return final.parent / f"{final.name}.versions"


def writer_lock_path(final: Path) -> Path:
    return final.parent / f"{final.name}.lock"


def _lock_fd(version: Path) -> int:
    """An open descriptor of the version's reader lock file (created when missing)."""
    lock = version / READERS_LOCK
    try:
        return os.open(lock, os.O_RDONLY | os.O_CREAT, 0o644)
    except PermissionError:  # a read-only cache directory: the file may still exist
        return os.open(lock, os.O_RDONLY)


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def open_version(path: Path) -> tuple[Path, int | None]:
    """The version directory `path` names now and a descriptor holding a shared lock on it (None when no
    lock can be taken: a read-only cache, or no cache at all; the caller checks for the manifest)."""
    for attempt in range(OPEN_ATTEMPTS):
        version = path.resolve()
        if not (version / "manifest.json").is_file():
            if attempt < OPEN_ATTEMPTS - 1 and versions_dir(path).is_dir() and not path.is_symlink():
                time.sleep(0.01)  # maybe a cache written before versions being turned into one
                continue
            return version, None
        try:
            fd = _lock_fd(version)
        except FileNotFoundError:  # swept since it was resolved
            continue
        except OSError:
            return version, None  # read-only and never locked: nothing to hold
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while a sweep deletes this very version
        if _same_file(fd, version / READERS_LOCK) and (version / "manifest.json").is_file():
            return version, fd
        os.close(fd)  # deleted or moved while we waited: open the current version instead
    raise UserError(f"the event cache at {path} kept changing while it was opened; open it again")


def release(fd: int | None, final: Path, pid: int) -> None:
    """Drop a reader's lock (in the process that took it), then delete the versions nobody uses any more
    unless a writer is running (it sweeps when it finishes)."""
    if fd is None or os.getpid() != pid:
        return
    os.close(fd)
    if not final.is_symlink():
        return
    with contextlib.suppress(OSError), try_writer_lock(final) as locked:
        if locked:
            sweep(final)


@contextlib.contextmanager
def try_writer_lock(final: Path) -> Iterator[bool]:
    """The writer lock of `final` if it is free now (True), else nothing (False); never waits."""
    with open(writer_lock_path(final), "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def in_use(version: Path) -> bool:
    """Whether a reader holds `version` now."""
    fd = _lock_fd(version)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def link_files(source: Path, files: dict[str, Any], out: Path) -> None:
    """Hard-link every file of a version's manifest into the staging directory `out` (a copy where the
    filesystem has no hard links). Published files are never written again, so versions can share them."""
    for rel in files:
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source / rel, target)
        except OSError:
            shutil.copy2(source / rel, target)


def _point(final: Path, version: Path) -> None:
    """Switch the pointer `final` to `version` in one rename."""
    link = final.parent / f".{final.name}.{os.getpid()}.link.tmp"
    link.unlink(missing_ok=True)
    os.symlink(os.path.relpath(version, final.parent), link)
    os.replace(link, final)
    fs.fsync_dir(final.parent)


def migrate(final: Path) -> None:
    """Make a cache directory written before versions the first version (under the writer lock)."""
    if final.is_symlink() or not final.is_dir():
        return
    root = versions_dir(final)
    root.mkdir(exist_ok=True)
    version = root / fs.new_version()
    os.replace(final, version)  # readers opening now retry until the pointer exists (open_version)
    fs.fsync_dir(root)
    _point(final, version)


def publish(tmp: Path, final: Path) -> Path:
    """fsync the staged version `tmp`, move it under the versions directory and point `final` at it
    (under the writer lock). Returns the new version's directory."""
    migrate(final)
    (tmp / READERS_LOCK).touch()
    for f in tmp.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    root = versions_dir(final)
    root.mkdir(exist_ok=True)
    version = root / fs.new_version()
    os.replace(tmp, version)
    fs.fsync_dir(root)
    _point(final, version)
    return version


def sweep(final: Path) -> list[str]:
    """Delete every version but the current one that no reader holds (under the writer lock). Only the
    pipeline's own versions: a directory with a version's name and the cache's manifest.json (a directory on
    that volume that merely sits there is the user's). The paths are compared resolved: `cache/` may be a
    symlink to another volume, and the current version must never be taken for an old one.
    Returns the names deleted."""
    root = versions_dir(final)
    if not root.is_dir():
        return []
    current = final.resolve()
    removed = []
    for version in sorted(root.iterdir()):
        if version.name.startswith(".") or version.resolve() == current or not version.is_dir():
            continue
        if not fs.VERSION_NAME.match(version.name) or not (version / "manifest.json").is_file():
            continue
        trash = final.parent / f".{final.name}.{version.name}.old.tmp"
        try:
            fd = _lock_fd(version)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.replace(version, trash)  # under the lock: a reader waiting for it finds the version gone
        except OSError:  # held by a reader (BlockingIOError) or not ours to move
            continue
        finally:
            os.close(fd)
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(version.name)
    return removed


def read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def data_version(manifest: dict[str, Any]) -> str:
    """Changes exactly when the extracts' content does (Dagster's data version of event_cache)."""
    content = json.dumps([manifest.get("format_version"), manifest.get("inputs")], sort_keys=True)
    return f"{manifest['fingerprint']}-{hashlib.sha256(content.encode()).hexdigest()[:12]}"
