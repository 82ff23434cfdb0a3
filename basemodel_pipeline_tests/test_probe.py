"""The fixed embedding probe learns a planted signal and picks its best epoch on validation."""

from __future__ import annotations

import numpy as np

from basemodel_pipeline.evaluation.metrics import auroc, macro_auroc
from basemodel_pipeline.evaluation.probe import probe_scores


def _data(n: int, rng: np.random.Generator, classes: int = 1) -> tuple[np.ndarray, np.ndarray]:
    X = rng.normal(size=(n, 16)).astype(np.float32)
    logits = X[:, :classes] * 2.0 + 0.5 * X[:, 5:6]
    Y = (rng.random(logits.shape) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    return X, Y[:, 0] if classes == 1 else Y


def test_probe_learns_binary_signal() -> None:
    rng = np.random.default_rng(0)
    (Xtr, ytr), (Xv, yv), (Xte, yte) = (_data(n, rng) for n in (4000, 1000, 1000))
    scores = probe_scores(Xtr, ytr, Xv, yv, Xte, "binary")
    assert scores.shape == (1000,)
    assert auroc(yte, scores) > 0.8
    assert 0.45 < auroc(yte, rng.random(1000)) < 0.55  # the bar is meaningful


def test_probe_multilabel_shapes_and_signal() -> None:
    rng = np.random.default_rng(1)
    (Xtr, Ytr), (Xv, Yv), (Xte, Yte) = (_data(n, rng, classes=3) for n in (4000, 1000, 1000))
    scores = probe_scores(Xtr, Ytr, Xv, Yv, Xte, "multilabel")
    assert scores.shape == (1000, 3)
    assert macro_auroc(Yte, scores) > 0.8
