"""Metrics of the five task types (sklearn-compatible definitions, vectorised for thousands of classes). Which
metrics a task reports and the one it is judged by are the task's (tasks/: ``Task.evaluate``, ``primary``).

Conventions: ``y`` holds 0/1 labels, ``score`` any real-valued score (higher = more likely positive);
multilabel arrays are ``[n, C]``; multiclass ``y`` holds class indices [n] and ``score`` probabilities
[n, C]; recommendation takes ranked item indices ``topk`` [n, K] and the relevant items per row. A metric
that is undefined (a single class present) is NaN; macro averages skip undefined classes.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

LOWER_IS_BETTER = {
    "rmse",
    "mae",
    "rmse_raw",
    "mae_raw",
    "rmse_log1p",
    "log_loss",
    "micro_log_loss",
    "macro_log_loss",
}


def _both_classes(y: np.ndarray) -> bool:
    return y.size > 0 and bool(np.any(y > 0)) and bool(np.any(y <= 0))


def _nanmean(v: np.ndarray) -> float:
    v = np.asarray(v, dtype=np.float64)
    v = v[~np.isnan(v)]
    return float(v.mean()) if v.size else float("nan")


# ---- binary and multilabel -------------------------------------------------------------------------


def _two_class_columns(Y: np.ndarray, S: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels as booleans and scores as float64, both [n, C], and the columns holding both classes (the
    only ones whose AUROC is defined)."""
    Y, S = np.asarray(Y) > 0, np.asarray(S, dtype=np.float64)
    if Y.ndim == 1:
        Y, S = Y[:, None], S[:, None]
    n_pos = Y.sum(0)
    return Y, S, np.flatnonzero((n_pos > 0) & (n_pos < len(Y)))


def auroc(y: np.ndarray, score: np.ndarray) -> float:
    """Binary AUROC; NaN if ``y`` holds one class only. Mann-Whitney with average ranks for ties (the
    trapezoidal ROC area), one sort: the bootstrap calls it a thousand times per interval."""
    y, score = np.asarray(y).ravel(), np.asarray(score, dtype=np.float64).ravel()
    if not _both_classes(y):
        return float("nan")
    return float(per_class_auroc(y[:, None], score[:, None])[0])


def per_class_auroc(Y: np.ndarray, S: np.ndarray) -> np.ndarray:
    """AUROC of every column at once (Mann-Whitney with average ranks for ties); NaN for one-class columns.
    Each column with both classes is sorted once and only its positives are ranked in it (searchsorted), so
    thousands of sparse labels cost one sort each, not a rank of every entry."""
    Y, S, kept = _two_class_columns(Y, S)
    n = Y.shape[0]
    out = np.full(Y.shape[1], np.nan)
    scores = np.ascontiguousarray(S[:, kept].T)  # [K, n], a row per kept column
    labels = np.ascontiguousarray(Y[:, kept].T)
    ordered = np.sort(scores, axis=1)
    rank_sum = np.empty(len(kept))
    for k in range(len(kept)):
        v = scores[k][labels[k]]  # the positives' scores
        below = np.searchsorted(ordered[k], v, "left")
        tied = np.searchsorted(ordered[k], v, "right") - below
        rank_sum[k] = (below + (tied + 1) / 2).sum()  # 1-based average ranks
    pos = labels.sum(1).astype(np.float64)
    out[kept] = (rank_sum - pos * (pos + 1) / 2) / (pos * (n - pos))
    return out


