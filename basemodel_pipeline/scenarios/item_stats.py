"""What the re-ranker (scenarios/rerank.py) knows of the items at a split time: each entity's own items with
their statistics (History: counts, decayed counts, recency, active days, intervals) and the items' recent
popularity (PopularityTable), both read from the event cache before the split time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.dates import DAY
from basemodel_pipeline.evaluation.baselines import item_popularity


# ---- the entity's own items ------------------------------------------------------------------------
@dataclass
class History:
    """Distinct (row, item) pairs of the rows' past events, sorted by row then item, with statistics."""

    row: np.ndarray
    item: np.ndarray  # item index = code - 1
    count: np.ndarray
    decay7: np.ndarray
    decay30: np.ndarray
    since_last: np.ndarray  # days
    active_days: np.ndarray  # distinct days with the item
    interval: np.ndarray  # mean days between those days (NaN with one day)
    entity_days: np.ndarray  # [n rows] distinct active days of the entity
    entity_recency: np.ndarray  # [n rows] days since the entity's last event
    entity_items: np.ndarray  # [n rows] distinct items

    def slice(self, a: int, b: int) -> tuple[int, int]:
        return int(np.searchsorted(self.row, a)), int(np.searchsorted(self.row, b))


def item_history(
    cache: EventCache, source: str, column: str, entity: np.ndarray, time: np.ndarray
) -> History:
    """Own-item statistics of each row (entity, time) from every event before `time`."""
    src = cache.source(source)
    n_items = src.info[column].vocab_size
    owner, rows = src.window_rows(entity, src.offsets[entity], time)
    ts = np.asarray(src.ts)[rows]
    item = np.asarray(src.columns[column])[rows].astype(np.int64) - 1
    ok = item >= 0
    owner, ts, item = owner[ok], ts[ok], item[ok]
    age = (time[owner] - ts) / DAY
    n = len(entity)
    key, inv = np.unique(owner * n_items + item, return_inverse=True)
    m = len(key)
    count = np.bincount(inv, minlength=m).astype(np.float64)
    decay7 = np.bincount(inv, weights=0.5 ** (age / 7.0), minlength=m)
    decay30 = np.bincount(inv, weights=0.5 ** (age / 30.0), minlength=m)
    last = np.full(m, np.inf)
    np.minimum.at(last, inv, age)
    first = np.zeros(m)
    np.maximum.at(first, inv, age)
    day = ts // DAY
    pair_day = np.unique(inv * (1 << 20) + (day - day.min() if len(day) else day))
    active = np.bincount(pair_day >> 20, minlength=m).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        interval = np.where(active > 1, (first - last) / np.maximum(active - 1, 1), np.nan)
    ent_day = np.unique(owner * (1 << 20) + (day - day.min() if len(day) else day))
    entity_days = np.bincount(ent_day >> 20, minlength=n).astype(np.float64)
    recency = np.full(n, np.inf)
    np.minimum.at(recency, owner, age)
    entity_items = np.bincount(key // n_items, minlength=n).astype(np.float64)
    return History(
        key // n_items,
        key % n_items,
        count,
        decay7,
        decay30,
        last,
        active,
        interval,
        entity_days,
        np.where(np.isfinite(recency), recency, np.nan),
        entity_items,
    )


# ---- popularity per split time ---------------------------------------------------------------------
class PopularityTable:
    """Item popularity (events in the 7 and 28 days before a time) and the popular list, per distinct time."""

    def __init__(self, cache: EventCache, source: str, column: str) -> None:
        self.cache, self.source, self.column = cache, source, column
        self._by_time: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}

    def at(self, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(pop7 [n_items], pop28 [n_items], order best first [n_items], rank of each item [n_items])."""
        if t not in self._by_time:
            p7 = item_popularity(self.cache, self.source, self.column, t, 7)
            p28 = item_popularity(self.cache, self.source, self.column, t, 28)
            order = np.lexsort((-p7, -p28))  # 28-day count, ties by the last week
            rank = np.empty(len(order), np.float64)
            rank[order] = np.arange(len(order))
            self._by_time[t] = (p7, p28, order, rank)
        return self._by_time[t]

    def top(self, t: int, k: int) -> np.ndarray:
        return self.at(t)[2][:k]
