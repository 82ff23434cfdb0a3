"""Hand-crafted aggregate features per (entity, split time), vectorised over the event cache's CSR arrays.

What a good data scientist would build as a baseline (docs/design.md, "Aggregate features"). For every event source, with only the
events strictly before the split time counted (``ts < time``):

- over 7/30/90-day windows and all history: event count, sum of every numeric column, distinct active days
  (UTC calendar days with at least one event);
- per categorical column with ``vocab_size <= 64``: count and share of events of each of its 10 most
  frequent values (codes 1..10) in the 30- and 90-day windows;
- recency (days since the last event, ``AGGREGATE_NO_HISTORY_DAYS`` if none), tenure (days since the first
  event, 0 if none), frequency (active days per 30 days of tenure), monetary (each numeric column summed over
  all history and over 90 days, per active day), mean gap between distinct active days (days, over all
  history and over 90 days; NaN with fewer than two active days).

Main-entity attributes follow as their integer codes (numeric attributes as values), named ``attr.<column>``;
``categorical_feature_indices`` lists the ones LightGBM should treat as categorical.

Method (features/kernels.py): the windowed sums scatter-add the rows of the last 90 days of each query; the
all-history sums use the incremental pass over sorted queries (every event read once, whatever the number of
split points). Memory is bounded by the chunk sizes, not by the number of events: nothing per event is held
beyond the cache's memory maps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from basemodel_pipeline.cache.store import EventCache, EventSource, expand_ranges_t
from basemodel_pipeline.dates import DAY
from basemodel_pipeline.features.kernels import (
    SourceTensors,
    as_tensor,
    entity_chunks,
    incremental_sums,
    new_day,
    row_chunks,
    source_tensors,
    window_sums,
)

WINDOWS_DAYS = (7, 30, 90)
TOP_VALUE_WINDOWS_DAYS = (30, 90)
TOP_VALUES = 10
MAX_TOP_VOCAB = 64
# Recency (days) of an entity with no event before the split, in the aggregate features (not the sketch's
# SKETCH_NO_HISTORY_DAYS (features/transforms.py): each is part of what its trained models saw).
AGGREGATE_NO_HISTORY_DAYS = 10_000.0
CHUNK = 1 << 16  # queries per chunk


@dataclass
class _Layout:
    """Channels of one source: 0 count, 1 new active day, numeric columns, then top-value indicators."""

    numeric: list[str]
    tops: list[tuple[str, int]]  # (categorical column, number of top codes)

    @property
    def base(self) -> int:
        return 2 + len(self.numeric)

    @property
    def width(self) -> int:
        return self.base + sum(k for _, k in self.tops) + 1  # + 1 sink channel for codes outside the top


def _layout(src: EventSource) -> _Layout:
    numeric = [c for c, i in src.info.items() if i.type == "numeric"]
    tops = [
        (c, min(TOP_VALUES, i.vocab_size))
        for c, i in src.info.items()
        if i.type == "categorical" and 0 < i.vocab_size <= MAX_TOP_VOCAB
    ]
    return _Layout(numeric, tops)


def feature_names(cache: EventCache) -> list[str]:
    """Names of the columns ``aggregate_features`` returns, in order."""
    names: list[str] = []
    for sname, src in cache.sources.items():
        lay = _layout(src)
        for w in (*WINDOWS_DAYS, "all"):
            tag = f"{w}d" if w != "all" else "all"
            names += [f"{sname}.count_{tag}", f"{sname}.days_{tag}"]
            names += [f"{sname}.{c}.sum_{tag}" for c in lay.numeric]
        for w in TOP_VALUE_WINDOWS_DAYS:
            for c, n_top in lay.tops:
                for k in range(1, n_top + 1):
                    names += [f"{sname}.{c}#{k}.count_{w}d", f"{sname}.{c}#{k}.share_{w}d"]
        names += [f"{sname}.recency_days", f"{sname}.tenure_days", f"{sname}.frequency_days_per_30d"]
        for tag in ("all", "90d"):
            names += [f"{sname}.{c}.per_active_day_{tag}" for c in lay.numeric]
            names.append(f"{sname}.mean_gap_days_{tag}")
    names += [f"attr.{c}" for c in cache.attribute_info]
    return names


def _channels(
    st: SourceTensors, lay: _Layout, rows: torch.Tensor, entity_start: torch.Tensor, with_tops: bool
):
    """Channel indices [m, K] and values [m, K] of rows for this layout (row-major: see event_channels_t)."""
    m, dev = len(rows), rows.device
    chans = [torch.zeros(m, dtype=torch.int64, device=dev), torch.ones(m, dtype=torch.int64, device=dev)]
    vals = [torch.ones(m, dtype=torch.float32, device=dev), new_day(st, rows, entity_start)]
    for j, c in enumerate(lay.numeric):
        chans.append(torch.full((m,), 2 + j, dtype=torch.int64, device=dev))
        vals.append(st.columns[c][rows].to(torch.float32))
    if with_tops:
        off = lay.base
        for c, k in lay.tops:
            code = st.columns[c][rows].to(torch.int64)
            inside = (code >= 1) & (code <= k)
            chans.append(torch.where(inside, off + code - 1, torch.full_like(code, lay.width - 1)))
            vals.append(torch.ones(m, dtype=torch.float32, device=dev))
            off += k
    return torch.stack(chans, 1), torch.stack(vals, 1)


def _all_history(
    st: SourceTensors, lay: _Layout, e: torch.Tensor, t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cumulative (undecayed) sums [n, base] over all events before each sorted query, and its end rows."""

    def channels(rows: torch.Tensor, owner: torch.Tensor, a: int):
        return _channels(st, lay, rows, st.offsets[e[a + owner]], with_tops=False)

    sums, sg = incremental_sums(st, e, t, torch.zeros(1, device=e.device), lay.base, channels)
    return sums[:, 0], sg.pos


