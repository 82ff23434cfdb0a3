"""Metrics for binary and multilabel scenarios (sklearn underneath).

Conventions: ``y`` holds 0/1 labels, ``score`` any real-valued score (higher = more likely positive);
multilabel arrays are ``[n, C]``. A metric that is undefined (a single class present) is NaN.
"""

from __future__ import annotations

import numpy as np
from sklearn import metrics as skm

PRIMARY_METRIC = {"binary": "auroc", "multilabel": "macro_auroc"}


def _both_classes(y: np.ndarray) -> bool:
    return y.size > 0 and bool(np.any(y > 0)) and bool(np.any(y <= 0))


def auroc(y: np.ndarray, score: np.ndarray) -> float:
    """Binary AUROC; NaN if ``y`` holds one class only."""
    y, score = np.asarray(y).ravel(), np.asarray(score, dtype=np.float64).ravel()
    if not _both_classes(y):
        return float("nan")
    return float(skm.roc_auc_score(y > 0, score))


def _per_class(fn, Y: np.ndarray, S: np.ndarray) -> np.ndarray:
    Y, S = np.asarray(Y), np.asarray(S)
    if Y.ndim == 1:
        Y, S = Y[:, None], S[:, None]
    return np.array([fn(Y[:, c], S[:, c]) for c in range(Y.shape[1])], dtype=np.float64)


def _nanmean(v: np.ndarray) -> float:
    v = v[~np.isnan(v)]
    return float(v.mean()) if v.size else float("nan")


def macro_auroc(Y: np.ndarray, S: np.ndarray) -> float:
    """Mean AUROC over the classes (columns) whose labels hold both classes; NaN if none does."""
    return _nanmean(_per_class(auroc, Y, S))


def micro_auroc(Y: np.ndarray, S: np.ndarray) -> float:
    """AUROC over all (example, class) pairs pooled together."""
    return auroc(np.asarray(Y).ravel(), np.asarray(S).ravel())


def _ap(y: np.ndarray, s: np.ndarray) -> float:
    if not np.any(y > 0):
        return float("nan")
    return float(skm.average_precision_score(y > 0, np.asarray(s, dtype=np.float64)))


def average_precision(y: np.ndarray, score: np.ndarray) -> float:
    """Average precision: binary for 1-D input, macro over classes with a positive for ``[n, C]``."""
    y = np.asarray(y)
    if y.ndim == 1:
        return _ap(y, np.asarray(score))
    return _nanmean(_per_class(_ap, y, score))


def log_loss(y: np.ndarray, p: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy of probabilities ``p`` (clipped to [eps, 1 - eps]), over all entries."""
    y = (np.asarray(y) > 0).astype(np.float64).ravel()
    p = np.clip(np.asarray(p, dtype=np.float64).ravel(), eps, 1 - eps)
    if y.size == 0:
        return float("nan")
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


_METRICS = {"auroc": auroc, "macro_auroc": macro_auroc, "micro_auroc": micro_auroc}


def primary_metric(task: str, y: np.ndarray, s: np.ndarray) -> float:
    """The metric a scenario of kind ``task`` ("binary" | "multilabel") is judged by (PRIMARY_METRIC)."""
    if task not in PRIMARY_METRIC:
        raise ValueError(f"no primary metric for task '{task}'; known: {', '.join(PRIMARY_METRIC)}")
    return _METRICS[PRIMARY_METRIC[task]](y, s)
