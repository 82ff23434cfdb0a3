"""Baselines computed on the same split as the model (docs/design.md, "Evaluation protocol").

Scores that need no training (``recent_activity``, each class's share of recent events: ``class_shares``,
``list_shares``; a task picks its own, tasks/<task>.py ``popularity``), item popularity and each entity's
decayed past items (``decayed_history_items``: "repeat what they bought", used by the recommendation
candidates in candidates/rerank.py). LightGBM on the hand-crafted aggregates is evaluation/gbm.py.
"""

from __future__ import annotations

import numpy as np

from basemodel_pipeline.cache.store import EventCache, expand_ranges
from basemodel_pipeline.dates import DAY


def _window_code_counts(
    cache: EventCache,
    source: str,
    entity: np.ndarray,
    time: np.ndarray,
    days: int,
    column: str,
    class_codes: np.ndarray,
    chunk_events: int = 1 << 24,
) -> tuple[np.ndarray, np.ndarray]:
    """Per query: events in [time - days, time) (``[n]``) and those among them per class code (``[n, C]``)."""
    src = cache.source(source)
    hi = src.positions(entity, time)
    lo = src.positions(entity, time - days * DAY)
    total = (hi - lo).astype(np.float64)
    codes = np.asarray(src.columns[column])
    info = src.info[column]
    lut = np.full(max(info.vocab_size, int(np.max(class_codes, initial=0))) + 1, -1, dtype=np.int64)
    lut[np.asarray(class_codes, dtype=np.int64)] = np.arange(len(class_codes))
    C = len(class_codes)
    counts = np.zeros((len(entity), C), dtype=np.float64)
    n_ev = hi - lo
    # chunks of queries holding at most ~chunk_events events, gathered with one np.repeat each
    ends = np.cumsum(n_ev)
    start_q = 0
    while start_q < len(entity):
        base = ends[start_q - 1] if start_q else 0
        stop_q = max(int(np.searchsorted(ends, base + chunk_events, side="right")), start_q + 1)
        owner, ev = expand_ranges(lo[start_q:stop_q], hi[start_q:stop_q])
        cls = lut[codes[ev]]
        keep = cls >= 0
        n_q = stop_q - start_q
        flat = np.bincount(owner[keep] * C + cls[keep], minlength=n_q * C)
        counts[start_q:stop_q] = flat.reshape(n_q, C)
        start_q = stop_q
    return total, counts


def active_days(src, entity: np.ndarray, time: np.ndarray, days: int) -> np.ndarray:
    """Distinct UTC days with an event in [time - days, time), per query (float64 [n])."""
    owner, rows = src.window_rows(entity, time - days * DAY, time)
    day = np.asarray(src.ts)[rows] // DAY
    pairs = np.unique(owner * (1 << 32) + day)
    return np.bincount(pairs >> 32, minlength=len(entity)).astype(np.float64)


def _queries(entity: np.ndarray, time: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    entity = np.asarray(entity, dtype=np.int64).ravel()
    return entity, np.broadcast_to(np.asarray(time, dtype=np.int64), entity.shape).ravel()


def recent_activity(
    cache: EventCache, entity: np.ndarray, time: np.ndarray, source: str, window_days: int = 28
) -> np.ndarray:
    """Recent activity per query (``entity[i]`` as of ``time[i]``): the number of distinct UTC days with an
    event of ``source`` in the ``window_days`` before the split; **higher = more active** (for a target that
    is the absence of events, churn, take ``-score``). float64 [n]."""
    entity, time = _queries(entity, time)
    return active_days(cache.source(source), entity, time, window_days)


def class_shares(
    cache: EventCache,
    entity: np.ndarray,
    time: np.ndarray,
    source: str,
    column: str,
    class_codes: np.ndarray,
    prior: np.ndarray | None = None,
    window_days: int = 90,
) -> np.ndarray:
    """Per query and class (a vocabulary code of ``column`` in ``class_codes`` [C]): the entity's share of its
    events in the ``window_days`` before the split that carry that code, plus 1e-3 x the class's share among
    all the queries' events in those windows (global popularity, to break ties; it only uses events before
    each split), or 1e-3 x ``prior`` (its first C entries) when given (then a row's score does not depend on
    which other rows are scored with it). float64 [n, C]."""
    entity, time = _queries(entity, time)
    total, counts = _window_code_counts(
        cache, source, entity, time, window_days, column, np.asarray(class_codes)
    )
    glob = (
        counts.sum(axis=0) / max(total.sum(), 1.0) if prior is None else np.asarray(prior)[: counts.shape[1]]
    )
    return counts / np.maximum(total, 1.0)[:, None] + 1e-3 * glob[None, :]


def list_shares(
    cache: EventCache,
    source: str,
    entity: np.ndarray,
    time: np.ndarray,
    columns: list[str],
    prior: np.ndarray | None = None,
    window_days: int = 90,
) -> np.ndarray:
    """Multilabel popularity over a list-valued column: per query, the share of its events in the
    `window_days` before the split whose list holds each value (its 0/1 indicator `columns`), plus
    1e-3 x `prior` to break ties. float64 [n, C]."""
    src = cache.source(source)
    owner, rows = src.window_rows(entity, time - window_days * DAY, time)
    total = np.bincount(owner, minlength=len(entity)).astype(np.float64)
    out = np.zeros((len(entity), len(columns)))
    for j, c in enumerate(columns):
        out[:, j] = np.bincount(owner, weights=np.asarray(src.columns[c])[rows] > 0, minlength=len(entity))
    out /= np.maximum(total, 1.0)[:, None]
    return out + (0.0 if prior is None else 1e-3 * np.asarray(prior)[None, :])


def item_popularity(cache: EventCache, source: str, column: str, time: int, days: int = 28) -> np.ndarray:
    """Events per item (code k -> index k - 1) of all entities in [time - days, time)."""
    src = cache.source(source)
    n_items = src.info[column].vocab_size
    entity = np.arange(cache.n_entities, dtype=np.int64)
    _, rows = src.window_rows(entity, np.full(len(entity), time - days * DAY), np.full(len(entity), time))
    codes = np.asarray(src.columns[column])[rows].astype(np.int64)
    return np.bincount(codes, minlength=n_items + 1)[1:].astype(np.float64)


def decayed_history_items(
    src, column: str, entity: np.ndarray, time: np.ndarray, half_life_days: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The entity's own past items before ``time``: (query index, item index = code - 1, time-decayed count)
    per distinct (query, item), sorted by query."""
    owner, rows = src.window_rows(entity, src.offsets[entity], time)
    w = 0.5 ** ((time[owner] - np.asarray(src.ts)[rows]) / DAY / half_life_days)
    item = np.asarray(src.columns[column])[rows].astype(np.int64) - 1
    ok = item >= 0
    n_items = src.info[column].vocab_size
    key, inv = np.unique(owner[ok] * n_items + item[ok], return_inverse=True)
    weight = np.bincount(inv, weights=w[ok], minlength=len(key))
    return key // n_items, key % n_items, weight
