"""One contiguous CSR view over a cache's base and its appended segments.

Readers (features, training, inference) need each entity's events in one run of the arrays. With no
appends the base arrays are that view. After appends, the first reader merges base + segments into
view/<NNNN>/events/<source>/ (NNNN = number of appends): per entity its base run, then its run in each
segment, in order. It is a sequential copy in bounded chunks (no sort, no DuckDB), staged and renamed
atomically under a lock; later readers map it directly, and older views are removed. The view is derived
data: not in the manifest, rebuilt if missing.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from basemodel_pipeline import files as fs
from basemodel_pipeline.cache.segment import create_npy, head_bytes, pwrite
from basemodel_pipeline.errors import UserError

CHUNK_ROWS = 1 << 22


def active_segments(manifest: dict[str, Any]) -> list[str]:
    """Appended segments not yet compacted into the base (manifest["appends"] keeps every append)."""
    return [a["segment"] for a in manifest.get("appends", []) if a.get("segment")]


def segment_dirs(path: Path, manifest: dict[str, Any]) -> list[Path]:
    """Base directory then every active appended segment, in order."""
    return [path, *(path / "appends" / name for name in active_segments(manifest))]


def existing_vocab(path: Path, manifest: dict[str, Any], sub: str, column_file: str) -> pa.Table:
    """The values (code order) of a vocabulary over the base and its active segments."""
    from basemodel_pipeline.cache.codes import read_vocab

    return read_vocab([d / "vocab" / sub / f"{column_file}.parquet" for d in segment_dirs(path, manifest)])


def events_root(path: Path, manifest: dict[str, Any]) -> Path:
    """Directory whose events/<source>/ holds the contiguous arrays of this cache version."""
    appends = manifest.get("appends", [])
    if not active_segments(manifest):
        return path
    views = path / "view"
    target = views / f"{len(appends):04d}"
    if target.is_dir():
        return target
    try:
        views.mkdir(exist_ok=True)
        lock = open(views / ".lock", "a")  # noqa: SIM115 (held for the merge)
    except OSError as exc:
        raise UserError(
            f"the cache at {path} has {len(appends)} appended segments and its merged view must be written "
            f"under {views} ({exc}); make the cache directory writable or rebuild it"
        ) from exc
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.is_dir():
            tmp = views / f".{target.name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            segments = segment_dirs(path, manifest)
            for name, meta in manifest["sources"].items():
                files = ["ts", *(m["file"] for m in meta["columns"].values())]
                merge_source(
                    [s / "events" / name for s in segments],
                    files,
                    manifest["n_entities"],
                    tmp / "events" / name,
                )
            for f in tmp.rglob("*"):
                if f.is_file():
                    with open(f, "rb") as fh:
                        os.fsync(fh.fileno())
            os.replace(tmp, target)
            fs.fsync_dir(views)
        for old in views.iterdir():  # older versions (open memory maps of them stay valid)
            if old.name != target.name and not old.name.startswith(".") and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
    return target


def merge_source(segments: list[Path], files: list[str], n_entities: int, out: Path) -> dict[str, str]:
    """Write offsets.npy and every <file>.npy of the merged CSR arrays of `segments` (missing ones skipped).
    Reads and writes chunk by chunk (pread/pwrite, no memory map), so memory stays at one chunk.
    Returns {file path: sha256} of the merged arrays, hashed while written."""
    segments = [s for s in segments if (s / "offsets.npy").exists()]
    offs = []
    for s in segments:
        o = np.load(s / "offsets.npy")
        offs.append(np.concatenate([o, np.full(n_entities + 1 - len(o), o[-1], dtype=np.int64)]))
    counts = sum(np.diff(o) for o in offs)
    merged = np.zeros(n_entities + 1, dtype=np.int64)
    np.cumsum(counts, out=merged[1:])
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "offsets.npy", merged)
    inputs = {f: [_npy_layout(s / f"{f}.npy") for s in segments] for f in files}
    header = {f: create_npy(out / f"{f}.npy", inputs[f][0][1], int(merged[-1])) for f in files}
    hashers = {f: hashlib.sha256(head_bytes(out / f"{f}.npy", header[f])) for f in files}
    # entity chunks of about CHUNK_ROWS merged rows
    cuts = np.searchsorted(merged, np.arange(0, merged[-1] + CHUNK_ROWS, CHUNK_ROWS)).clip(0, n_entities)
    bounds = np.unique(np.concatenate([[0], cuts, [n_entities]]))
    for e0, e1 in zip(bounds[:-1], bounds[1:], strict=True):
        base = merged[e0]
        start = merged[e0:e1] - base
        places = []
        for o in offs:
            c = np.diff(o[e0 : e1 + 1])
            within = np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c)
            places.append((int(o[e0]), int(o[e1]), np.repeat(start, c) + within))
            start = start + c
        for f in files:
            dtype = inputs[f][0][1]
            buf = np.empty(int(merged[e1] - base), dtype=dtype)
            for (path, _, offset), (lo, hi, dest) in zip(inputs[f], places, strict=True):
                if hi > lo:
                    buf[dest] = np.fromfile(
                        path, dtype=dtype, count=hi - lo, offset=offset + lo * dtype.itemsize
                    )
            pwrite(out / f"{f}.npy", header[f] + int(base) * dtype.itemsize, buf)
            hashers[f].update(memoryview(buf).cast("B"))
    return {str(out / f"{f}.npy"): h.hexdigest() for f, h in hashers.items()}


def compact(path: Path, manifest: dict[str, Any], out: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """Write into `out` one base equal to base + active segments: the same entity indices, codes and
    events, no segment. Returns (manifest without active segments, {file: sha256} known from writing)."""
    segments = segment_dirs(path, manifest)
    n = manifest["n_entities"]
    hashes: dict[str, str] = {}
    pq.write_table(_concat(s / "entities.parquet" for s in segments), out / "entities.parquet")
    for name, meta in manifest["sources"].items():
        files = ["ts", *(m["file"] for m in meta["columns"].values())]
        hashes |= merge_source([s / "events" / name for s in segments], files, n, out / "events" / name)
        for m in meta["columns"].values():
            if m["type"] == "categorical":
                (out / "vocab" / name).mkdir(parents=True, exist_ok=True)
                rel = Path("vocab") / name / f"{m['file']}.parquet"
                pq.write_table(_concat(s / rel for s in segments), out / rel)
    for m in (manifest.get("attributes") or {}).get("columns", {}).values():
        parts = [np.load(f) for s in segments if (f := s / "attributes" / f"{m['file']}.npy").exists()]
        (out / "attributes").mkdir(parents=True, exist_ok=True)
        np.save(out / "attributes" / f"{m['file']}.npy", np.concatenate(parts))
        if m["type"] == "categorical":
            (out / "vocab" / "__attributes").mkdir(parents=True, exist_ok=True)
            rel = Path("vocab") / "__attributes" / f"{m['file']}.parquet"
            pq.write_table(_concat(s / rel for s in segments), out / rel)
    new = json.loads(json.dumps(manifest))
    for a in new.get("appends", []):
        a["segment"] = None  # folded into the base
    new["compacted"] = dt.datetime.now(dt.UTC).isoformat()
    return new, hashes


def _concat(files: Any) -> pa.Table:
    tables = [pq.read_table(f) for f in files if f.exists()]
    return pa.concat_tables(tables)


def _npy_layout(path: Path) -> tuple[Path, np.dtype, int]:
    """(path, dtype, byte offset of the data) of a 1-d .npy file."""
    with open(path, "rb") as fh:
        major, _ = np.lib.format.read_magic(fh)
        read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        _, _, dtype = read(fh)
        return path, dtype, fh.tell()
