"""File primitives of every artifact: atomic writes, owned temporaries, directories staged and published
with one rename, version names and the LATEST pointer of a version root (with the verdicts that say why a
version was promoted or rejected). Nothing here knows a workspace's layout (workspace.py): callers pass the
paths in.

Temporaries (hidden ``.<name>.<pid>-<token>.tmp`` files and directories beside what they become) are owned:
their writer holds an flock on ``<temporary>.owner`` from before the temporary exists until it is published
or discarded. The kernel drops the lock when the writer dies, so clean_stale_tmp removes exactly the
temporaries of dead writers and never those of a live one (another run writing beside it right now).

A version root (checkpoints/foundation/, checkpoints/scenarios/<name>/) holds version directories named by
new_version(), a LATEST file naming the one served, and verdicts/<version>.json.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any

from basemodel_pipeline.errors import UserError


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = claim_tmp(path)
    try:
        with open(tmp, "xb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        release_tmp(tmp)
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


OWNER_SUFFIX = ".owner"
_owned: dict[Path, int] = {}  # temporary -> descriptor of its flocked owner file (this process)


def _owner_file(tmp: Path) -> Path:
    return tmp.with_name(tmp.name + OWNER_SUFFIX)


def claim_tmp(final: Path) -> Path:
    """A fresh, unused temporary name beside `final`, owned by this process until release_tmp: the owner
    file is created and flocked before the temporary exists, so no cleaner can take it for a dead one."""
    while True:
        tmp = final.with_name(f".{final.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
        owner = _owner_file(tmp)
        try:
            fd = os.open(owner, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
        except FileExistsError:
            continue
        fcntl.flock(fd, fcntl.LOCK_EX)
        if _same_file(owner, fd) and not tmp.exists():
            _owned[tmp] = fd
            return tmp
        # a cleaner took the fresh owner file for an orphan and removed it before we locked it, or a
        # leftover of an earlier process with the same pid has the name: try another name
        if _same_file(owner, fd):
            owner.unlink(missing_ok=True)
        os.close(fd)


def _same_file(path: Path, fd: int) -> bool:
    """Whether `path` still names the file open as `fd`."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def release_tmp(tmp: Path) -> None:
    """End this process's ownership of `tmp` (published, discarded, or never made): drop its owner file."""
    fd = _owned.pop(tmp, None)
    if fd is None:
        return
    _owner_file(tmp).unlink(missing_ok=True)
    os.close(fd)


def staging_dir(final: Path) -> Path:
    """A fresh temporary directory beside `final`, owned by this process, to be published with publish_dir
    (or removed with discard_dir)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = claim_tmp(final)
    tmp.mkdir()
    return tmp


def discard_dir(tmp: Path) -> None:
    """Remove a staging directory that will not be published, and release it."""
    shutil.rmtree(tmp, ignore_errors=True)
    release_tmp(tmp)


def publish_dir(tmp: Path, final: Path) -> None:
    """fsync every file in `tmp`, then rename it to `final` (replacing an older copy) in one step."""
    for f in tmp.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    if final.exists():
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    release_tmp(tmp)
    fsync_dir(final.parent)


def clean_stale_tmp(parent: Path) -> None:
    """Remove leftovers of dead writers in `parent`: hidden *.tmp files and directories whose owner lock
    nobody holds (their writer was killed; a live writer's, this process's included, are kept), and owner
    files whose temporary is gone."""
    if not parent.exists():
        return
    for p in parent.glob(".*.tmp"):
        if p not in _owned:
            _remove_if_dead(p)
    for owner in parent.glob(f".*.tmp{OWNER_SUFFIX}"):
        tmp = owner.with_name(owner.name.removesuffix(OWNER_SUFFIX))
        if tmp not in _owned and not tmp.exists():
            _remove_if_dead(tmp)


def _remove_if_dead(tmp: Path) -> None:
    """Remove `tmp` and its owner file unless a live process holds the owner's lock. A file without an owner
    file is not a pipeline temporary (claim_tmp makes the owner first): it is left alone, whatever its name
    (a directory symlinked to another volume may hold the user's own `.x.tmp`)."""
    try:
        fd = os.open(_owner_file(tmp), os.O_RDWR)
    except FileNotFoundError:
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # its writer is alive
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        _owner_file(tmp).unlink(missing_ok=True)
    finally:
        os.close(fd)


def new_version() -> str:
    """Sortable, unique version name: UTC time to the microsecond."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")


VERSION_NAME = re.compile(r"^\d{8}T\d{6}\d{6}Z$")  # what new_version() writes


def versions(parent: Path) -> list[str]:
    """Names of the version directories under `parent`, newest first."""
    found = [
        p.name for p in parent.iterdir() if VERSION_NAME.match(p.name) and p.is_dir() and not p.is_symlink()
    ]
    return sorted(found, reverse=True)


def _bad_pointer(pointer: Path, problem: str) -> UserError:
    """A UserError for a LATEST that does not name a version of its own root, saying how to fix it."""
    found = versions(pointer.parent)
    fix = (
        f"write a version name from {pointer.parent} into it (newest: {found[0]})"
        if found
        else "delete it and re-run the stage that produces it"
    )
    return UserError(f"{pointer}: {problem}; {fix}")


def latest(parent: Path, what: str) -> Path:
    """The version directory that `parent`/LATEST names. LATEST must hold one plain version name (as
    new_version() writes) of a directory inside `parent`: never a path leading elsewhere."""
    pointer = parent / "LATEST"
    if not pointer.exists():
        raise UserError(f"no {what} found under {parent}; {_nothing_promoted(parent)}")
    name = pointer.read_text().strip()
    if not VERSION_NAME.match(name):
        raise _bad_pointer(
            pointer,
            f"names {name!r}, which is not a version name like {new_version()} (one directory beside it)",
        )
    path = parent / name
    if not path.is_dir():
        raise UserError(f"{pointer} names {path.name}, which is missing; re-run the stage that produces it")
    if not path.resolve().is_relative_to(parent.resolve()):
        raise _bad_pointer(pointer, f"version {name} is a link to {path.resolve()}, outside {parent}")
    return path


def _nothing_promoted(parent: Path) -> str:
    """What to do when a root has no LATEST: run the stage, or look at why its versions were rejected."""
    found = versions(parent) if parent.is_dir() else []
    verdict = read_verdict(parent, found[0]) if found else None
    if verdict is None or verdict.get("status") != "rejected":
        return "run the stage that produces it first"
    failed = [g for g in verdict.get("gates", []) if g.get("blocking", True) and not g.get("passed")]
    why = "; ".join(f"{g.get('name')}: {g.get('detail')}" for g in failed) or "a gate failed"
    return (
        f"its newest version {found[0]} was rejected by its quality gates ({why}); see "
        f"`basemodel promote CONFIG --list`"
    )


VERDICTS = "verdicts"


def verdict_path(parent: Path, version: str) -> Path:
    """Where the promotion verdict of a checkpoint version lives (training/promotion.py)."""
    return parent / VERDICTS / f"{version}.json"


def read_verdict(parent: Path, version: str) -> dict[str, Any] | None:
    """The verdict record of a version as written (None when it has none, or it is unreadable)."""
    try:
        record = json.loads(verdict_path(parent, version).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def write_verdict(parent: Path, version: str, record: dict[str, Any]) -> None:
    atomic_write_text(verdict_path(parent, version), json.dumps(record, indent=2) + "\n")


def set_latest(parent: Path, version: str) -> None:
    atomic_write_text(parent / "LATEST", version + "\n")
