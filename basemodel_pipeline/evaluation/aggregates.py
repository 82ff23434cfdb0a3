"""Hand-crafted aggregate features per (entity, split time), vectorised over the event cache's CSR arrays.

What a good data scientist would build as a baseline (DESIGN.md §6). For every event source, with only the
events strictly before the split time counted (``ts < time``):

- over 7/30/90-day windows and all history: event count, sum of every numeric column, distinct active days
  (UTC calendar days with at least one event);
- per categorical column with ``vocab_size <= 64``: count and share of events of each of its 10 most
  frequent values (codes 1..10) in the 30- and 90-day windows;
- recency (days since the last event, ``NO_HISTORY_DAYS`` if none), tenure (days since the first event,
  0 if none), frequency (active days per 30 days of tenure), monetary (each numeric column summed over
  all history and over 90 days, per active day), mean gap between distinct active days (days, over all
  history and over 90 days; NaN with fewer than two active days).

Main-entity attributes follow as their integer codes (numeric attributes as values), named ``attr.<column>``;
``categorical_feature_indices`` lists the ones LightGBM should treat as categorical.

Method: ``EventSource.positions`` (one composite sort key per source) turns the per-entity
``searchsorted`` into one global ``np.searchsorted``; window sums are differences of prefix sums
(``cumsum[hi] - cumsum[lo]``). No Python loop over events or entities. The prefix sums of the last cache used
are kept (one slot), so calling once per split date costs the preparation once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from basemodel_pipeline.cache.store import DAY, EventCache, EventSource

WINDOWS_DAYS = (7, 30, 90)
TOP_VALUE_WINDOWS_DAYS = (30, 90)
TOP_VALUES = 10
MAX_TOP_VOCAB = 64
NO_HISTORY_DAYS = 10_000.0
CHUNK = 1 << 18  # queries per chunk


@dataclass
class _Prepared:
    """Per-source arrays derived once from the cache."""

    offsets: np.ndarray  # int64 [n_entities + 1]
    ts: np.ndarray  # int64 [n_events + 1] (one padding element, so that any index in 0..n_events is valid)
    src: EventSource  # its positions() finds window bounds (one searchsorted over a composite key)
    day: np.ndarray  # int64 [n_events + 1]: UTC day index (padded)
    new_day: np.ndarray  # bool [n_events + 1]: first event of its (entity, day) (padded)
    cum_days: np.ndarray  # int64 [n_events + 1]: prefix sum of new_day
    cum_num: dict[str, np.ndarray]  # float64 [n_events + 1] per numeric column
    cum_top: dict[tuple[str, int], np.ndarray]  # int64 [n_events + 1] per (categorical column, code)


def _prefix(a: np.ndarray, dtype) -> np.ndarray:
    out = np.zeros(a.shape[0] + 1, dtype=dtype)
    np.cumsum(a, dtype=dtype, out=out[1:])
    return out


def _prepare(src: EventSource, n_entities: int) -> _Prepared:
    offsets = np.asarray(src.offsets, dtype=np.int64)
    ts = np.asarray(src.ts, dtype=np.int64)
    n = ts.shape[0]
    ent = np.repeat(np.arange(n_entities, dtype=np.int64), np.diff(offsets))
    day = ts // DAY
    new_day = np.ones(n + 1, dtype=bool)
    if n > 1:
        new_day[1:n] = (day[1:] != day[:-1]) | (ent[1:] != ent[:-1])
    cum_num = {
        c: _prefix(np.asarray(v), np.float64) for c, v in src.columns.items() if src.info[c].type == "numeric"
    }
    cum_top: dict[tuple[str, int], np.ndarray] = {}
    for c, v in src.columns.items():
        info = src.info[c]
        if info.type == "categorical" and 0 < info.vocab_size <= MAX_TOP_VOCAB:
            codes = np.asarray(v)
            for k in range(1, min(TOP_VALUES, info.vocab_size) + 1):
                cum_top[(c, k)] = _prefix(codes == k, np.int64)
    return _Prepared(
        offsets=offsets,
        ts=np.append(ts, 0),
        src=src,
        day=np.append(day, 0),
        new_day=new_day,
        cum_days=_prefix(new_day[:n], np.int64),
        cum_num=cum_num,
        cum_top=cum_top,
    )


_LOCK = threading.Lock()
_SLOT: dict[str, object] = {}


def _prepared(cache: EventCache) -> dict[str, _Prepared]:
    """Prepared arrays of every source of ``cache``, reusing the last call's when it was the same object."""
    with _LOCK:
        if _SLOT.get("cache") is cache:
            return _SLOT["prep"]  # type: ignore[return-value]
    prep = {name: _prepare(src, cache.n_entities) for name, src in cache.sources.items()}
    with _LOCK:
        _SLOT.clear()
        _SLOT.update(cache=cache, prep=prep)
    return prep


def _bounds(p: _Prepared, entity: np.ndarray, time: np.ndarray) -> np.ndarray:
    """Index of the first event of ``entity`` with ts >= ``time`` (= end of the events before ``time``)."""
    return p.src.positions(entity, time).astype(np.int64)


