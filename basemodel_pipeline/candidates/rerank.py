"""Recommendation candidates, behind the protocol of candidates/base.py; their outputs are ranked item
lists ``(items [n, K], scores [n, K])``. This module holds the learned re-ranker and the pool and ranking
primitives; the others live in candidates/ranking_baselines.py.

    neural             the network's scores of the whole catalogue (+ the entity's own history, weighted on
                       the early-stopping rows: ranking_baselines.tune_repeat_weight)
    repeat_purchases   baseline: the entity's own past items by time-decayed count, popular items after them
                       (not for ``items: new``: it could only repeat popularity)
    popularity         baseline: the items most bought by everyone in the 28 days before the split
    recent_popularity  baseline: the same in the best of the 1, 3, 7, 14 and 28-day windows (chosen on the
                       early-stopping rows): what wins when items launch and fade within days
    cooccurrence       baseline: the items most often had by the entities that had the entity's own items
                       (item-to-item cosine similarity over the last 56 days), popular items after them
    reranker           a candidate pool per entity, re-ranked by LightGBM LambdaRank:

Pool: the entity's own past items (most recent and frequent first), the items most popular in the last 28
days and in each shorter window (1, 3, 7, 14 days), the items rising fastest (3 days against 28) and the
newest items with events last week, the items most similar to the entity's own by co-occurrence, and the
network's top items. Features of each (entity, item) pair: how often, how recently and how regularly the
entity had the item (count, decayed counts at 7 and 30 days, days since the last time, mean interval between the days it had it, "overdue" = days since / interval, share of
the entity's active days), the entity's own activity (active days, recency, distinct items), the item's
popularity now (1, 3, 7, 14 and 28 days), its trends (1 vs 7, 3 vs 14, 7 vs 28 days) and its age (days since
its first event), its co-occurrence score with the entity's own items (and its share of the row's best),
and the network's score. The ranker trains on the validation (stop) examples whose pool holds a
relevant item, 4/5 of their entities, and early-stops on the other 1/5's NDCG@10 (Reranker.fit says why not
on the training examples).

Targets with ``items: new`` never rank an item the entity had before the split (every candidate filters them:
the pool, the network's list and the popularity list); ``items: repeat`` ranks only such items first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from basemodel_pipeline.candidates.base import ITEM_STATS, NETWORK, Context, description
from basemodel_pipeline.candidates.inputs import Rows
from basemodel_pipeline.candidates.item_stats import (
    CooccurrenceTable,
    History,
    PopularityTable,
    best_per_group,
    item_history,
)
from basemodel_pipeline.evaluation.gbm import fit_ranker
from basemodel_pipeline.evaluation.resampling import entity_folds
from basemodel_pipeline.targets.labels import SparseLabels
from basemodel_pipeline.tasks.recommendation import RANKED_ITEMS, Recommendation

POOL_HISTORY = 50  # pool: the entity's own items (by decayed count)
POOL_POPULAR = 50  # pool: popular items of the last 28 days
POOL_MODEL = 50  # pool: the network's top items
POOL_WINDOW = 20  # pool: the top items of each shorter popularity window (1, 3, 7, 14 days)
POOL_FRESH = 20  # pool: the items rising fastest and the newest items with recent events
POOL_COOC = 30  # pool: the items most similar by co-occurrence to the entity's own items
MAX_TRAIN_QUERIES = 20_000  # ranker training examples (sampled)
MAX_STOP_QUERIES = 5_000  # ranker early-stopping examples (sampled)
CHUNK = 256  # rows per pass over the catalogue
FEATURES = (
    "hist_count",
    "hist_decay_7d",
    "hist_decay_30d",
    "hist_days_since_last",
    "hist_active_days",
    "hist_day_share",
    "hist_interval_days",
    "hist_overdue",
    "hist_in_last_day",
    "entity_active_days",
    "entity_recency_days",
    "entity_items",
    "item_pop_7d",
    "item_pop_28d",
    "item_trend",
    "item_pop_rank",
    "model_score",
    "model_score_gap",
    "item_pop_1d",
    "item_pop_3d",
    "item_pop_14d",
    "item_trend_1d_7d",
    "item_trend_3d_14d",
    "item_age_days",
    "item_cooc",
    "item_cooc_share",
)


# ---- pools and features ----------------------------------------------------------------------------
@dataclass
class Pool:
    """Candidate (row, item) pairs, sorted by row, with features [m, len(FEATURES)]."""

    row: np.ndarray
    item: np.ndarray
    features: np.ndarray

    def groups(self, n: int) -> np.ndarray:
        return np.bincount(self.row, minlength=n)


def lookup(keys: np.ndarray, sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(found [m] bool, index into sorted_keys [m])."""
    idx = np.searchsorted(sorted_keys, keys)
    idx_c = np.minimum(idx, max(len(sorted_keys) - 1, 0))
    found = (idx < len(sorted_keys)) & (sorted_keys[idx_c] == keys) if len(sorted_keys) else idx < 0
    return found, idx_c


