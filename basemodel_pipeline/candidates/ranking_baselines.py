"""The recommendation candidates that rank without a re-ranker of their own: the two popularity baselines,
"repeat what they bought" and "what those who had theirs also had" (no training), and the network's catalogue scores with the entity's own history
(candidates/rerank.py holds the re-ranker and the pool and ranking primitives they share)."""

from __future__ import annotations

from typing import Any

import numpy as np

from basemodel_pipeline.candidates.base import ITEM_STATS, NETWORK, Context, description
from basemodel_pipeline.candidates.inputs import Rows
from basemodel_pipeline.candidates.item_stats import (
    COOC_DAYS,
    NEIGHBOURS,
    WINDOWS,
    CooccurrenceTable,
    History,
    PopularityTable,
    best_per_group,
    item_history,
)
from basemodel_pipeline.candidates.rerank import Pool, item_filter, lookup, ranked, ranking
from basemodel_pipeline.candidates.selection import primary
from basemodel_pipeline.tasks.recommendation import RANKED_ITEMS, REPEAT_WEIGHTS, Recommendation


class _Untrained:
    """A ranking candidate without training: rank() from the rows' own history and item popularity."""

    name = ""
    kind = ""
    text = ""  # describe(): one line

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def fit(self, train: Rows, stop: Rows) -> None:
        pass

    def refit(self, rows: Rows) -> None:
        pass

    def tables(self, rows: Rows) -> tuple[PopularityTable, History]:
        d = ranking(self.ctx).d
        pops = PopularityTable(rows.cache, d.source, d.column)
        return pops, item_history(rows.cache, d.source, d.column, rows.entity, rows.time)

    def rank(self, rows: Rows, k: int = RANKED_ITEMS) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def predict(self, rows: Rows) -> np.ndarray:
        return self.rank(rows)[0]

    def save(self) -> tuple[dict[str, Any], dict[str, bytes]]:
        return {"kind": self.kind}, {}

    def describe(self) -> dict[str, Any]:
        return description(self.name, self.text, [ITEM_STATS], **self.parameters())

    def parameters(self) -> dict[str, Any]:
        return {}


class RepeatPurchases(_Untrained):
    """Baseline: the entity's own past items by decayed count (half-life 30 days), then popular items."""

    name, kind = "repeat_purchases", "repeat"
    text = "baseline: the entity's own past items by decayed count, popular items after them"

    def parameters(self) -> dict[str, Any]:
        return {"half_life_days": 30}

    def rank(self, rows: Rows, k: int = RANKED_ITEMS) -> tuple[np.ndarray, np.ndarray]:
        pops, hist = self.tables(rows)
        score = hist.decay30.astype(np.float64)
        pool = Pool(hist.row, hist.item, np.zeros((len(hist.row), 0), np.float32))
        if item_filter(self.ctx) == "new":  # nothing of their own: the popular items they never had
            pool, score = Pool(pool.row[:0], pool.item[:0], pool.features[:0]), score[:0]
            return ranked(pool, score, len(rows), k, pops, rows.time, exclude=hist)
        return ranked(pool, score, len(rows), k, pops, rows.time)


def _popular(
    ctx: Context, rows: Rows, k: int, days: int, pops: PopularityTable, hist: History
) -> tuple[np.ndarray, np.ndarray]:
    """The items with the most events of everyone in the `days` before each row's split (without the entity's
    own items for ``items: new`` targets), ties by the 28-day count."""
    n_items, rule = ranking(ctx).d.n_items, item_filter(ctx)
    h_keys = hist.row * n_items + hist.item
    parts_r, parts_i, parts_s = [], [], []
    for t in np.unique(rows.time):
        r = np.flatnonzero(rows.time == t)
        p = pops.snapshot(int(t))
        extra = int(hist.entity_items[r].max(initial=0)) if rule == "new" else 0
        top = p.top(min(k + extra, n_items), days)
        parts_r.append(np.repeat(r, len(top)))
        parts_i.append(np.tile(top, len(r)))
        # the window's count, then the 28-day rank as a tie-break below one event
        parts_s.append(np.tile(p.counts[days][top] - p.rank[top] / (len(p.rank) + 1.0), len(r)))
    row, item, s = (np.concatenate(p) for p in (parts_r, parts_i, parts_s))
    if rule == "new":
        seen, _ = lookup(row * n_items + item, h_keys)
        row, item, s = row[~seen], item[~seen], s[~seen]
    pool = Pool(row, item, np.zeros((len(row), 0), np.float32))
    exclude = hist if rule == "new" else None
    return ranked(pool, s.astype(np.float64), len(rows), k, pops, rows.time, exclude)


class RecommendPopularity(_Untrained):
    """Baseline: the items most bought by everyone in the 28 days before the split (without the entity's own
    items for ``items: new`` targets)."""

    name, kind = "popularity", "recommend_popularity"
    text = "baseline: the items most bought by everyone in the days before the split"

    def parameters(self) -> dict[str, Any]:
        return {"window_days": 28}

    def rank(self, rows: Rows, k: int = RANKED_ITEMS) -> tuple[np.ndarray, np.ndarray]:
        return _popular(self.ctx, rows, k, 28, *self.tables(rows))


