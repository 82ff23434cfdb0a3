"""Resampling statistics (evaluation/resampling.py): entity folds, per-fold metrics, the paired bootstrap."""

from __future__ import annotations

import numpy as np

from basemodel_pipeline.evaluation.metrics import auroc
from basemodel_pipeline.evaluation.resampling import entity_folds, fold_metric, paired_bootstrap


def test_entity_folds_keep_an_entity_together_and_are_balanced() -> None:
    entity = np.repeat(np.arange(5000), 3)
    fold = entity_folds(entity, 5)
    assert (fold.reshape(-1, 3) == fold.reshape(-1, 3)[:, :1]).all()  # every row of an entity in one fold
    assert np.array_equal(entity_folds(entity[::-1], 5), fold[::-1])  # fixed by the entity, not the row order
    counts = np.bincount(fold, minlength=5)
    assert counts.min() > 0.9 * counts.mean()


def test_paired_bootstrap_interval() -> None:
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 2000).astype(np.float32)
    weak = rng.random(2000)
    strong = y + rng.normal(0, 0.8, 2000)
    diff, lo, hi = paired_bootstrap(auroc, y, strong, weak, rounds=200)
    assert diff > 0.2 and 0 < lo < diff < hi
    assert paired_bootstrap(auroc, y, weak, weak, rounds=50) == (0.0, 0.0, 0.0)
    diff, lo, hi = paired_bootstrap(auroc, y, weak, rng.random(2000), rounds=200)
    assert lo < 0 < hi  # two random scorers: the interval covers zero


def test_fold_metric_ignores_calibration_differences_between_folds() -> None:
    """Out-of-fold scores of probes with different calibrations: pooling them into one AUROC penalises the
    offsets; the mean of per-fold AUROCs is what each fold's probe ranks."""
    rng = np.random.default_rng(4)
    fold = np.repeat(np.arange(5), 400)
    y = rng.integers(0, 2, 2000).astype(np.float32)
    scores = y + rng.normal(0, 1.0, 2000)
    shifted = scores + 3.0 * fold  # each fold's probe outputs on its own scale
    per_fold = [auroc(y[fold == f], scores[fold == f]) for f in range(5)]
    assert fold_metric(auroc, y, shifted, fold) == np.mean(per_fold)
    assert fold_metric(auroc, y, shifted) < fold_metric(auroc, y, shifted, fold) - 0.1  # pooled
    assert fold_metric(auroc, y, scores) == auroc(y, scores)


def test_paired_bootstrap_by_fold() -> None:
    rng = np.random.default_rng(5)
    fold = np.repeat(np.arange(5), 400)
    y = rng.integers(0, 2, 2000).astype(np.float32)
    strong = y + rng.normal(0, 0.8, 2000) + 5.0 * fold
    weak = rng.random(2000)
    diff, lo, hi = paired_bootstrap(auroc, y, strong, weak, rounds=100, groups=fold)
    assert diff == fold_metric(auroc, y, strong, fold) - fold_metric(auroc, y, weak, fold)
    assert 0.2 < lo < diff < hi
    diff, lo, hi = paired_bootstrap(auroc, y, weak, rng.random(2000), rounds=100, groups=fold)
    assert lo < 0 < hi


def test_paired_bootstrap_resamples_entities_not_rows() -> None:
    """Several windows of one entity are not independent evidence: 250 entities with 8 near-identical rows
    each carry about as much information as 250 rows. A row bootstrap reads them as 2,000 and calls a noise
    gap significant; resampling entities (`clusters`) gives the interval of 250."""
    rng = np.random.default_rng(6)
    entity = np.repeat(np.arange(250), 8)
    y = rng.integers(0, 2, 250).astype(np.float32)[entity]
    a = (y + rng.normal(0, 1.0, 250)[entity]) + rng.normal(0, 0.01, 2000)
    b = (y + rng.normal(0, 1.0, 250)[entity]) + rng.normal(0, 0.01, 2000)
    _, lo_rows, hi_rows = paired_bootstrap(auroc, y, a, b, rounds=200)
    d, lo, hi = paired_bootstrap(auroc, y, a, b, rounds=200, clusters=entity)
    assert hi - lo > 2.0 * (hi_rows - lo_rows)  # about sqrt(8) wider
    assert lo < d < hi
    groups = entity % 2  # clusters within groups: each half resampled on its own
    d2, lo2, hi2 = paired_bootstrap(auroc, y, a, b, rounds=200, groups=groups, clusters=entity)
    assert lo2 < d2 < hi2 and hi2 - lo2 > 2.0 * (hi_rows - lo_rows)


def test_paired_bootstrap_with_no_measurable_resample_returns_nan_bounds() -> None:
    """A select set whose rows hold one class (tiny data): no resample has an AUROC; the selection must go
    on (without a proven gain) instead of crashing."""
    y = np.array([1, 1, 1], dtype=np.float32)
    a, b = np.array([0.9, 0.1, 0.5]), np.array([0.2, 0.8, 0.5])
    _, lo, hi = paired_bootstrap(auroc, y, a, b, rounds=5, clusters=np.array([0, 1, 1]))
    assert np.isnan(lo) and np.isnan(hi)
