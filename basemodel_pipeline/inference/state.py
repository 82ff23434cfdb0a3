"""Per-entity feature state as of the cache's last day, advanced with only the new days (docs/design.md,
"Decayed sketches are incremental").

    <workspace>/state/<encoder key>/
        manifest.json   as_of, n_entities, dim, encoder key, cache fingerprint, data version and history
                        version (cache/history.py), events before as_of per source, and the size, sha256
                        and modification time of each array (written last)
        features.npy    float16 [n_entities, dim]: every entity's model input as of `as_of`
        totals.npy      float32 [n_entities, T]: the aggregates' sums: all history (count, active days, numeric
                        sums) and each 7/30/90-day window (the same plus top-value counts)

Scoring as of the state's date is one forward pass per entity: no event is read. When the cache gains days,
``advance`` reads only the events in [old as_of, new as_of) for the decayed sums and totals,

    S(t1) = exp(-(t1 - t0) * rate) * S(t0) + sum over the new events of value * exp(-(t1 - ts) * rate),

the aggregates' windows add the new days and drop the days that left them (only those events are read);
recency, tenure and counts come from one binary search per entity.
Scenarios that share the foundation's encoder share one state. The decayed sums are kept in float16 in their
log1p-squashed form (the model's input), so each advance re-rounds them (~2.4e-4 relative in log space);
the state is rebuilt from the cache whenever its history changed (a correction of old days, even with the same
number of rows: the cache's history version before the state's date differs; late days) or the encoder did.
Opening checks each array's size and modification time (a changed one is hashed); a damaged state is rebuilt
with a warning. `basemodel verify` hashes it in full and reports a state built from older cache content as
stale.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from basemodel_pipeline import files as fs
from basemodel_pipeline import manifests
from basemodel_pipeline.cache import integrity
from basemodel_pipeline.cache.history import history_version
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.cache.versions import data_version
from basemodel_pipeline.dates import epoch_seconds
from basemodel_pipeline.features.aggregates import advance_sums, all_history_totals, window_totals
from basemodel_pipeline.features.kernels import (
    decayed_sums,
    expand_ranges_t,
    row_chunks,
    source_tensors,
)
from basemodel_pipeline.features.sketch import FeatureEncoder
from basemodel_pipeline.progress import NullProgress, Progress

STATE_VERSION = 3  # 3: tied to the cache content (history version) and checksummed
CHUNK = 16384  # entities per step: bounds memory


def default_as_of(cache: EventCache) -> dt.date:
    """The day after the cache's last event day: every event in the cache is history (the latest date)."""
    return cache.max_date + dt.timedelta(days=1)


def state_serves(cache: EventCache, as_of: dt.date, replay: bool) -> bool:
    """Whether features as of `as_of` come from the per-entity state (the latest date) rather than a replay."""
    return as_of >= default_as_of(cache) and not replay


def float32_rows(rows: np.ndarray) -> torch.Tensor:
    """float16 state rows as float32 (torch converts ~10x faster than numpy)."""
    return torch.from_numpy(np.ascontiguousarray(rows)).float()


