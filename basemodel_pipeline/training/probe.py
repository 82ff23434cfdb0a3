"""Embedding probe (RecSys Challenge 2025 style): one fixed MLP per task trained on frozen inputs.

The same probe runs on the foundation embeddings and on the hand-crafted aggregates, so the comparison
measures the representation, not the downstream model. Its epochs are training/fit.py's; scores are judged by
a ``Metric`` (evaluation/resampling.py), a function of (labels, scores) such as a task's ``primary`` (tasks/).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from basemodel_pipeline.evaluation.resampling import Metric, entity_folds
from basemodel_pipeline.training.fit import Stopping, fit
from basemodel_pipeline.training.resume import RunState

PROBE_HIDDEN = 256
PROBE_EPOCHS = 6
PROBE_MIN_STEPS = 300  # small training sets get more epochs, so that every probe takes enough optimizer steps
PROBE_LR = 1e-3
PROBE_BATCH = 512


def _standardise(train: np.ndarray, *others: np.ndarray) -> list[np.ndarray]:
    train = np.nan_to_num(train.astype(np.float32))
    mean, std = train.mean(0), train.std(0) + 1e-6
    return [(x - mean) / std for x in (train, *(np.nan_to_num(o.astype(np.float32)) for o in others))]


def probe_scores(
    X_train: np.ndarray,
    Y_train: np.ndarray,
    X_val: np.ndarray,
    Y_val: np.ndarray,
    X_test: np.ndarray,
    metric: Metric,
    seed: int = 0,
) -> np.ndarray:
    """Train the fixed probe (Linear-ReLU-Linear, AdamW, PROBE_EPOCHS epochs or at least PROBE_MIN_STEPS
    steps, best epoch on validation by `metric`, higher is better) and return test probabilities [n] or
    [n, C]."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    Xtr, Xv, Xte = _standardise(X_train, X_val, X_test)
    Ytr = Y_train.reshape(len(Y_train), -1).astype(np.float32)
    net = nn.Sequential(
        nn.Linear(Xtr.shape[1], PROBE_HIDDEN),
        nn.ReLU(),
        nn.Dropout(0.2),
        nn.Linear(PROBE_HIDDEN, Ytr.shape[1]),
    )
    opt = torch.optim.AdamW(net.parameters(), lr=PROBE_LR, weight_decay=1e-4)
    loss_fn = nn.BCEWithLogitsLoss()
    batches = max(1, len(Xtr) // PROBE_BATCH)

    def train(run: RunState, epoch: int) -> None:
        net.train()
        for idx in np.array_split(rng.permutation(len(Xtr)), batches):
            loss = loss_fn(net(torch.from_numpy(Xtr[idx])), torch.from_numpy(Ytr[idx]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.stepped(epoch, float(loss.detach()), len(idx))

    def predict(X: np.ndarray) -> np.ndarray:
        net.eval()
        with torch.no_grad():
            p = torch.sigmoid(net(torch.from_numpy(X))).numpy()
        return p[:, 0] if Ytr.shape[1] == 1 else p

    epochs = max(PROBE_EPOCHS, -(-PROBE_MIN_STEPS // batches))
    best = Stopping("val_metric", higher_is_better=True)  # the best epoch, no early stopping
    run = fit(RunState(), epochs, train, lambda _: metric(Y_val, predict(Xv)), net, best, lambda _: None)
    assert run.best_state is not None
    net.load_state_dict(run.best_state)
    return predict(Xte)


def cross_fitted_scores(
    X: np.ndarray, Y: np.ndarray, entity: np.ndarray, metric: Metric, folds: int = 5, seed: int = 0
) -> np.ndarray:
    """Out-of-fold probe scores [n] or [n, C] when there is a single time point (RecSys Challenge 2025:
    one embedding per entity as of a date, targets after it). For fold f the probe fits on the other folds
    except f + 1, chooses its epoch on fold f + 1 and scores fold f, so no entity is scored by a probe that
    saw it. Score them per fold (fold_metric with entity_folds(entity, folds)), not pooled."""
    if folds < 3:
        raise ValueError(f"cross_fitted_scores needs at least 3 folds, got {folds}")
    fold = entity_folds(entity, folds)
    out: np.ndarray | None = None
    for f in range(folds):
        test, val = fold == f, fold == (f + 1) % folds
        fit = ~(test | val)
        scores = probe_scores(X[fit], Y[fit], X[val], Y[val], X[test], metric, seed)
        if out is None:
            out = np.zeros((len(X), *scores.shape[1:]), np.float32)
        out[test] = scores
    assert out is not None
    return out
