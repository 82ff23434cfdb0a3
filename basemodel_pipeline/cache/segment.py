"""Write one CSR segment of an event source: DuckDB streams the events once (entity index and codes joined
on native types), numpy routes each batch to its shard's spill files, then each shard is sorted by
(entity index, time) on its own and written at its place in the global arrays.

A shard is a contiguous range of entity indices, so the sorted shards laid end to end are the global CSR
arrays: events/<source>/offsets.npy, ts.npy and one col_*.npy per column. Memory is bounded by the largest
shard (plus one Arrow batch), whatever the number of events. Ties (same entity and second) keep the order of
the extract files, so a build is deterministic.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

BATCH_ROWS = 1 << 20
IDX, TS, ROW_ALIAS = "__idx", "__ts", "__row"


@dataclass(frozen=True)
class Lookup:
    """Dense table from an integer key to a value: replaces a hash join when the keys span a small range."""

    key: str  # column of the scan query holding the raw integer key
    lo: int
    table: np.ndarray
    default: int | float = 0

    def __call__(self, batch: pa.RecordBatch) -> np.ndarray:
        raw = batch.column(self.key)
        if raw.null_count:
            raw = pc.fill_null(raw, self.lo - 1)
        pos = raw.to_numpy(zero_copy_only=False).astype(np.int64, copy=False) - self.lo
        inside = (pos >= 0) & (pos < len(self.table))
        out = self.table[np.where(inside, pos, 0)]
        out[~inside] = self.default
        return out


@dataclass(frozen=True)
class OutColumn:
    alias: str  # column of the scan query (or, with lookup, the name of the looked-up array)
    file: str  # file stem, e.g. col_product_id
    dtype: type  # np.int32 (codes) or np.float32
    lookup: Lookup | None = None


def write_segment(
    con: duckdb.DuckDBPyConnection,
    scan_sql: str,
    entity: Lookup | None,
    columns: list[OutColumn],
    shards: list[tuple[int, int]],
    n_entities: int,
    out: Path,
    spill: Path,
) -> tuple[int, tuple[int, int] | None, dict[str, str]]:
    """Run `scan_sql` (selects __idx, __ts, __row and every column alias, or the raw keys of the lookups) and
    write the sorted CSR arrays of the rows into `out`. With `entity`, the entity index is looked up
    from its raw key. `shards` are contiguous [start, end) entity ranges covering [0, n_entities).
    Returns (events, (min ts, max ts) or None, {file path: sha256} of the arrays, hashed while written)."""
    out.mkdir(parents=True, exist_ok=True)
    spill.mkdir(parents=True, exist_ok=True)
    starts = np.array([s for s, _ in shards], dtype=np.int64)
    fields = [(IDX, np.int64), (TS, np.int64), (ROW_ALIAS, np.int32)] + [(c.alias, c.dtype) for c in columns]
    counts = np.zeros(len(shards), dtype=np.int64)
    with contextlib.ExitStack() as stack:
        handles = {
            (k, name): stack.enter_context(open(spill / f"{k}.{name}.bin", "wb"))
            for k in range(len(shards))
            for name, _ in fields
        }
        for batch in con.execute(scan_sql).to_arrow_reader(BATCH_ROWS):
            lookups = {c.alias: c.lookup for c in columns if c.lookup} | ({IDX: entity} if entity else {})
            arrays = {
                name: (
                    lookups[name](batch)
                    if name in lookups
                    else batch.column(name).to_numpy(zero_copy_only=False)
                ).astype(dt, copy=False)
                for name, dt in fields
            }
            if entity and (arrays[IDX] < 0).any():  # ids outside the entity map (inner join)
                keep = arrays[IDX] >= 0
                arrays = {name: a[keep] for name, a in arrays.items()}
            order, bounds = _route(arrays[IDX], starts)
            for name, _ in fields:
                routed = arrays[name] if order is None else arrays[name][order]
                for k in np.flatnonzero(bounds[1:] > bounds[:-1]):
                    handles[(int(k), name)].write(routed[bounds[k] : bounds[k + 1]].data)
            counts += np.diff(bounds)
    n = int(counts.sum())
    files = {TS: out / "ts.npy"} | {c.alias: out / f"{c.file}.npy" for c in columns}
    header = {name: create_npy(files[name], dt, n) for name, dt in fields if name in files}
    hashers = {name: hashlib.sha256(head_bytes(files[name], header[name])) for name in header}
    ts_min, ts_max = None, None
    offsets = np.zeros(n_entities + 1, dtype=np.int64)
    pos = 0
    for k, (start, end) in enumerate(shards):
        idx = np.fromfile(spill / f"{k}.{IDX}.bin", dtype=np.int64)
        (spill / f"{k}.{IDX}.bin").unlink()
        ts = np.fromfile(spill / f"{k}.{TS}.bin", dtype=np.int64)
        row = np.fromfile(spill / f"{k}.{ROW_ALIAS}.bin", dtype=np.int32)
        (spill / f"{k}.{ROW_ALIAS}.bin").unlink()
        order = _sort_order(idx - start, ts, row)
        del row
        if len(ts):
            lo, hi = int(ts.min()), int(ts.max())
            ts_min = lo if ts_min is None else min(ts_min, lo)
            ts_max = hi if ts_max is None else max(ts_max, hi)
        shard_counts = np.bincount(idx - start, minlength=end - start)
        offsets[start + 1 : end + 1] = pos + np.cumsum(shard_counts)
        del idx
        for name, dt in fields:
            if name not in files:
                continue
            values = ts if name == TS else np.fromfile(spill / f"{k}.{name}.bin", dtype=dt)
            (spill / f"{k}.{name}.bin").unlink()
            chunk = np.ascontiguousarray(values[order])
            pwrite(files[name], header[name] + pos * np.dtype(dt).itemsize, chunk)
            hashers[name].update(memoryview(chunk).cast("B"))
            del chunk
            del values
        del ts, order
        pos += int(counts[k])
    assert pos == n, (pos, n)
    # entities between shards (none when the shards cover every index) keep the running position
    np.maximum.accumulate(offsets, out=offsets)
    np.save(out / "offsets.npy", offsets)
    ts_range = None if ts_min is None or ts_max is None else (ts_min, ts_max)
    return n, ts_range, {str(files[name]): h.hexdigest() for name, h in hashers.items()}


def _route(idx: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """(row order grouping the batch by shard, stable; None if it already is, shard bounds in that order)."""
    if len(starts) == 1:
        return None, np.array([0, len(idx)])
    shard = np.searchsorted(starts, idx, side="right") - 1
    bits = max(len(idx), 1).bit_length()
    key = np.sort((shard.astype(np.int64) << bits) | np.arange(len(idx)))  # unique keys: a stable order
    return key & ((1 << bits) - 1), np.searchsorted(key >> bits, np.arange(len(starts) + 1))


def _sort_order(local: np.ndarray, ts: np.ndarray, row: np.ndarray) -> np.ndarray:
    """Order by (local entity index, time, row in the extract file): one packed int64 key sorted by torch
    (parallel), or numpy's lexsort when the three do not fit in 63 bits. Simultaneous events of an entity
    come from one day file, so the row number makes the order that of the extract."""
    if not len(ts):
        return np.zeros(0, dtype=np.int64)
    t0 = int(ts.min())
    ts_bits = max(int(ts.max()) - t0, 1).bit_length()
    row_bits = max(int(row.max()), 1).bit_length()
    if max(int(local.max()), 1).bit_length() + ts_bits + row_bits <= 63:
        key = (((local << ts_bits) | (ts - t0)) << row_bits) | row
        return torch.sort(torch.from_numpy(key)).indices.numpy()  # unique keys: any sort is stable
    return np.lexsort((row, ts, local))


def create_npy(path: Path, dtype: type, n: int) -> int:
    """An .npy file of n elements (sparse until written); returns the byte offset of its data."""
    with open(path, "wb") as fh:
        descr = np.lib.format.dtype_to_descr(np.dtype(dtype))
        np.lib.format.write_array_header_1_0(fh, {"descr": descr, "fortran_order": False, "shape": (n,)})
        offset = fh.tell()
        fh.truncate(offset + n * np.dtype(dtype).itemsize)
    return offset


def head_bytes(path: Path, n: int) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(n)


def pwrite(path: Path, offset: int, values: np.ndarray) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        view = memoryview(np.ascontiguousarray(values)).cast("B")
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written
    finally:
        os.close(fd)