def encoder_key(encoder: dict) -> str:
    """Stable short hash of an encoder's JSON: scenarios fine-tuned from one foundation share a state."""
    blob = json.dumps(encoder, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def state_dir(workspace: Path, encoder: dict) -> Path:
    return Path(workspace) / "state" / encoder_key(encoder)


@dataclass
class EntityState:
    path: Path
    manifest: dict[str, Any]
    features: np.ndarray  # float16 [n, dim], memory-mapped
    totals: np.ndarray  # float32 [n, T], memory-mapped

    @property
    def as_of(self) -> dt.date:
        return dt.date.fromisoformat(self.manifest["as_of"])

    def problems(self, full: bool = False) -> list[str]:
        return state_problems(self.path, self.manifest, full)

    @classmethod
    def open(cls, path: Path) -> EntityState | None:
        manifest = path / "manifest.json"
        if not manifest.exists():
            return None
        meta = json.loads(manifest.read_text())
        if meta.get("version") != STATE_VERSION:
            return None
        return cls(
            path,
            meta,
            np.load(path / "features.npy", mmap_mode="r"),
            np.load(path / "totals.npy", mmap_mode="r"),
        )


def state_problems(path: Path, manifest: dict[str, Any], full: bool = False) -> list[str]:
    """Arrays of a state directory that differ from its manifest (size; sha256 when `full` or when their
    modification time changed); first, the manifest's signature (keyed manifests, manifests.py)."""
    if signature := manifests.signature_problem(manifest, "manifest.json"):
        return [signature]
    files = manifest.get("files") or {}
    if not files:
        return ["manifest.json records no checksums"]
    return integrity.file_problems(path, files, full, what="the state")[0]


def events_before(cache: EventCache, t: int) -> dict[str, int]:
    """Number of events before t per source (one binary search per entity): the state's history signature."""
    e = torch.arange(cache.n_entities, dtype=torch.int64)
    out = {}
    for name, src in cache.sources.items():
        st = source_tensors(src, torch.device("cpu"))
        out[name] = int((st.positions(e, torch.full_like(e, t)) - st.offsets[:-1]).sum())
    return out


Layout = list[list]  # [["totals", source, base] | ["windows", source, W, width], ...]: columns of totals.npy


def _pack(
    totals: dict[str, tuple[torch.Tensor, torch.Tensor]], windows: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, Layout]:
    """The aggregate sums of a chunk as one [n, T] float32 block, and its layout."""
    parts, layout = [], []
    for name, (t, _) in totals.items():
        parts.append(t)
        layout.append(["totals", name, t.shape[1]])
    for name, w in windows.items():
        parts.append(w.reshape(len(w), -1))
        layout.append(["windows", name, w.shape[1], w.shape[2]])
    n = len(parts[0]) if parts else 0
    return (torch.cat(parts, 1) if parts else torch.zeros((n, 0))), layout


def _unpack(packed: torch.Tensor, layout: Layout) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    totals, windows, off = {}, {}, 0
    for kind, name, *shape in layout:
        width = int(np.prod(shape))
        block = packed[:, off : off + width]
        if kind == "totals":
            totals[name] = block
        else:
            windows[name] = block.reshape(len(packed), *shape)
        off += width
    return totals, windows


def _build_chunk(
    cache: EventCache, enc: FeatureEncoder, e: torch.Tensor, t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, Layout]:
    """Features and packed aggregate sums of entities from their whole history (the first build)."""
    if not enc.aggregate_dim:
        return enc.history_sorted(cache, e, t), torch.zeros((len(e), 0)), []
    totals, windows = all_history_totals(cache, e, t), window_totals(cache, e, t)
    packed, layout = _pack(totals, windows)
    return enc.history_sorted(cache, e, t, totals, windows), packed, layout


def _advance_chunk(
    cache: EventCache,
    enc: FeatureEncoder,
    e: torch.Tensor,
    t0: int,
    t1: int,
    X_old: torch.Tensor,
    packed_old: torch.Tensor,
    layout: Layout,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Features and aggregate sums of entities as of t1 from their state as of t0: reads the events in
    [t0, t1) and, for the windowed aggregates, the events leaving each window."""
    n, dev = len(e), e.device
    rates = enc._rates(dev)
    T0, T1 = torch.full((n,), t0, dtype=torch.int64), torch.full((n,), t1, dtype=torch.int64)
    decay = torch.exp(-(t1 - t0) * rates).view(1, -1, 1)  # [1, H, 1]
    sums, pos = [], []
    for plan, old in zip(enc.sources, enc.raw_sums(X_old), strict=True):
        st = source_tensors(cache.source(plan.name), dev)
        lo, hi = st.positions(e, T0), st.positions(e, T1)
        new = torch.zeros((n, len(rates), plan.channels), dtype=torch.float32, device=dev)
        for a, b in row_chunks(hi - lo, torch.ones(n, dtype=torch.bool, device=dev)):
            owner, rows = expand_ranges_t(lo[a:b], hi[a:b])
            chans, vals = enc.event_channels_t(plan, st, rows)
            decayed_sums(vals, owner, t1 - st.ts[rows], chans, rates, b - a, plan.channels, out=new[a:b])
        sums.append(old * decay + new)
        pos.append(hi)
    if not enc.aggregate_dim:
        return enc.assemble(cache, e, T1, sums, pos), packed_old
    totals_old, windows_old = _unpack(packed_old, layout)
    totals, windows = advance_sums(cache, e, t0, t1, totals_old, windows_old)
    packed, _ = _pack(totals, windows)
    return enc.assemble(cache, e, T1, sums, pos, totals, windows), packed


def ensure_state(
    workspace: Path,
    cache: EventCache,
    encoder: dict,
    as_of: dt.date,
    progress: Progress | None = None,
    chunk: int = CHUNK,
) -> tuple[EntityState, dict[str, Any]]:
    """The state as of `as_of` (>= the cache's last day + 1), reusing and advancing a stored one when its
    history is still the cache's; built from the whole history otherwise. Returns (state, what was done)."""
    path = state_dir(workspace, encoder)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:  # one writer; shards wait, then reuse
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure(path, cache, encoder, as_of, progress or NullProgress(), chunk)


def _ensure(
    path: Path, cache: EventCache, encoder: dict, as_of: dt.date, progress: Progress, chunk: int
) -> tuple[EntityState, dict[str, Any]]:
    enc = FeatureEncoder.from_dict(encoder)
    old = EntityState.open(path)
    if old is not None and (problems := old.problems()):
        progress.log(f"warning: per-entity state {path}: {integrity.first(problems)}; rebuilding it")
        old = None
    base = old if old is not None and _valid(old, cache) else None
    if base is not None and base.as_of == as_of:
        return base, {"state": "reused", "state_as_of": as_of.isoformat(), "new_events": 0}
    if base is not None and base.as_of > as_of:
        base = None  # a state ahead of the date asked for cannot go back: rebuild
    fs.clean_stale_tmp(path.parent)
    tmp = fs.staging_dir(path)
    try:
        return _write(path, tmp, cache, enc, encoder, base, as_of, progress, chunk)
    finally:
        fs.discard_dir(tmp)  # nothing once published; a failed build's staging otherwise


def _write(
    path: Path,
    tmp: Path,
    cache: EventCache,
    enc: FeatureEncoder,
    encoder: dict,
    base: EntityState | None,
    as_of: dt.date,
    progress: Progress,
    chunk: int,
) -> tuple[EntityState, dict[str, Any]]:
    """Build or advance the state into the staging directory `tmp`, then publish it as `path`."""
    t1 = epoch_seconds(as_of)
    fingerprint = cache.manifest.get("fingerprint")
    n = cache.n_entities
    X = allocated_npy(tmp / "features.npy", np.float16, (n, enc.dim))
    hashes = {"features.npy": npy_hasher(X)}
    totals_file = None
    layout: Layout = base.manifest["totals_layout"] if base else []
    progress.start("state", n)
    before = events_before(cache, t1)
    if base is not None:
        t0 = epoch_seconds(base.as_of)
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        e = torch.arange(a, b, dtype=torch.int64)
        t = torch.full((b - a,), t1, dtype=torch.int64)
        if base is not None:
            X_old, tot_old = _old_rows(base, a, b, enc.dim)
            x, tot = _advance_chunk(cache, enc, e, t0, t1, X_old, tot_old, layout)
        else:
            x, tot, layout = _build_chunk(cache, enc, e, t)
        if totals_file is None:
            shape = (n, tot.shape[1])
            totals_file = allocated_npy(tmp / "totals.npy", np.float32, shape)
            hashes["totals.npy"] = npy_hasher(totals_file)
        X[a:b] = rows = np.ascontiguousarray(x.to(torch.float16).numpy(), X.dtype)
        hashes["features.npy"].update(rows)
        totals_file[a:b] = rows = np.ascontiguousarray(tot.numpy(), totals_file.dtype)
        hashes["totals.npy"].update(rows)
        progress.advance("state", b - a)
    if totals_file is None:  # no entities
        np.save(tmp / "totals.npy", np.zeros((0, 0), np.float32))
    else:
        totals_file.flush()
    X.flush()
    del X, totals_file
    manifest = {
        "version": STATE_VERSION,
        "as_of": as_of.isoformat(),
        "n_entities": n,
        "dim": enc.dim,
        "encoder_key": encoder_key(encoder),
        "cache_fingerprint": fingerprint,
        "cache_data_version": data_version(cache.manifest),
        "cache_history": history_version(cache.manifest, as_of),
        "events_before": before,
        "totals_layout": layout,
        "updates": (base.manifest.get("updates", 0) + 1) if base else 0,
        "created": dt.datetime.now(dt.UTC).isoformat(),
        "files": {
            name: integrity.record(tmp / name, h.hexdigest() if h else manifests.sha256_file(tmp / name))
            for name, h in {
                "features.npy": hashes["features.npy"],
                "totals.npy": hashes.get("totals.npy"),
            }.items()
        },
    }
    record = json.dumps(manifests.signed(manifest), indent=2)
    (tmp / "manifest.json").write_text(record)  # last: lists what is complete
    fs.publish_dir(tmp, path)
    state = EntityState.open(path)
    assert state is not None
    read = sum(before.values()) - (sum(base.manifest["events_before"].values()) if base else 0)
    info = {"state": "advanced" if base else "built", "state_as_of": as_of.isoformat(), "new_events": read}
    return state, info


def allocated_npy(path: Path, dtype: type, shape: tuple[int, int]) -> np.memmap:
    """A writable memory map of a new .npy file whose blocks are allocated up front: a full disk is an
    OSError (ENOSPC) here, not a SIGBUS when a page of the map is first written."""
    array = np.lib.format.open_memmap(path, "w+", dtype, shape)
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # no fallocate there: write as before
            del array
            raise
    finally:
        os.close(fd)
    return array


def npy_hasher(array: np.memmap) -> Any:
    """A sha256 of a new .npy file fed its header now; the caller feeds the rows in order as it writes them."""
    with open(array.filename, "rb") as fh:
        return hashlib.sha256(fh.read(array.offset))


def stale_reason(manifest: dict[str, Any], as_of: dt.date, cache_manifest: dict[str, Any]) -> str | None:
    """Why a state (its manifest, as of its date) no longer describes the history of the cache whose manifest
    is `cache_manifest` before that date, or None when it still does."""
    if manifest.get("cache_fingerprint") != cache_manifest.get("fingerprint"):
        return f"built for another data configuration (cache {manifest.get('cache_fingerprint')})"
    if manifest["n_entities"] > cache_manifest["n_entities"]:
        return (
            f"built for {manifest['n_entities']:,} entities, the cache has {cache_manifest['n_entities']:,}"
        )
    if manifest.get("cache_history") != history_version(cache_manifest, as_of):
        return (
            f"built from cache data version {manifest.get('cache_data_version')}, whose days before {as_of} "
            f"differ from the current cache's ({data_version(cache_manifest)})"
        )
    return None


def _valid(state: EntityState, cache: EventCache) -> bool:
    """The stored state still describes the cache's history before its date: same data config, no entity
    removed, the same extract content before that date (a correction of old days changes it, even with the
    same number of rows), and exactly as many events before that date per source."""
    if stale_reason(state.manifest, state.as_of, cache.manifest) is not None:
        return False
    return state.manifest.get("events_before") == events_before(cache, epoch_seconds(state.as_of))


def _old_rows(state: EntityState, a: int, b: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows a:b of a stored state as float32 tensors; entities added since (rows past its end) start empty."""
    n_old = state.manifest["n_entities"]
    X = torch.zeros((b - a, dim), dtype=torch.float32)
    T = torch.zeros((b - a, state.totals.shape[1]), dtype=torch.float32)
    if a < n_old:
        k = min(b, n_old) - a
        X[:k] = float32_rows(state.features[a : a + k])
        T[:k] = torch.from_numpy(np.array(state.totals[a : a + k]))
    return X, T  # entities added since (rows past the stored ones) start from zero sums: an empty history