def item_filter(ctx: Context) -> str:
    return getattr(ctx.scenario.target, "items", "all")


def ranking(ctx: Context) -> Recommendation:
    """The scenario's task, which ranks items."""
    assert isinstance(ctx.task, Recommendation)
    return ctx.task


def model_item_scores(ctx: Context, logits: np.ndarray) -> torch.Tensor:
    """[n, n_items] the network's log-scores of every item."""
    return ranking(ctx).item_scores(torch.from_numpy(np.asarray(logits, np.float32)))


def build_pool(
    ctx: Context, rows: Rows, hist: History, pops: PopularityTable, cooc: CooccurrenceTable
) -> Pool:
    """The candidate pool of every row and its features (module docstring)."""
    n_items = ranking(ctx).d.n_items
    rule = item_filter(ctx)
    logits = rows.logits()
    out_rows, out_items, out_feats = [], [], []
    for a in range(0, len(rows), CHUNK):
        b = min(a + CHUNK, len(rows))
        ha, hb = hist.slice(a, b)
        h_row, h_item = hist.row[ha:hb], hist.item[ha:hb]
        h_keys = h_row * n_items + h_item  # sorted (row, item)
        S = model_item_scores(ctx, logits[a:b])  # [c, n_items]
        if rule == "new" and len(h_row):
            S[torch.from_numpy(h_row - a), torch.from_numpy(h_item)] = -torch.inf
        c_keys, c_vals = cooc.scores(rows.time, hist, a, b)
        parts = []
        if rule != "new":  # own items, the POOL_HISTORY with the highest 30-day decayed count per row
            parts.append(h_keys[best_per_group(h_row, hist.decay30[ha:hb], POOL_HISTORY)])
        if rule != "repeat":
            k = min(POOL_MODEL, n_items)
            top = torch.topk(S, k, dim=1).indices.numpy()
            parts.append((np.arange(a, b)[:, None] * n_items + top).ravel())
            for t in np.unique(rows.time[a:b]):
                r = np.flatnonzero(rows.time[a:b] == t) + a
                p = pops.snapshot(int(t))
                popular = [p.top(POOL_POPULAR), *(p.top(POOL_WINDOW, w) for w in (1, 3, 7, 14))]
                popular += [p.rising(POOL_FRESH), p.newest(POOL_FRESH)]
                items = np.unique(np.concatenate(popular))
                parts.append((r[:, None] * n_items + items[None, :]).ravel())
            parts.append(c_keys[best_per_group(c_keys // n_items, c_vals, POOL_COOC)])
        keys = np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
        row, item = keys // n_items, keys % n_items
        if rule == "new":  # the popular list and the model's list must not bring back own items
            seen, _ = lookup(keys, h_keys)
            keys, row, item = keys[~seen], row[~seen], item[~seen]
        out_rows.append(row)
        out_items.append(item)
        F = _features(ctx, rows, hist, pops, row, item, keys, h_keys, ha, S, a)
        _cooc_features(F, row, keys, c_keys, c_vals, a)
        out_feats.append(F)
    if not out_rows:
        return Pool(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, len(FEATURES)), np.float32))
    return Pool(np.concatenate(out_rows), np.concatenate(out_items), np.concatenate(out_feats))


def _features(ctx, rows, hist, pops, row, item, keys, h_keys, ha, S, a) -> np.ndarray:
    m = len(row)
    F = np.full((m, len(FEATURES)), np.nan, np.float32)
    found, idx = lookup(keys, h_keys)
    g = ha + idx[found]
    F[:, 0] = 0.0
    F[found, 0] = np.log1p(hist.count[g])
    F[:, 1] = 0.0
    F[found, 1] = hist.decay7[g]
    F[:, 2] = 0.0
    F[found, 2] = hist.decay30[g]
    F[found, 3] = hist.since_last[g]
    F[:, 4] = 0.0
    F[found, 4] = hist.active_days[g]
    ent_days = hist.entity_days[row]
    F[:, 5] = 0.0
    F[found, 5] = hist.active_days[g] / np.maximum(ent_days[found], 1.0)
    F[found, 6] = hist.interval[g]
    with np.errstate(invalid="ignore", divide="ignore"):
        F[found, 7] = hist.since_last[g] / hist.interval[g]
    F[:, 8] = 0.0
    F[found, 8] = (hist.since_last[g] - hist.entity_recency[row[found]] < 1.0).astype(np.float32)
    F[:, 9] = np.log1p(ent_days)
    F[:, 10] = hist.entity_recency[row]
    F[:, 11] = np.log1p(hist.entity_items[row])
    t = rows.time[row]
    for tv in np.unique(t):
        sel = t == tv
        p = pops.snapshot(int(tv))
        it = item[sel]
        F[sel, 12] = np.log1p(p.counts[7][it])
        F[sel, 13] = np.log1p(p.counts[28][it])
        F[sel, 14] = p.trend(7, 28)[it]
        F[sel, 15] = np.log1p(p.rank[it])
        F[sel, 18] = np.log1p(p.counts[1][it])
        F[sel, 19] = np.log1p(p.counts[3][it])
        F[sel, 20] = np.log1p(p.counts[14][it])
        F[sel, 21] = p.trend(1, 7)[it]
        F[sel, 22] = p.trend(3, 14)[it]
        age = p.age[it]
        F[sel, 23] = np.where(np.isfinite(age), np.log1p(age), np.nan)
    score = S[torch.from_numpy(row - a), torch.from_numpy(item)].numpy().astype(np.float32)
    score[~np.isfinite(score)] = np.nan
    F[:, 16] = score
    best = np.full(int(row.max(initial=a)) - a + 1 if m else 0, -np.inf, np.float32)
    if m:
        np.maximum.at(best, row - a, np.nan_to_num(score, nan=-np.inf))
        F[:, 17] = score - best[row - a]
    return F


def _cooc_features(F, row, keys, c_keys, c_vals, a) -> None:
    found, idx = lookup(keys, c_keys)
    score = np.where(found, c_vals[idx] if len(c_vals) else 0.0, 0.0)
    F[:, FEATURES.index("item_cooc")] = np.log1p(score)
    best = np.zeros(int(row.max(initial=a)) - a + 1 if len(row) else 0)
    np.maximum.at(best, row - a, score)
    with np.errstate(invalid="ignore", divide="ignore"):
        F[:, FEATURES.index("item_cooc_share")] = np.where(best[row - a] > 0, score / best[row - a], 0.0)


def relevance(pool: Pool, labels: SparseLabels) -> np.ndarray:
    """1 where the pool pair's item is among the row's target items."""
    n_items = labels.n_cols
    owner = np.repeat(np.arange(len(labels)), np.diff(labels.indptr))
    pos = labels.values > 0
    rel_keys = np.unique(owner[pos] * n_items + labels.indices[pos])
    return np.isin(pool.row * n_items + pool.item, rel_keys).astype(np.float64)


def ranked(
    pool: Pool,
    scores: np.ndarray,
    n: int,
    k: int,
    pops: PopularityTable,
    time: np.ndarray,
    exclude: History | None = None,
):
    """(items [n, k], scores [n, k]) best first; rows with a small pool are filled with popular items (never
    the `exclude` history's items: ``items: new``). A row with fewer eligible items than k ends in -1."""
    k = min(k, len(pops.at(int(time[0]))[0])) if n else k
    order = np.lexsort((-scores, pool.row))
    row, item, s = pool.row[order], pool.item[order], scores[order]
    start = np.r_[0, np.cumsum(np.bincount(row, minlength=n))[:-1]]
    rank = np.arange(len(row)) - start[row]
    keep = rank < k
    items = np.full((n, k), -1, np.int64)
    out = np.full((n, k), -np.inf, np.float32)
    items[row[keep], rank[keep]] = item[keep]
    out[row[keep], rank[keep]] = s[keep]
    short = np.flatnonzero((items < 0).any(1))
    for r in short:  # rare: fewer than k candidates
        have = set(items[r][items[r] >= 0].tolist())
        if exclude is not None:
            a, b = exclude.slice(r, r + 1)
            have |= set(exclude.item[a:b].tolist())
        fill = [i for i in pops.top(int(time[r]), k + len(have)).tolist() if i not in have]
        free = np.flatnonzero(items[r] < 0)[: len(fill)]
        items[r, free] = fill[: len(free)]
    return items, out


# ---- candidates ------------------------------------------------------------------------------------
class Reranker:
    """LightGBM LambdaRank over the candidate pool (module docstring)."""

    name = "reranker"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.model: str | None = None
        self.rounds = 0
        self._booster = None

    def _prepare(self, rows: Rows) -> tuple[Pool, PopularityTable, History]:
        d = ranking(self.ctx).d
        pops = PopularityTable(rows.cache, d.source, d.column)
        cooc = CooccurrenceTable(rows.cache, d.source, d.column, self.ctx.seed)
        hist = item_history(rows.cache, d.source, d.column, rows.entity, rows.time)
        return build_pool(self.ctx, rows, hist, pops, cooc), pops, hist

    def _sample(self, rows: Rows, limit: int) -> Rows:
        if len(rows) <= limit:
            return rows
        idx = np.sort(np.random.default_rng(self.ctx.seed).choice(len(rows), limit, replace=False))
        return rows.subset(idx)

    def _training_set(self, rows: Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pool, _, _ = self._prepare(rows)
        rel = relevance(pool, rows.labels)
        has = np.bincount(pool.row, weights=rel, minlength=len(rows)) > 0
        keep = has[pool.row]
        return pool.features[keep], rel[keep], np.bincount(pool.row[keep], minlength=len(rows))[has]

    def fit(self, train: Rows, stop: Rows) -> None:
        """Learns from the early-stopping (validation) rows, not the training rows: on its own training rows
        the network's scores are over-confident (and the foundation recalls those weeks' futures), so a
        ranker fitted there trusts them too much. 4/5 of the stop entities fit, 1/5 early-stop. On The Complete
        Journey next-basket NDCG@10 on test: 0.2278 fitted this way, 0.2166 fitted on training rows
        (repeat purchases 0.2161), one foundation, one seed."""
        fold = entity_folds(stop.entity, 5)
        if len(np.unique(fold)) > 1:
            train, stop = stop.subset(np.flatnonzero(fold != 0)), stop.subset(np.flatnonzero(fold == 0))
        else:
            train = stop
        Xt, yt, gt = self._training_set(self._sample(train, MAX_TRAIN_QUERIES))
        Xs, ys, gs = self._training_set(self._sample(stop, MAX_STOP_QUERIES))
        if len(gt) == 0 or len(gs) == 0:
            return
        self.model, self.rounds = fit_ranker(Xt, yt, gt, Xs, ys, gs, seed=self.ctx.seed)

    def refit(self, rows: Rows) -> None:
        """Every validation row (stop and select) for the rounds early stopping kept."""
        if self.model is None:
            return
        X, y, g = self._training_set(self._sample(rows, MAX_TRAIN_QUERIES))
        if len(g):
            self.model, _ = fit_ranker(X, y, g, None, None, None, seed=self.ctx.seed, rounds=self.rounds)
            self._booster = None

    def booster(self):
        import lightgbm as lgb

        if self._booster is None and self.model is not None:
            self._booster = lgb.Booster(model_str=self.model)
        return self._booster

    def rank(self, rows: Rows, k: int = RANKED_ITEMS) -> tuple[np.ndarray, np.ndarray]:
        pool, pops, hist = self._prepare(rows)
        booster = self.booster()
        if booster is None or len(pool.row) == 0:
            scores = np.nan_to_num(pool.features[:, FEATURES.index("model_score")], nan=-1e9)
        else:
            scores = booster.predict(pool.features)
        exclude = hist if item_filter(self.ctx) == "new" else None
        return ranked(pool, scores.astype(np.float64), len(rows), k, pops, rows.time, exclude)

    def predict(self, rows: Rows) -> np.ndarray:
        return self.rank(rows)[0]

    def save(self) -> tuple[dict[str, Any], dict[str, bytes]]:
        files = {"reranker.txt": self.model.encode()} if self.model is not None else {}
        return {"kind": "reranker", "features": list(FEATURES), "rounds": self.rounds}, files

    def describe(self) -> dict[str, Any]:
        text = "LightGBM LambdaRank over a candidate pool per entity (own, popular, rising, co-bought, network items)"
        params = {"objective": "lambdarank", "rounds": self.rounds, "trained": self.model is not None}
        return description(self.name, text, [NETWORK, ITEM_STATS], **params, features=len(FEATURES))
