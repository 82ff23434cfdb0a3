"""Embedding probe (RecSys Challenge 2025 style): one fixed MLP per task trained on frozen inputs.

The same probe runs on the foundation embeddings and on the hand-crafted aggregates, so the comparison
measures the representation, not the downstream model.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from basemodel_pipeline.evaluation.metrics import primary_metric

PROBE_HIDDEN = 256
PROBE_EPOCHS = 6
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
    task: str,
    seed: int = 0,
) -> np.ndarray:
    """Train the fixed probe (Linear-ReLU-Linear, AdamW, PROBE_EPOCHS epochs, best epoch on validation)
    and return test probabilities [n] or [n, C]."""
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
    best, best_test = -np.inf, None
    for _ in range(PROBE_EPOCHS):
        net.train()
        for idx in np.array_split(rng.permutation(len(Xtr)), max(1, len(Xtr) // PROBE_BATCH)):
            loss = loss_fn(net(torch.from_numpy(Xtr[idx])), torch.from_numpy(Ytr[idx]))
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            pv = torch.sigmoid(net(torch.from_numpy(Xv))).numpy()
            pt = torch.sigmoid(net(torch.from_numpy(Xte))).numpy()
        if Ytr.shape[1] == 1:
            pv, pt = pv[:, 0], pt[:, 0]
        score = primary_metric(task, Y_val, pv)
        if score > best:
            best, best_test = score, pt
    assert best_test is not None
    return best_test
