"""Is a cache version what its manifest says? Every file is recorded with its size, sha256 and modification
time (ns) when the version is written (writer.file_records).

    quick   (every open, and the `cache` stage before reusing or appending): each file exists with its
            size and modification time; a file whose time differs (edited in place, or a copy of the
            workspace that did not keep times) is hashed, and passes when its sha256 still matches.
            O(number of files) stats; nothing is read while times match.
    full    (`basemodel verify`, the Dagster check manifest_sha256): the sha256 of every file, and no file
            that the manifest does not list.

Hashes confirmed for files whose time changed are remembered in VERIFIED (a hidden file of the version,
written by the `cache` stage), so a moved workspace is hashed once, not at every open."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from basemodel_pipeline import files as fs
from basemodel_pipeline import manifests
from basemodel_pipeline.errors import UserError

MANIFEST = "manifest.json"
VERIFIED = ".verified.json"  # {relative path: mtime_ns} of files whose sha256 was confirmed at that time


def record(path: Path, sha256: str) -> dict[str, Any]:
    """A manifest entry for a file just written."""
    st = path.stat()
    return {"bytes": st.st_size, "sha256": sha256, "mtime_ns": st.st_mtime_ns}


def _verified(directory: Path) -> dict[str, int]:
    try:
        data = json.loads((directory / VERIFIED).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}


def file_problems(
    directory: Path,
    files: dict[str, Any],
    full: bool,
    confirmed: dict[str, int] | None = None,
    what: str = "the cache",
) -> tuple[list[str], int, int]:
    """(problems, files checked, bytes) of the files of a manifest under `directory` (`what` it is, for the
    messages). `confirmed` collects {path: mtime_ns} of files hashed because their time differed and found
    unchanged."""
    known = _verified(directory)
    problems: list[str] = []
    checked = size = 0
    for rel, expected in sorted(files.items()):
        path = directory / rel
        try:
            st = path.stat()
        except OSError:
            problems.append(f"{rel}: missing")
            continue
        checked += 1
        size += st.st_size
        if st.st_size != expected["bytes"]:
            problems.append(f"{rel}: {st.st_size:,} bytes, the manifest says {expected['bytes']:,}")
            continue
        times = {expected.get("mtime_ns"), known.get(rel)} - {None}
        if not full and st.st_mtime_ns in times:
            continue  # unchanged since written
        if manifests.sha256_file(path) != expected["sha256"]:
            problems.append(f"{rel}: changed after {what} was written (sha256 differs from manifest.json)")
        elif confirmed is not None and st.st_mtime_ns not in times:
            confirmed[rel] = st.st_mtime_ns
    return problems, checked, size


def manifest_problems(cache_dir: Path, full: bool = True) -> tuple[list[str], int, int]:
    """(problems, files checked, bytes checked) of a cache directory against its manifest.json; `full` also
    reports files the manifest does not list."""
    manifest_file = cache_dir / "manifest.json"
    if not manifest_file.is_file():
        return [f"{manifest_file} is missing"], 0, 0
    try:
        manifest = json.loads(manifest_file.read_text())
        files = manifest.get("files") or {}
    except (OSError, ValueError, AttributeError) as exc:
        return [f"{manifest_file} is unreadable ({exc})"], 0, 0
    if signature := signature_problems(manifest):
        return signature, 0, 0
    problems, checked, size = file_problems(cache_dir, files, full)
    if full:
        problems += [f"{rel}: not in the manifest" for rel in unlisted(cache_dir, files)]
    return problems, checked, size


def unlisted(cache_dir: Path, files: dict[str, Any]) -> list[str]:
    """Files of a cache version that its manifest does not list (derived views and hidden files aside)."""
    listed = set(files) | {"manifest.json"}
    return sorted(
        rel
        for p in cache_dir.rglob("*")
        if p.is_file()
        and (rel := str(p.relative_to(cache_dir))) not in listed
        and not rel.startswith("view/")  # derived: the merged view of the appends (cache/view.py)
        and not any(part.startswith(".") for part in p.relative_to(cache_dir).parts)  # staging, locks
    )


def first(problems: list[str]) -> str:
    """The first problem, and how many more there are."""
    return problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")


def describe(where: Path, problems: list[str]) -> str:
    return f"event cache {where}: {first(problems)}"


def signature_problems(manifest: dict[str, Any]) -> list[str]:
    """[why the manifest's signature is refused] under BASEMODEL_MANIFEST_KEY (keyed manifests,
    manifests.py), or []."""
    problem = manifests.signature_problem(manifest, MANIFEST)
    return [problem] if problem else []


def check_on_open(version: Path, manifest: dict[str, Any]) -> None:
    """The quick check of a version being opened (its signature, then each file's size and time); a
    one-line UserError naming the first bad file."""
    problems = signature_problems(manifest) or file_problems(version, manifest.get("files") or {}, False)[0]
    if problems:
        raise UserError(
            f"{describe(version, problems)}; rebuild it with `basemodel cache CONFIG` "
            "(it replaces a changed cache)"
        )


def check_for_reuse(version: Path, manifest: dict[str, Any]) -> list[str]:
    """The quick check before the `cache` stage reuses or appends to a version; remembers the files that
    were hashed and found unchanged (VERIFIED). Returns the problems (empty when it can be reused)."""
    confirmed: dict[str, int] = {}
    if signature := signature_problems(manifest):
        return signature
    problems, _, _ = file_problems(version, manifest.get("files") or {}, False, confirmed)
    if confirmed and not problems:
        with contextlib.suppress(OSError):  # a read-only cache: hashed again next time, still correct
            fs.atomic_write_text(version / VERIFIED, json.dumps({**_verified(version), **confirmed}))
    return problems


def damaged_parts(problems: list[str]) -> bool:
    """Whether the problems touch what a rebuild takes over from the old version (entity order, codes), or
    its manifest is not trusted (nothing is taken over)."""
    return any(p.startswith(("entities.parquet", f"vocab{os.sep}", "vocab/", MANIFEST)) for p in problems)