def _windows(
    st: SourceTensors, lay: _Layout, e: torch.Tensor, t: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor
) -> torch.Tensor:
    """Sums [n, len(WINDOWS_DAYS), width] over the events in each window before each query; rows [lo, hi)
    span the longest window."""
    n, W, dev = len(e), len(WINDOWS_DAYS), e.device
    out = torch.zeros(n * W * lay.width, dtype=torch.float32, device=dev)
    for a, b in row_chunks(hi - lo, torch.ones(n, dtype=torch.bool, device=dev)):
        owner, rows = expand_ranges_t(lo[a:b], hi[a:b])
        chans, vals = _channels(st, lay, rows, st.offsets[e[a:b]][owner], with_tops=True)
        dt_s = t[a:b][owner] - st.ts[rows]
        for wi, w in enumerate(WINDOWS_DAYS):
            inside = (dt_s <= w * DAY).to(torch.float32).unsqueeze(1)
            idx = chans + (((owner + a) * W + wi) * lay.width).unsqueeze(1)
            out.index_add_(0, idx.reshape(-1), (vals * inside).reshape(-1))
    return out.view(n, W, lay.width)


def all_history_totals(
    cache: EventCache, e: torch.Tensor, t: torch.Tensor
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per source: (sums [n, base] of count, active days and numeric columns over all events before each
    sorted query, first row at/after the query [n]). Additive over time: see advance_sums."""
    out = {}
    for name, src in cache.sources.items():
        out[name] = _all_history(source_tensors(src, e.device), _layout(src), e, t)
    return out


def window_totals(cache: EventCache, e: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per source: the windowed sums [n, len(WINDOWS_DAYS), width] of aggregate_features_t (events in
    [t - w days, t) per window w) of sorted queries."""
    out = {}
    for name, src in cache.sources.items():
        st, lay = source_tensors(src, e.device), _layout(src)
        lo = st.positions(e, t - max(WINDOWS_DAYS) * DAY)
        out[name] = _windows(st, lay, e, t, lo, st.positions(e, t))
    return out


def advance_sums(
    cache: EventCache,
    e: torch.Tensor,
    t0: int,
    t1: int,
    totals: dict[str, torch.Tensor],
    windows: dict[str, torch.Tensor],
) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], dict[str, torch.Tensor]]:
    """all_history_totals and window_totals of entities `e` at t1 from their values at t0 (UTC midnights,
    t0 <= t1), reading only the events in [t0, t1) and those leaving each window, [t0 - w, t1 - w):

        total(t1) = total(t0) + S[t0, t1)          window_w(t1) = window_w(t0) + S[t0, t1) - S[t0 - w, t1 - w)

    Returns ({source: (totals [n, base], first row at/after t1)}, {source: windows [n, W, width]})."""
    n, dev = len(e), e.device
    T0, T1 = (torch.full((n,), t, dtype=torch.int64, device=dev) for t in (t0, t1))
    new_totals, new_windows = {}, {}
    for name, src in cache.sources.items():
        st, lay = source_tensors(src, dev), _layout(src)

        def channels(
            rows: torch.Tensor, owner: torch.Tensor, a: int, st: SourceTensors = st, lay: _Layout = lay
        ) -> tuple[torch.Tensor, torch.Tensor]:
            # a row's new-day flag is the entity's own (first event of its UTC day): what a midnight window counts
            return _channels(st, lay, rows, st.offsets[e[a + owner]], with_tops=True)

        added = window_sums(st, e, T0, T1, channels, lay.width)
        new_totals[name] = (totals[name] + added[:, : lay.base], st.positions(e, T1))
        win = windows[name].clone()
        for wi, w in enumerate(WINDOWS_DAYS):
            win[:, wi] += added - window_sums(st, e, T0 - w * DAY, T1 - w * DAY, channels, lay.width)
        new_windows[name] = win
    return new_totals, new_windows


