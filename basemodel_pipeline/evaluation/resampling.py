"""Resampling statistics: entity folds, per-fold metrics and the paired bootstrap of a metric's difference.

Scenario selection (candidates/selection.py), the re-ranker's folds (candidates/rerank.py), the embedding probe
(training/probe.py) and the benchmarks judge scores with these. A ``Metric`` is a function of (labels, scores)
such as a task's ``primary`` (tasks/).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

Metric = Callable[[Any, Any], float]  # (labels, scores) -> the metric


def entity_folds(entity: np.ndarray, k: int) -> np.ndarray:
    """Fold [n] in 0..k-1 of each row, fixed by its entity index (a multiplicative hash), so every row of an
    entity lands in the same fold and the folds do not depend on the order of the rows."""
    mixed = (np.asarray(entity).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)
    return (mixed % np.uint64(k)).astype(np.int64)


def _group_rows(n: int, groups: np.ndarray | None) -> list[np.ndarray]:
    """Row indices of each group (one group of all n rows without `groups`)."""
    if groups is None:
        return [np.arange(n)]
    return [np.flatnonzero(groups == g) for g in np.unique(groups)]


def cluster_sampler(rows: np.ndarray, clusters: np.ndarray | None):
    """A function drawing one bootstrap resample of `rows`: rows with replacement, or with `clusters` whole
    clusters with replacement (every row of a drawn cluster, as often as it is drawn)."""
    if clusters is None:
        return lambda rng: rows[rng.integers(0, len(rows), len(rows))]
    clusters = np.asarray(clusters)
    order = rows[np.argsort(clusters[rows], kind="stable")]
    _, start, count = np.unique(clusters[order], return_index=True, return_counts=True)

    def sample(rng: np.random.Generator) -> np.ndarray:
        pick = rng.integers(0, len(start), len(start))
        n = count[pick]
        offset = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)  # 0..n-1 within each drawn cluster
        return order[np.repeat(start[pick], n) + offset]

    return sample


def _mean_metric(metric: Metric, Y: np.ndarray, scores: np.ndarray, parts: list[np.ndarray]) -> float:
    return float(np.mean([metric(Y[rows], scores[rows]) for rows in parts]))


def fold_metric(metric: Metric, Y: np.ndarray, scores: np.ndarray, groups: np.ndarray | None = None) -> float:
    """`metric` of `scores`, or with `groups` (the folds of cross_fitted_scores) its mean over the
    groups. Out-of-fold scores come from a different probe per fold, each with its own calibration; one AUROC
    over the pooled rows would rank rows of different folds against each other and penalise calibration
    differences that are not about the representation (Forman & Scholz, "Apples-to-apples in cross-validation
    studies", SIGKDD Explorations 2010). The mean of per-fold AUROCs does not."""
    return _mean_metric(metric, Y, scores, _group_rows(len(Y), groups))


def bootstrap_rounds(width: int, rounds: int, floor: int) -> int:
    """`rounds`, scaled down when one metric costs more than 50 per-column metrics (`width`: a multilabel
    AUROC per label; Task.metric_width), never below `floor`."""
    return max(floor, min(rounds, rounds * 50 // width))


def paired_bootstrap(
    metric: Metric,
    Y: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    rounds: int = 1000,
    seed: int = 0,
    groups: np.ndarray | None = None,
    clusters: np.ndarray | None = None,
) -> tuple[float, float, float]:
    """Metric(a) - metric(b) on the same rows: (difference, 2.5th and 97.5th percentile over `rounds`
    resamples of the rows with replacement; NaN bounds when no resample has a finite metric). The interval says whether a gap is larger than the noise of a
    test set of this size. With `groups` the metric is fold_metric's mean over groups, and rows are resampled
    within their group. With `clusters` (an entity per row) whole entities are resampled, all rows of one at
    once: an entity's windows are not independent evidence, and a row bootstrap would read them as such."""
    rng = np.random.default_rng(seed)
    members = _group_rows(len(Y), groups)
    diff = _mean_metric(metric, Y, a, members) - _mean_metric(metric, Y, b, members)
    draw = [cluster_sampler(m, clusters) for m in members]
    draws = []
    for _ in range(rounds):
        parts = [sample(rng) for sample in draw]  # each group resampled on its own
        d = _mean_metric(metric, Y, a, parts) - _mean_metric(metric, Y, b, parts)
        if np.isfinite(d):
            draws.append(d)
    if not draws:  # no resample had both classes (a handful of entities): the noise cannot be measured
        return float(diff), float("nan"), float("nan")
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return float(diff), float(lo), float(hi)
