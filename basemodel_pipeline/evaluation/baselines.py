"""Baselines computed on the same split as the model (DESIGN.md §6).

LightGBM on the hand-crafted aggregates (binary, multiclass, one-vs-rest multilabel, regression), popularity
scores, and for recommendation "repeat what they bought" and item popularity (``recommendation_topk``).
"""

from __future__ import annotations

import numpy as np

from basemodel_pipeline.cache.store import EventCache, expand_ranges
from basemodel_pipeline.dates import DAY


def lightgbm_scores(
    task: str,
    X_train: np.ndarray,
    Y_train: np.ndarray,
    X_val: np.ndarray,
    Y_val: np.ndarray,
    X_test: np.ndarray,
    categorical_features: list[int] | None = None,
    seed: int = 0,
) -> np.ndarray:
    """Test scores of gradient-boosted trees trained on (X_train, Y_train), early-stopped on (X_val, Y_val)
    (evaluation/gbm.py: fit_gbm, which documents the tasks, stopping and constant columns).

    Returns:
        float64 for X_test: probabilities [n_test] (binary), [n_test, C] (multilabel, multiclass), or
        predicted values [n_test] (regression).
    """
    from basemodel_pipeline.evaluation.gbm import fit_gbm

    return fit_gbm(task, X_train, Y_train, X_val, Y_val, categorical_features, seed).predict(X_test)


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


def popularity_scores(
    task: str,
    cache: EventCache,
    entity: np.ndarray,
    time: np.ndarray,
    source: str,
    column: str | None = None,
    class_codes: np.ndarray | None = None,
    window_days: int | None = None,
    prior: np.ndarray | None = None,
) -> np.ndarray:
    """Popularity / recent-activity baseline scores per query (``entity[i]`` as of ``time[i]``).

    - ``binary``: the number of distinct active days (UTC days with an event of ``source``) in the 28 days
      (``window_days``) before the split; **higher = more active**. For churn (positive = no activity) pass ``-score``.
      Returns float64 [n].
    - ``multilabel``: for each class (a vocabulary code of ``column`` in ``class_codes`` [C]), the entity's
      share of its events in the 90 days (``window_days``) before the split that carry that code, plus 1e-3 x the class's
      share among all the queries' events in those windows (global popularity, to break ties; it only uses
      events before each split), or 1e-3 x ``prior`` [C] when given (then a row's score does not depend on
      which other rows are scored with it). Returns float64 [n, C].
    """
    entity = np.asarray(entity, dtype=np.int64).ravel()
    time = np.broadcast_to(np.asarray(time, dtype=np.int64), entity.shape).ravel()
    cache.source(source)
    if task == "binary":
        return active_days(cache.source(source), entity, time, window_days or 28)
    if task == "multilabel":
        if column is None or class_codes is None:
            raise ValueError("multilabel popularity needs column and class_codes")
        total, counts = _window_code_counts(
            cache, source, entity, time, window_days or 90, column, np.asarray(class_codes)
        )
        share = counts / np.maximum(total, 1.0)[:, None]
        glob = counts.sum(axis=0) / max(total.sum(), 1.0) if prior is None else np.asarray(prior)
        return share + 1e-3 * glob[None, :]
    if task == "multiclass":
        if column is None or class_codes is None:
            raise ValueError("multiclass popularity needs column and class_codes")
        total, counts = _window_code_counts(
            cache, source, entity, time, window_days or 90, column, np.asarray(class_codes)
        )
        glob = (
            counts.sum(axis=0) / max(total.sum(), 1.0)
            if prior is None
            else np.asarray(prior)[: counts.shape[1]]
        )
        return counts / np.maximum(total, 1.0)[:, None] + 1e-3 * glob[None, :]
    raise ValueError(f"popularity_scores supports binary, multilabel and multiclass tasks, not '{task}'")


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


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the k highest scores per row, best first."""
    k = min(k, scores.shape[1])
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, 1), axis=1, kind="stable")
    return np.take_along_axis(part, order, 1)


def item_popularity(cache: EventCache, source: str, column: str, time: int, days: int = 28) -> np.ndarray:
    """Events per item (code k -> index k - 1) of all entities in [time - days, time)."""
    src = cache.source(source)
    n_items = src.info[column].vocab_size
    entity = np.arange(cache.n_entities, dtype=np.int64)
    _, rows = src.window_rows(entity, np.full(len(entity), time - days * DAY), np.full(len(entity), time))
    codes = np.asarray(src.columns[column])[rows].astype(np.int64)
    return np.bincount(codes, minlength=n_items + 1)[1:].astype(np.float64)


def recommendation_topk(
    kind: str,
    cache: EventCache,
    entity: np.ndarray,
    time: np.ndarray,
    source: str,
    column: str,
    k: int,
    half_life_days: float = 30.0,
    chunk: int = 128,
) -> np.ndarray:
    """Top-k item indices [n, k] (item code - 1) of a recommendation baseline, best first.

    - ``popularity``: the items most bought by everyone in the 28 days before each split time.
    - ``repeat``: "repeat what they bought": the entity's own past items by time-decayed count (half-life
      ``half_life_days``), then popular items to fill the list.
    """
    if kind not in ("popularity", "repeat"):
        raise ValueError(f"recommendation baseline '{kind}' is not one of: popularity, repeat")
    entity = np.asarray(entity, dtype=np.int64)
    time = np.asarray(time, dtype=np.int64)
    src = cache.source(source)
    n_items = src.info[column].vocab_size
    out = np.zeros((len(entity), min(k, n_items)), dtype=np.int64)
    pops = {int(t): item_popularity(cache, source, column, int(t)) for t in np.unique(time)}
    if kind == "popularity":
        for t, pop in pops.items():
            out[time == t] = _top_k(pop[None, :], k)[0]
        return out
    for a in range(0, len(entity), chunk):
        e, t = entity[a : a + chunk], time[a : a + chunk]
        pop = np.stack([pops[int(x)] for x in t])
        scores = 1e-9 * pop / np.maximum(pop.max(1, keepdims=True), 1.0)
        owner, item, w = decayed_history_items(src, column, e, t, half_life_days)
        np.add.at(scores, (owner, item), w)
        out[a : a + chunk] = _top_k(scores, k)
    return out


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
