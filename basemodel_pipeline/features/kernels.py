"""Torch kernels of the featuriser: rows of the events before/within windows, scatter-adds, decayed scans.

The same code runs on CPU (tensors over the cache's memory maps, no copy) and on GPU (the event store
uploaded once). Queries are (entity index, split time) pairs sorted by entity then time, so the events of one
entity between two consecutive split points form one contiguous *segment* of rows; every event is read once
however many split points its entity has (docs/design.md, "Decayed sketches are incremental"):

    S(t_j) = exp(-(t_j - t_{j-1}) * rate) * S(t_{j-1}) + sum over segment j of value * exp(-(t_j - ts) * rate)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from basemodel_pipeline.cache.store import EventSource, bisect_rows, expand_ranges_t
from basemodel_pipeline.dates import DAY

MAX_ROWS = 1 << 21  # event rows expanded at a time: bounds memory whatever the history lengths


def as_tensor(a: np.ndarray | torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    """A numpy array (memory-mapped ones included) as a tensor: zero-copy on CPU."""
    if isinstance(a, torch.Tensor):
        return a.to(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only memory maps: nothing writes through them
        return torch.from_numpy(a).to(device)


@dataclass
class SourceTensors:
    """One event source's arrays as tensors on a device."""

    offsets: torch.Tensor  # int64 [n_entities + 1]
    ts: torch.Tensor  # int64 [n_events]
    columns: dict[str, torch.Tensor]

    def positions(self, entity: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        """Row of the first event of each entity at or after time."""
        return bisect_rows(self.ts, self.offsets, entity, time)


def source_tensors(src: EventSource, device: torch.device) -> SourceTensors:
    """The source's arrays on `device`, built once per (source, device)."""
    key = str(device)
    if key not in src.device_cache:
        src.device_cache[key] = SourceTensors(
            offsets=as_tensor(np.asarray(src.offsets, np.int64), device),
            ts=as_tensor(src.ts, device),
            columns={c: as_tensor(v, device) for c, v in src.columns.items()},
        )
    return src.device_cache[key]


@dataclass
class Segments:
    """For sorted queries: the rows of the events between each query and the previous one of its entity."""

    pos: torch.Tensor  # int64 [n]: first row at or after the query time (rows before it are history)
    first: torch.Tensor  # bool [n]: first query of its entity
    start: torch.Tensor  # int64 [n]: first row of the query's segment


def segments(st: SourceTensors, e: torch.Tensor, t: torch.Tensor) -> Segments:
    pos = st.positions(e, t)
    first = torch.ones_like(e, dtype=torch.bool)
    first[1:] = e[1:] != e[:-1]
    prev = torch.zeros_like(pos)
    prev[1:] = pos[:-1]
    return Segments(pos, first, torch.where(first, st.offsets[e], prev))


def row_chunks(lengths: torch.Tensor, first: torch.Tensor, max_rows: int = MAX_ROWS) -> list[tuple[int, int]]:
    """Query ranges [a, b) with at most ~max_rows rows each (at least one entity), cut where an entity starts."""
    n = len(lengths)
    cum = np.concatenate([[0], np.cumsum(lengths.cpu().numpy())])  # [n + 1]
    cuts = np.append(np.nonzero(first.cpu().numpy())[0], n)
    cuts = cuts[cuts > 0]  # possible chunk ends
    out, a = [], 0
    while a < n:
        at_least = np.searchsorted(cuts, a, side="right")  # the next entity boundary after a
        within = np.searchsorted(cum[cuts], cum[a] + max_rows, side="right") - 1
        b = int(cuts[max(at_least, within)])
        out.append((a, b))
        a = b
    return out


def decayed_sums(
    values: torch.Tensor, owner: torch.Tensor, dt_s: torch.Tensor, chans: torch.Tensor,
    rates: torch.Tensor, n: int, channels: int, out: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """Per query and rate: sum over its rows of value * exp(-dt * rate). Returns [n, R, channels] float32:
    `out` (contiguous, overwritten) when given, so a caller's block of sums needs no temporary.

    values [m, K] float32, chans [m, K] int64 (channel of each value), owner [m], dt_s [m] seconds."""
    R = len(rates)
    if out is None:
        out = torch.empty((n, R, channels), dtype=torch.float32, device=values.device)
    flat = out.zero_().view(-1)
    idx = chans.add((owner * (R * channels)).unsqueeze(1)).reshape(-1)  # [m * K]: rate 0's places
    dt = dt_s.to(torch.float32).unsqueeze(1)
    for r in range(R):
        flat.index_add_(0, idx + r * channels, values.mul(torch.exp(dt * -rates[r])).reshape(-1))
    return out


def scan(seg: torch.Tensor, t: torch.Tensor, first: torch.Tensor, rates: torch.Tensor) -> torch.Tensor:
    """In place: seg[j] += exp(-(t_j - t_{j-1}) * rate) * seg[j-1] along each entity's queries. seg [n, R, C]."""
    n = len(t)
    if n == 0:
        return seg
    idx = torch.arange(n, device=t.device)
    run_start = torch.cummax(torch.where(first, idx, torch.zeros_like(idx)), 0).values
    rank = idx - run_start
    gap = torch.zeros(n, dtype=torch.float32, device=t.device)
    gap[1:] = (t[1:] - t[:-1]).to(torch.float32)
    decay = torch.exp(-gap.unsqueeze(1) * rates.unsqueeze(0)).unsqueeze(2)  # [n, R, 1]
    for r in range(1, int(rank.max()) + 1):
        q = torch.nonzero(rank == r).squeeze(1)
        seg[q] += decay[q] * seg[q - 1]
    return seg


def window_sums(
    st: SourceTensors, e: torch.Tensor, t0: torch.Tensor, t1: torch.Tensor, channel_fn, channels: int
) -> torch.Tensor:
    """Undecayed channel sums [n, channels] of the events with t0 <= ts < t1; channel_fn(rows, owner, a) ->
    (chans [m, K], vals [m, K]) for the rows of queries a + owner (as in incremental_sums)."""
    n = len(e)
    lo, hi = st.positions(e, t0), st.positions(e, t1)
    out = torch.zeros(n * channels, dtype=torch.float32, device=e.device)
    first = torch.ones(n, dtype=torch.bool, device=e.device)  # windows are independent: cut anywhere
    for a, b in row_chunks(hi - lo, first):
        owner, rows = expand_ranges_t(lo[a:b], hi[a:b])
        chans, vals = channel_fn(rows, owner, a)
        idx = chans + ((owner + a) * channels).unsqueeze(1)
        out.index_add_(0, idx.reshape(-1), vals.reshape(-1))
    return out.view(n, channels)


def day_of(ts: torch.Tensor) -> torch.Tensor:
    return torch.div(ts, DAY, rounding_mode="floor")


def new_day(st: SourceTensors, rows: torch.Tensor, run_start: torch.Tensor) -> torch.Tensor:
    """1.0 where the event is the first of its UTC day within its run of rows (run_start: the run's first row,
    e.g. the entity's first event or a window's first event)."""
    prev = day_of(st.ts[(rows - 1).clamp_min(0)])
    return ((rows == run_start) | (day_of(st.ts[rows]) != prev)).to(torch.float32)


def incremental_sums(
    st: SourceTensors, e: torch.Tensor, t: torch.Tensor, rates: torch.Tensor, channels: int, channel_fn,
    mode: Literal["auto", "direct", "incremental"] = "auto",
) -> tuple[torch.Tensor, Segments]:  # fmt: skip
    """Decayed channel sums [n, R, channels] over all events before each query (queries sorted by entity then
    time). channel_fn(rows, owner, a) -> (chans [m, K], vals [m, K]) for the rows of queries a + owner.

    incremental: every event read once, per-segment scatter-adds, then the decayed scan along each entity's
    queries (a pass over the whole [n, R, channels] block per split point). direct: each query sums all of its
    history, an event read once per later query of its entity. Sparse histories (a few events per entity, many
    split points) are several times cheaper direct; long ones incremental. auto picks the cheaper by counting
    the scatter-adds of each against the scan's passes; both give the same sums up to float rounding."""
    sg = segments(st, e, t)
    history = st.offsets[e]  # each query's first history row: where a direct sum starts
    direct = mode == "direct" or (
        mode == "auto" and _direct_is_cheaper(history, sg, channels, len(rates), channel_fn)
    )
    start = history if direct else sg.start
    sums = torch.empty((len(e), len(rates), channels), dtype=torch.float32, device=e.device)
    for a, b in row_chunks(sg.pos - start, sg.first):
        owner, rows = expand_ranges_t(start[a:b], sg.pos[a:b])
        chans, vals = channel_fn(rows, owner, a)
        decayed_sums(vals, owner, t[a:b][owner] - st.ts[rows], chans, rates, b - a, channels, out=sums[a:b])
        if not direct:
            scan(sums[a:b], t[a:b], sg.first[a:b], rates)
    return sums, sg


SCAN_PASSES = 6  # element passes over [n, R, channels] of the decayed scan (gathers, multiply, add, scatter)


def _direct_is_cheaper(history: torch.Tensor, sg: Segments, channels: int, rates: int, channel_fn) -> bool:
    """Whether summing each query's whole history (from its row `history`) costs fewer element operations than
    the segments + scan."""
    per_event = channel_fn(sg.pos[:0], sg.pos[:0], 0)[0].shape[1]  # values per event (K)
    extra_rows = int((sg.start - history).sum())  # rows the direct sums read again
    return extra_rows * per_event * (rates + 1) < SCAN_PASSES * len(history) * rates * channels


def entity_chunks(sorted_entity: np.ndarray, chunk: int) -> list[tuple[int, int]]:
    """Split a sorted array into ~chunk-sized blocks without cutting an entity's run."""
    n, bounds, a = len(sorted_entity), [], 0
    while a < n:
        b = min(a + chunk, n)
        if b < n:  # move b to the end of the run it falls in
            b = int(np.searchsorted(sorted_entity, sorted_entity[b - 1], side="right"))
        bounds.append((a, b))
        a = b
    return bounds