def aggregate_features_t(
    cache: EventCache,
    e: torch.Tensor,
    t: torch.Tensor,
    totals: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
    windows: dict[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Aggregate features [n, F] float32 of queries sorted by (entity, time), on e's device.

    ``totals`` (all_history_totals) and ``windows`` (window_totals), e.g. advanced with advance_sums, skip the
    passes over the events: then only one row per entity and window is read (first/last event times)."""
    cols: list[torch.Tensor] = []
    t64 = t.to(torch.float64)
    for name, src in cache.sources.items():
        st, lay = source_tensors(src, e.device), _layout(src)
        total, hi = totals[name] if totals is not None else _all_history(st, lay, e, t)
        lo = {w: st.positions(e, t - w * DAY) for w in WINDOWS_DAYS}  # first row of each window
        win = windows[name] if windows is not None else _windows(st, lay, e, t, lo[max(WINDOWS_DAYS)], hi)
        last_event = max(len(st.ts) - 1, 0)
        start = st.offsets[e]
        has = hi > start
        last_row = (hi - 1).clamp_min(0)
        days: dict[object, torch.Tensor] = {}
        for wi, w in enumerate(WINDOWS_DAYS):
            partial = (lo[w] < hi) & (new_day(st, lo[w].clamp_max(last_event), start) == 0)
            days[w] = win[:, wi, 1] + partial.to(torch.float32)  # the window starts inside a counted day
            cols += [win[:, wi, 0], days[w], *win[:, wi, 2 : lay.base].unbind(1)]
        days["all"] = total[:, 1]
        cols += [total[:, 0], days["all"], *total[:, 2:].unbind(1)]
        for w in TOP_VALUE_WINDOWS_DAYS:
            wi = WINDOWS_DAYS.index(w)
            off = lay.base
            for _, k in lay.tops:
                for j in range(k):
                    cnt = win[:, wi, off + j]
                    cols += [cnt, cnt / win[:, wi, 0].clamp_min(1.0)]
                off += k
        ts_last, ts_first = st.ts[last_row].to(torch.float64), st.ts[start.clamp_max(last_event)]
        recency = torch.where(has, (t64 - ts_last) / DAY, torch.full_like(t64, AGGREGATE_NO_HISTORY_DAYS))
        tenure = torch.where(has, (t64 - ts_first.to(torch.float64)) / DAY, torch.zeros_like(t64))
        cols += [recency, tenure, days["all"] * 30.0 / tenure.clamp_min(1.0)]
        day_last = torch.div(st.ts[last_row], DAY, rounding_mode="floor")
        firsts = {"all": ts_first, 90: st.ts[lo[90].clamp_max(last_event)]}
        sums = {"all": total[:, 2 : lay.base], 90: win[:, WINDOWS_DAYS.index(90), 2 : lay.base]}
        for w in ("all", 90):
            cols += list((sums[w] / days[w].clamp_min(1.0).unsqueeze(1)).unbind(1))
            span = (day_last - torch.div(firsts[w], DAY, rounding_mode="floor")).to(torch.float64)
            gap = torch.where(days[w] >= 2, span / (days[w].to(torch.float64) - 1), torch.nan)
            cols.append(gap)
    for c in cache.attribute_info:
        cols.append(as_tensor(np.asarray(cache.attributes[c]), e.device)[e].to(torch.float64))
    if not cols:
        return torch.zeros((len(e), 0), dtype=torch.float32, device=e.device)
    return torch.stack([c.to(torch.float32) for c in cols], 1)


def aggregate_features(
    cache: EventCache, entity: np.ndarray, time: np.ndarray
) -> tuple[np.ndarray, list[str]]:
    """Aggregate features of each query (``entity[i]`` as of ``time[i]``).

    Args:
        cache: the event cache.
        entity: int64 [n] entity indices.
        time: int64 [n] (or a scalar) epoch seconds, the split time; only events with ``ts < time`` count.

    Returns:
        ``(X, names)``: float32 [n, F] and the F feature names (see the module docstring).
    """
    entity = np.asarray(entity, dtype=np.int64).ravel()
    time = np.broadcast_to(np.asarray(time, dtype=np.int64), entity.shape).ravel()
    if entity.size and (entity.min() < 0 or entity.max() >= cache.n_entities):
        raise ValueError(f"entity index out of range [0, {cache.n_entities})")
    names = feature_names(cache)
    X = np.empty((entity.shape[0], len(names)), dtype=np.float32)
    order = np.lexsort((time, entity))
    for a, b in entity_chunks(entity[order], CHUNK):
        idx = order[a:b]
        X[idx] = aggregate_features_t(
            cache, torch.from_numpy(entity[idx]), torch.from_numpy(time[idx])
        ).numpy()
    return X, names


def categorical_feature_indices(cache: EventCache, names: list[str]) -> list[int]:
    """Column indices (in ``names``) of the categorical main-entity attributes, for LightGBM."""
    cats = {f"attr.{c}" for c, i in cache.attribute_info.items() if i.type == "categorical"}
    return [j for j, n in enumerate(names) if n in cats]
