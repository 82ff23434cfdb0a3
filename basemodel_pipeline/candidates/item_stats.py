"""What the re-ranker (candidates/rerank.py) knows of the items at a split time: each entity's own items with
their statistics (History: counts, decayed counts, recency, active days, intervals) and the items' recent
popularity (PopularityTable) and their neighbours by co-occurrence (CooccurrenceTable), all read from the
event cache before the split time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.dates import DAY


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
WINDOWS = (1, 3, 7, 14, 28)  # days of the popularity windows: short-lived items are popular for days


@dataclass
class ItemPopularity:
    """What everyone did with each item before one split time: events in each window, and the item's age."""

    counts: dict[int, np.ndarray]  # window days (WINDOWS) -> events per item in [t - days, t)
    age: np.ndarray  # [n_items] days since the item's first event before t (inf: not seen yet)
    order: np.ndarray  # items by 28-day count, ties by the last week: the popular list
    rank: np.ndarray  # [n_items] position of each item in `order`

    def top(self, k: int, days: int = 28) -> np.ndarray:
        """The k items with the most events in the last `days` (ties by the 28-day count)."""
        if days == 28:
            return self.order[:k]
        return np.lexsort((self.rank, -self.counts[days]))[:k]

    def rising(self, k: int) -> np.ndarray:
        """The k items whose last 3 days are busiest relative to their 28 days (at least 2 events in them)."""
        score = np.where(self.counts[3] >= 2, self.trend(3, 28), -np.inf)
        top = np.argsort(-score, kind="stable")[:k]
        return top[np.isfinite(score[top])]

    def newest(self, k: int) -> np.ndarray:
        """The k youngest items with an event in the last week (launches)."""
        age = np.where(self.counts[7] > 0, self.age, np.inf)
        top = np.argsort(age, kind="stable")[:k]
        return top[np.isfinite(age[top])]

    def trend(self, short: int, long: int) -> np.ndarray:
        """Events per day in the short window over those in the long one (smoothed): > 1 rising, < 1 fading."""
        return (self.counts[short] * (long / short) + 1.0) / (self.counts[long] + 1.0)