class RecentPopularity(_Untrained):
    """Baseline: the items most bought by everyone in the best of the popularity windows (1, 3, 7, 14 or 28
    days before the split), the window chosen on the early-stopping rows by the task's metric: items that
    launch and fade within days are found by a short window, steady ones by a long one."""

    name, kind = "recent_popularity", "recent_popularity"
    text = "baseline: the items most bought by everyone in the best popularity window (chosen on validation)"

    def __init__(self, ctx: Context, window: int = 7) -> None:
        super().__init__(ctx)
        self.window = window
        self.scores: dict[int, float] = {}

    def fit(self, train: Rows, stop: Rows) -> None:
        task, tables = ranking(self.ctx), self.tables(stop)
        self.scores = {
            w: primary(task, stop.labels, _popular(self.ctx, stop, RANKED_ITEMS, w, *tables)[0])
            for w in WINDOWS
        }
        finite = {w: v for w, v in self.scores.items() if np.isfinite(v)}
        if finite:  # the best window; a tie goes to the longer one (steadier)
            self.window = max(finite, key=lambda w: (finite[w], w))

    def rank(self, rows: Rows, k: int = RANKED_ITEMS) -> tuple[np.ndarray, np.ndarray]:
        return _popular(self.ctx, rows, k, self.window, *self.tables(rows))

    def save(self) -> tuple[dict[str, Any], dict[str, bytes]]:
        return {"kind": self.kind, "window": self.window, "window_scores": self.scores}, {}

    def parameters(self) -> dict[str, Any]:
        metric = ranking(self.ctx).primary_metric
        return {"window_days": self.window, f"validation_{metric}_per_window": self.scores}


class Cooccurrence(_Untrained):
    """Baseline: the items most similar to the entity's own by co-occurrence (candidates/item_stats.py
    CooccurrenceTable: had by the same entities in the 56 days before the split), popular items after them;
    ``items: new`` leaves out the entity's own items, ``items: repeat`` ranks only them first."""

    name, kind = "cooccurrence", "cooccurrence"
    text = "baseline: the items most often had by the entities that had the entity's own items"

    def parameters(self) -> dict[str, Any]:
        return {"days": COOC_DAYS, "neighbours_per_item": NEIGHBOURS}

    def rank(self, rows: Rows, k: int = RANKED_ITEMS) -> tuple[np.ndarray, np.ndarray]:
        d, rule = ranking(self.ctx).d, item_filter(self.ctx)
        pops, hist = self.tables(rows)
        cooc = CooccurrenceTable(rows.cache, d.source, d.column, self.ctx.seed)
        keys, score = cooc.scores(rows.time, hist, 0, len(rows))
        if rule != "all":
            seen, _ = lookup(keys, hist.row * d.n_items + hist.item)
            keys, score = (keys[seen], score[seen]) if rule == "repeat" else (keys[~seen], score[~seen])
        best = best_per_group(keys // d.n_items, score, k)
        keys, score = keys[best], score[best]
        pool = Pool(keys // d.n_items, keys % d.n_items, np.zeros((len(keys), 0), np.float32))
        return ranked(pool, score, len(rows), k, pops, rows.time, exclude=hist if rule == "new" else None)


class NeuralRanking:  # the network's refit lives in scenarios/refit.py
    """The network's catalogue scores plus weight x log1p(decayed count) of the entity's own items (the weight
    chosen on the early-stopping rows; 0 = the network alone). ``items: new`` removes the own items."""

    name = "neural"

    def __init__(self, ctx: Context, weight: float = 0.0) -> None:
        self.ctx, self.weight = ctx, weight

    def fit(self, train: Rows, stop: Rows) -> None:
        pass

    def refit(self, rows: Rows) -> None:
        pass

    def rank(self, rows: Rows, k: int = RANKED_ITEMS) -> tuple[np.ndarray, np.ndarray]:
        from basemodel_pipeline.evaluation.baselines import decayed_history_items

        d = ranking(self.ctx).d
        src = rows.cache.source(d.source)
        own = decayed_history_items(src, d.column, rows.entity, rows.time, d.repeat_half_life_days)
        exclude = own if item_filter(self.ctx) == "new" else None
        return ranking(self.ctx).top_items(rows.logits(), k, history=own, weight=self.weight, exclude=exclude)

    def predict(self, rows: Rows) -> np.ndarray:
        return self.rank(rows)[0]

    def save(self) -> tuple[dict[str, Any], dict[str, bytes]]:
        return {"kind": "neural_ranking", "weight": self.weight}, {}

    def describe(self) -> dict[str, Any]:
        text = (
            "the network's scores of the whole catalogue plus the entity's own items, weighted on validation"
        )
        half_life = ranking(self.ctx).d.repeat_half_life_days
        params = {"history_weight": self.weight, "history_half_life_days": half_life}
        return description(self.name, text, [NETWORK, ITEM_STATS], **params)


REPEAT_TUNE_EXAMPLES = 3000  # recommendation: validation examples used to weigh the own purchase history


def tune_repeat_weight(ctx: Context, rows: Rows) -> float:
    """The weight of the entity's own history in the network's recommendation scores that maximises NDCG@10
    on (a sample of) the early-stopping rows."""
    rng = np.random.default_rng(0)
    part = rows.subset(np.sort(rng.choice(len(rows), min(len(rows), REPEAT_TUNE_EXAMPLES), replace=False)))
    score = {
        w: primary(Recommendation, part.labels, NeuralRanking(ctx, w).predict(part)) for w in REPEAT_WEIGHTS
    }
    return max(score, key=lambda w: (score[w], -w))