def _days_between(p: _Prepared, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Distinct active days among events lo..hi-1 (one entity each)."""
    first_partial = (hi > lo) & ~p.new_day[lo]  # the window starts inside a day already counted before it
    return (p.cum_days[hi] - p.cum_days[lo] + first_partial).astype(np.float64)


def feature_names(cache: EventCache) -> list[str]:
    """Names of the columns ``aggregate_features`` returns, in order."""
    return _features(cache, np.zeros(0, np.int64), np.zeros(0, np.int64), names_only=True)[1]


def _features(
    cache: EventCache, entity: np.ndarray, time: np.ndarray, names_only: bool = False
) -> tuple[list[np.ndarray], list[str]]:
    cols: list[np.ndarray] = []
    names: list[str] = []
    prep = {} if names_only else _prepared(cache)

    def add(name: str, value: np.ndarray | None) -> None:
        names.append(name)
        if not names_only:
            cols.append(value)  # type: ignore[arg-type]

    for sname, src in cache.sources.items():
        p = prep.get(sname)
        numeric = [c for c, i in src.info.items() if i.type == "numeric"]
        tops = [
            (c, min(TOP_VALUES, i.vocab_size))
            for c, i in src.info.items()
            if i.type == "categorical" and 0 < i.vocab_size <= MAX_TOP_VOCAB
        ]
        if p is not None:
            hi = _bounds(p, entity, time)
            start = p.offsets[entity]
            lo = {w: _bounds(p, entity, time - w * DAY) for w in WINDOWS_DAYS}
            lo["all"] = start
        counts: dict[object, np.ndarray] = {}
        days: dict[object, np.ndarray] = {}
        for w in (*WINDOWS_DAYS, "all"):
            tag = f"{w}d" if w != "all" else "all"
            if p is not None:
                counts[w] = (hi - lo[w]).astype(np.float64)
                days[w] = _days_between(p, lo[w], hi)
            add(f"{sname}.count_{tag}", counts.get(w))
            add(f"{sname}.days_{tag}", days.get(w))
            for c in numeric:
                add(f"{sname}.{c}.sum_{tag}", None if p is None else p.cum_num[c][hi] - p.cum_num[c][lo[w]])
        for w in TOP_VALUE_WINDOWS_DAYS:
            for c, n_top in tops:
                for k in range(1, n_top + 1):
                    cnt = share = None
                    if p is not None:
                        cs = p.cum_top[(c, k)]
                        cnt = (cs[hi] - cs[lo[w]]).astype(np.float64)
                        share = cnt / np.maximum(counts[w], 1.0)
                    add(f"{sname}.{c}#{k}.count_{w}d", cnt)
                    add(f"{sname}.{c}#{k}.share_{w}d", share)
        # recency, tenure, frequency, monetary, inter-event gaps
        if p is not None:
            any_hist = hi > start
            last, first = p.ts[np.maximum(hi - 1, 0)], p.ts[start]
            recency = np.where(any_hist, (time - last) / DAY, NO_HISTORY_DAYS)
            tenure = np.where(any_hist, (time - first) / DAY, 0.0)
        add(f"{sname}.recency_days", None if p is None else recency)
        add(f"{sname}.tenure_days", None if p is None else tenure)
        add(
            f"{sname}.frequency_days_per_30d",
            None if p is None else days["all"] * 30.0 / np.maximum(tenure, 1.0),
        )
        for w in ("all", 90):
            tag = f"{w}d" if w != "all" else "all"
            for c in numeric:
                val = None
                if p is not None:
                    val = (p.cum_num[c][hi] - p.cum_num[c][lo[w]]) / np.maximum(days[w], 1.0)
                add(f"{sname}.{c}.per_active_day_{tag}", val)
            gap = None
            if p is not None:
                d_first, d_last = p.day[lo[w]], p.day[np.maximum(hi - 1, 0)]
                with np.errstate(invalid="ignore", divide="ignore"):
                    gap = np.where(days[w] >= 2, (d_last - d_first) / (days[w] - 1), np.nan)
            add(f"{sname}.mean_gap_days_{tag}", gap)
    for c in cache.attribute_info:
        add(f"attr.{c}", None if names_only else np.asarray(cache.attributes[c])[entity].astype(np.float64))
    return cols, names


def aggregate_features(
    cache: EventCache, entity: np.ndarray, time: np.ndarray
) -> tuple[np.ndarray, list[str]]:
    """Aggregate features of each query (``entity[i]`` as of ``time[i]``).

    Args:
        cache: the event cache (anything with ``n_entities``, ``sources``, ``attributes``, ``attribute_info``).
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
    for s in range(0, entity.shape[0], CHUNK):
        cols, _ = _features(cache, entity[s : s + CHUNK], time[s : s + CHUNK])
        for j, col in enumerate(cols):
            X[s : s + CHUNK, j] = col
    return X, names


def categorical_feature_indices(cache: EventCache, names: list[str]) -> list[int]:
    """Column indices (in ``names``) of the categorical main-entity attributes, for LightGBM."""
    cats = {f"attr.{c}" for c, i in cache.attribute_info.items() if i.type == "categorical"}
    return [j for j, n in enumerate(names) if n in cats]