class ResampledAuroc:
    """Per-class AUROC of fixed labels and scores under row weights: a bootstrap resample given as counts
    (``np.bincount(idx)``) scores what ``per_class_auroc(Y[idx], S[idx])`` would. The columns are sorted
    once; a resample then costs one cumulative sum of the negatives' weights per column instead of a rank of
    every column, which is what makes a bootstrap of a macro-AUROC over thousands of labels affordable.
    Columns with one class only are NaN in every resample and are not kept."""

    def __init__(self, Y: np.ndarray, S: np.ndarray) -> None:
        Y, S, self.kept = _two_class_columns(Y, S)
        n, self.C = S.shape
        Y, S = Y[:, self.kept].T, S[:, self.kept].T  # [K, n]
        self.order = np.argsort(S, axis=1, kind="stable").astype(np.int32)  # [K, n] rows by ascending score
        self.neg = ~np.take_along_axis(Y, self.order, axis=1)  # [K, n] their labels, negative = True
        s = np.take_along_axis(S, self.order, axis=1)
        idx = np.broadcast_to(np.arange(n, dtype=np.int32), s.shape)
        starts = np.ones(s.shape, bool)
        starts[:, 1:] = s[:, 1:] != s[:, :-1]  # a tie group starts where the score changes
        ends = np.ones(s.shape, bool)
        ends[:, :-1] = starts[:, 1:]
        first = np.maximum.accumulate(np.where(starts, idx, 0), axis=1)  # [K, n] its tie group's first row
        last = np.flip(np.minimum.accumulate(np.flip(np.where(ends, idx, n), 1), axis=1), 1)  # and last
        # the positives only: where each sits in the flat [K, n] weights and the flat [K, n + 1] cumulative
        # negatives, the ends of its tie group there, and its (kept) column
        c, j = np.nonzero(~self.neg)
        self.pos_at = c * n + j
        self.below = c * (n + 1) + first[c, j]  # negatives strictly below the group: cum[first]
        self.through = c * (n + 1) + last[c, j] + 1  # negatives up to its end: cum[last + 1]
        self.pos_class = c

    def __call__(self, weights: np.ndarray) -> np.ndarray:
        K, n = self.order.shape
        w = np.asarray(weights, dtype=np.float32)[self.order]  # [K, n]; counts are exact in float32
        cum = np.zeros((K, n + 1), np.float32)
        np.cumsum(np.multiply(w, self.neg, out=cum[:, 1:]), axis=1, out=cum[:, 1:])
        flat = cum.ravel()
        w_pos = w.ravel()[self.pos_at].astype(np.float64)
        # a positive beats the negatives below it and ties half of those in its own tie group
        wins = w_pos * 0.5 * (flat[self.below].astype(np.float64) + flat[self.through])
        n_pos = np.bincount(self.pos_class, weights=w_pos, minlength=K)
        n_neg = cum[:, -1].astype(np.float64)
        out = np.full(self.C, np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[self.kept] = np.bincount(self.pos_class, weights=wins, minlength=K) / (n_pos * n_neg)
        out[self.kept[(n_pos == 0) | (n_neg == 0)]] = np.nan
        return out

    def macro(self, weights: np.ndarray) -> float:
        """macro_auroc of the resample: the mean over the classes with both in it."""
        return _nanmean(self(weights))


def per_class_average_precision(Y: np.ndarray, S: np.ndarray) -> np.ndarray:
    """sklearn's average precision of every column at once (ties form one threshold); NaN without positives."""
    Y, S = np.asarray(Y) > 0, np.asarray(S, dtype=np.float64)
    if Y.ndim == 1:
        Y, S = Y[:, None], S[:, None]
    n = Y.shape[0]
    if n == 0:
        return np.full(Y.shape[1], np.nan)
    order = np.argsort(-S, axis=0, kind="stable")
    s = np.take_along_axis(S, order, 0)
    tp = np.cumsum(np.take_along_axis(Y, order, 0), axis=0)
    is_end = np.ones_like(s, dtype=bool)
    is_end[:-1] = s[1:] != s[:-1]  # last row of each group of tied scores
    is_start = np.ones_like(s, dtype=bool)
    is_start[1:] = s[1:] != s[:-1]
    rows = np.arange(n)[:, None]
    start = np.maximum.accumulate(np.where(is_start, rows, 0), axis=0)
    tp_before = np.where(start > 0, np.take_along_axis(tp, np.maximum(start - 1, 0), 0), 0)
    pos = tp[-1].astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        contrib = np.where(is_end, (tp - tp_before) * tp / (rows + 1.0), 0.0)
        out = contrib.sum(0) / pos
    out[pos == 0] = np.nan
    return out


def macro_auroc(Y: np.ndarray, S: np.ndarray) -> float:
    """Mean AUROC over the classes (columns) whose labels hold both classes; NaN if none does."""
    return _nanmean(per_class_auroc(Y, S))


def micro_auroc(Y: np.ndarray, S: np.ndarray) -> float:
    """AUROC over all (example, class) pairs pooled together."""
    return auroc(np.asarray(Y).ravel(), np.asarray(S).ravel())


def average_precision(y: np.ndarray, score: np.ndarray) -> float:
    """Average precision: binary for 1-D input, macro over classes with a positive for ``[n, C]``."""
    return _nanmean(per_class_average_precision(y, score))


def micro_average_precision(Y: np.ndarray, S: np.ndarray) -> float:
    return average_precision(np.asarray(Y).ravel(), np.asarray(S).ravel())


def log_loss(y: np.ndarray, p: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy of probabilities ``p`` (clipped to [eps, 1 - eps]), over all entries."""
    y = (np.asarray(y) > 0).astype(np.float64).ravel()
    p = np.clip(np.asarray(p, dtype=np.float64).ravel(), eps, 1 - eps)
    if y.size == 0:
        return float("nan")
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


def macro_log_loss(Y: np.ndarray, P: np.ndarray, eps: float = 1e-7) -> float:
    """Mean over classes of each class's binary log-loss."""
    Y = (np.asarray(Y) > 0).astype(np.float64)
    P = np.clip(np.asarray(P, dtype=np.float64), eps, 1 - eps)
    if Y.size == 0:
        return float("nan")
    return float(np.mean(-np.mean(Y * np.log(P) + (1 - Y) * np.log1p(-P), axis=0)))


# ---- multiclass ------------------------------------------------------------------------------------
def accuracy(y: np.ndarray, P: np.ndarray) -> float:
    return float(np.mean(np.argmax(P, axis=1) == np.asarray(y))) if len(y) else float("nan")


def top_k_accuracy(y: np.ndarray, P: np.ndarray, k: int) -> float:
    """Share of rows whose true class is among the k highest scores (ties broken by class index)."""
    P = np.asarray(P, dtype=np.float64)
    k = min(k, P.shape[1])
    top = np.argsort(-P, axis=1, kind="stable")[:, :k]
    return float(np.mean((top == np.asarray(y)[:, None]).any(1))) if len(y) else float("nan")


def multiclass_log_loss(y: np.ndarray, P: np.ndarray, eps: float = 1e-7) -> float:
    P = np.clip(np.asarray(P, dtype=np.float64), eps, 1.0)
    P = P / P.sum(1, keepdims=True)
    return float(-np.mean(np.log(P[np.arange(len(y)), np.asarray(y)]))) if len(y) else float("nan")


# ---- regression ------------------------------------------------------------------------------------
def rmse(y: np.ndarray, pred: np.ndarray) -> float:
    return float(np.sqrt(np.mean((np.asarray(y, np.float64) - np.asarray(pred, np.float64)) ** 2)))


def mae(y: np.ndarray, pred: np.ndarray) -> float:
    return float(np.mean(np.abs(np.asarray(y, np.float64) - np.asarray(pred, np.float64))))


def gini(y: np.ndarray, pred: np.ndarray) -> float:
    """Normalised Gini: how much of the total of ``y`` ranking by ``pred`` puts first, relative to ranking by
    ``y`` itself (1 = perfect order, 0 = random). NaN when ``y`` sums to zero."""
    y, pred = np.asarray(y, np.float64), np.asarray(pred, np.float64)

    def raw(order_by: np.ndarray) -> float:
        order = np.argsort(-order_by, kind="stable")
        cum = np.cumsum(y[order]) / y.sum()
        return float(cum.sum() / len(y) - (len(y) + 1) / (2 * len(y)))

    if len(y) == 0 or y.sum() <= 0:
        return float("nan")
    return raw(pred) / raw(y) if raw(y) != 0 else float("nan")


def top_decile_lift(y: np.ndarray, pred: np.ndarray) -> float:
    """Share of the total of ``y`` held by the 10% of rows with the highest ``pred``, divided by 0.1."""
    y, pred = np.asarray(y, np.float64), np.asarray(pred, np.float64)
    if len(y) == 0 or y.sum() <= 0:
        return float("nan")
    top = np.argsort(-pred, kind="stable")[: max(1, len(y) // 10)]
    return float(y[top].sum() / y.sum() / (len(top) / len(y)))


def spearman(y: np.ndarray, pred: np.ndarray) -> float:
    y, pred = np.asarray(y, np.float64), np.asarray(pred, np.float64)
    if np.ptp(y) == 0 or np.ptp(pred) == 0:
        return float("nan")
    return float(stats.spearmanr(y, pred).statistic)


# ---- recommendation --------------------------------------------------------------------------------
def ranking_hits(
    topk: np.ndarray, rel_indptr: np.ndarray, rel_indices: np.ndarray, n_items: int
) -> np.ndarray:
    """[n, K] bool: is the item at each rank relevant (rows of a CSR relevance matrix)."""
    topk = np.asarray(topk, dtype=np.int64)
    n = len(topk)
    owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(rel_indptr))
    rel = np.unique(owner * n_items + rel_indices)
    return np.isin(np.arange(n, dtype=np.int64)[:, None] * n_items + topk, rel)


def ranking_metrics(
    hits: np.ndarray, n_relevant: np.ndarray, ks: tuple[int, ...] = (10,)
) -> dict[str, float]:
    """HitRate@K, Precision@K, Recall@K, MAP@K, NDCG@K for each K, and MRR over the whole list given."""
    hits = np.asarray(hits, dtype=bool)
    n_rel = np.asarray(n_relevant, dtype=np.float64)
    valid = n_rel > 0
    hits, n_rel = hits[valid], n_rel[valid]
    out: dict[str, float] = {}
    if len(hits) == 0:
        return {"mrr": float("nan")}
    L = hits.shape[1]
    discount = 1.0 / np.log2(np.arange(L) + 2.0)
    for k in ks:
        h = hits[:, :k].astype(np.float64)
        kk = h.shape[1]
        out[f"hitrate@{k}"] = float(h.any(1).mean())
        out[f"precision@{k}"] = float((h.sum(1) / k).mean())
        out[f"recall@{k}"] = float((h.sum(1) / n_rel).mean())
        prec_at = np.cumsum(h, 1) / np.arange(1, kk + 1)
        out[f"map@{k}"] = float(((prec_at * h).sum(1) / np.minimum(n_rel, k)).mean())
        ideal = np.cumsum(discount[:kk])[np.minimum(n_rel, kk).astype(np.int64) - 1]
        out[f"ndcg@{k}"] = float(((h * discount[:kk]).sum(1) / ideal).mean())
    first = np.where(hits.any(1), hits.argmax(1) + 1.0, np.inf)
    out["mrr"] = float((1.0 / first).mean())
    return out


# ---- regression, every metric ----------------------------------------------------------------------
def regression_metrics(y: np.ndarray, pred: np.ndarray, log1p: bool = False) -> dict[str, float]:
    """RMSE, MAE and Spearman on the target's own scale, and for amounts on both scales: with ``log1p``
    (the target is log(1 + amount)) RMSE/MAE of the amounts themselves; for a non-negative target RMSE of
    log1p. Gini and top-decile lift of the amounts (how well the ranking finds where the total is)."""
    out = {"rmse": rmse(y, pred), "mae": mae(y, pred), "spearman": spearman(y, pred)}
    y, pred = np.asarray(y, np.float64), np.asarray(pred, np.float64)
    if log1p:
        amount, predicted = np.expm1(y), np.expm1(np.maximum(pred, 0.0))
        out.update(rmse_raw=rmse(amount, predicted), mae_raw=mae(amount, predicted))
    elif len(y) and y.min() >= 0:
        amount, predicted = y, np.maximum(pred, 0.0)
        out["rmse_log1p"] = rmse(np.log1p(y), np.log1p(predicted))
    else:
        return out
    out.update(gini=gini(amount, predicted), top_decile_lift=top_decile_lift(amount, predicted))
    return out


def amount_metrics(amount: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    """Metrics of predicted amounts in the amount's own units (money): RMSE, MAE, Gini, top-decile lift, and
    the mean prediction beside the mean amount (a revenue forecast sums them)."""
    amount, predicted = np.asarray(amount, np.float64), np.asarray(predicted, np.float64)
    return {
        "rmse_raw": rmse(amount, predicted),
        "mae_raw": mae(amount, predicted),
        "gini": gini(amount, predicted),
        "top_decile_lift": top_decile_lift(amount, predicted),
        "mean_predicted": float(predicted.mean()) if predicted.size else float("nan"),
        "mean_actual": float(amount.mean()) if amount.size else float("nan"),
    }


def mean_interval(
    values: np.ndarray, groups: np.ndarray, rounds: int = 400, seed: int = 0
) -> tuple[float, float]:
    """95% interval of the mean of `values`, resampling whole groups (an entity's several test weeks
    together)."""
    values = np.asarray(values, np.float64)
    _, g = np.unique(groups, return_inverse=True)
    sums, counts = np.bincount(g, values), np.bincount(g).astype(np.float64)
    rng, n = np.random.default_rng(seed), len(sums)
    means = np.empty(rounds)
    for r in range(rounds):
        w = np.bincount(rng.integers(0, n, n), minlength=n)
        means[r] = (w @ sums) / max(float(w @ counts), 1.0)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def higher_is_better(name: str) -> bool:
    return name not in LOWER_IS_BETTER