class PopularityTable:
    """Item popularity in the WINDOWS before a time, the item's age and the popular list, per distinct time."""

    def __init__(self, cache: EventCache, source: str, column: str) -> None:
        self.cache, self.source, self.column = cache, source, column
        self._by_time: dict[int, ItemPopularity] = {}
        self._first_seen: np.ndarray | None = None

    def first_seen(self) -> np.ndarray:
        """[n_items] Unix seconds of each item's first event in the source (inf: never)."""
        if self._first_seen is None:
            src = self.cache.source(self.source)
            codes = np.asarray(src.columns[self.column]).astype(np.int64)
            first = np.full(src.info[self.column].vocab_size + 1, np.inf)
            np.minimum.at(first, codes, np.asarray(src.ts, np.float64))
            self._first_seen = first[1:]
        return self._first_seen

    def snapshot(self, t: int) -> ItemPopularity:
        if t not in self._by_time:
            src = self.cache.source(self.source)
            n_items = src.info[self.column].vocab_size
            entity = np.arange(self.cache.n_entities, dtype=np.int64)
            start = np.full(len(entity), t - max(WINDOWS) * DAY)
            _, rows = src.window_rows(entity, start, np.full(len(entity), t))
            codes = np.asarray(src.columns[self.column])[rows].astype(np.int64)
            ts = np.asarray(src.ts)[rows]
            counts = {
                w: np.bincount(codes[ts >= t - w * DAY], minlength=n_items + 1)[1:].astype(np.float64)
                for w in WINDOWS
            }
            order = np.lexsort((-counts[7], -counts[28]))  # 28-day count, ties by the last week
            rank = np.empty(len(order), np.float64)
            rank[order] = np.arange(len(order))
            first = self.first_seen()
            age = np.where(first < t, (t - first) / DAY, np.inf)
            self._by_time[t] = ItemPopularity(counts, age, order, rank)
        return self._by_time[t]

    def at(self, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(pop7 [n_items], pop28 [n_items], order best first [n_items], rank of each item [n_items])."""
        p = self.snapshot(t)
        return p.counts[7], p.counts[28], p.order, p.rank

    def top(self, t: int, k: int, days: int = 28) -> np.ndarray:
        return self.snapshot(t).top(k, days)


# ---- co-occurrence per split time ------------------------------------------------------------------
COOC_DAYS = 56  # co-occurrence: the items each entity had in these days before the split
COOC_ITEMS = 50  # ... at most its most frequent ones (bounds the pairs per entity at 50 x 50)
COOC_ENTITIES = 200_000  # ... of at most this many entities (a uniform sample beyond: a stable estimate)
NEIGHBOURS = 50  # items kept per item: its most similar ones


class CooccurrenceTable:
    """Item neighbours per distinct split time: items had by the same entities in the COOC_DAYS before it,
    scored by cosine similarity (pairs of entities in common over the root of both items' entity counts),
    the NEIGHBOURS best per item. An entity's score of an item is the sum, over its own items weighted by
    their 30-day decayed count, of the item's similarity to them: "people who had yours also had this"."""

    def __init__(self, cache: EventCache, source: str, column: str, seed: int = 0) -> None:
        self.cache, self.source, self.column, self.seed = cache, source, column, seed
        self._by_time: dict[int, sparse.csr_matrix] = {}

    def neighbours(self, t: int) -> sparse.csr_matrix:
        """[n_items, n_items] similarity of each item (row) to its NEIGHBOURS nearest items (columns)."""
        if t not in self._by_time:
            src = self.cache.source(self.source)
            n_items = src.info[self.column].vocab_size
            entity = np.arange(self.cache.n_entities, dtype=np.int64)
            if len(entity) > COOC_ENTITIES:
                rng = np.random.default_rng(self.seed)
                entity = np.sort(rng.choice(entity, COOC_ENTITIES, replace=False))
            owner, rows = src.window_rows(
                entity, np.full(len(entity), t - COOC_DAYS * DAY), np.full(len(entity), t)
            )
            item = np.asarray(src.columns[self.column])[rows].astype(np.int64) - 1
            ok = item >= 0
            key, count = np.unique(owner[ok] * n_items + item[ok], return_counts=True)
            ent, it = key // n_items, key % n_items
            kept = best_per_group(ent, count, COOC_ITEMS)  # each entity's most frequent items
            X = sparse.csr_matrix((np.ones(len(kept)), (ent[kept], it[kept])), shape=(len(entity), n_items))
            self._by_time[t] = _top_similar(X, NEIGHBOURS)
        return self._by_time[t]

    def scores(self, time: np.ndarray, hist: History, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """(keys row * n_items + item, sorted; scores) of the items similar to the own items of history rows
        a..b, whose split times are time[a:b] (items without a similar own item score 0 and are left out)."""
        n_items = self.cache.source(self.source).info[self.column].vocab_size
        ha, hb = hist.slice(a, b)
        H = sparse.csr_matrix(
            (hist.decay30[ha:hb], (hist.row[ha:hb] - a, hist.item[ha:hb])), shape=(b - a, n_items)
        )
        keys, values = [np.zeros(0, np.int64)], [np.zeros(0)]
        for t in np.unique(time[a:b]):
            r = np.flatnonzero(time[a:b] == t)
            S = (H[r] @ self.neighbours(int(t))).tocoo()
            keys.append((r[S.row] + a) * n_items + S.col)
            values.append(S.data)
        k, v = np.concatenate(keys), np.concatenate(values)
        order = np.argsort(k, kind="stable")
        return k[order], v[order]


def _top_similar(X: sparse.csr_matrix, k: int) -> sparse.csr_matrix:
    """Cosine similarity of X's columns, without the diagonal, the k largest per row."""
    n = X.shape[1]
    had = np.asarray(X.sum(axis=0)).ravel()
    C = (X.T @ X).tocoo()
    off = C.row != C.col
    r, c = C.row[off].astype(np.int64), C.col[off].astype(np.int64)
    v = C.data[off] / np.sqrt(had[r] * had[c])
    keep = best_per_group(r, v, k)
    return sparse.csr_matrix((v[keep], (r[keep], c[keep])), shape=(n, n))


def best_per_group(group: np.ndarray, values: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k highest `values` of each `group`, ordered by group, then by value (ties in input
    order): an entity's top items, an item's nearest neighbours, a row's best candidates."""
    order = np.lexsort((-values, group))
    g = group[order]
    return order[(np.arange(len(order)) - np.searchsorted(g, g)) < k]
