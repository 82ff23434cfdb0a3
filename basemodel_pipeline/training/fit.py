"""The one epoch loop: epochs of training, each validated; the best epoch's weights kept; early stopping;
resume; history. Pretraining (training/pretrain.py, its epochs stepped by training/epochs.EpochRunner), the
scenario networks (scenarios/network.py) and the embedding probe (training/probe.py) all train through `fit`.

An epoch is what the caller's `train(run, epoch)` does (optimizer steps, each reported with run.stepped); its
validation value is `validate(epoch)`. `fit` records the epoch in run.history, keeps the weights of the best
epoch (or of the last, for a refit of a known number of epochs), saves the run's state through a `Saver`
(training/resume.py) and stops once `patience` epochs in a row have not improved on the best.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from copy import deepcopy
from dataclasses import dataclass
from typing import Any

from torch import nn

from basemodel_pipeline.training.resume import RunState, Saver


@dataclass(frozen=True)
class Stopping:
    """What the validation value is and how it chooses: the kept epoch and when to stop."""

    name: str = "val_loss"  # its key in the history records ("val_loss", "val_metric")
    higher_is_better: bool = False
    patience: int | None = None  # epochs in a row without improvement that stop the training; None: never
    keep_last: bool = False  # keep the last epoch, not the best (a refit for the epochs early stopping chose)
    shown: str = ""  # its name in the log lines (default: `name`)


def score(value: float, higher_is_better: bool) -> float:
    """A validation value as a score where higher is better; a non-finite value is the worst score."""
    if not math.isfinite(value):
        return -math.inf
    return value if higher_is_better else -value


def best_epoch(history: list[dict[str, Any]], stopping: Stopping) -> int:
    """The epoch (1-based) whose weights `fit` kept for this history: the first with the best score."""
    scores = [score(float(h[stopping.name]), stopping.higher_is_better) for h in history]
    return scores.index(max(scores)) + 1


def fit(
    run: RunState,
    epochs: int,
    train: Callable[[RunState, int], Any],
    validate: Callable[[int], float],
    model: nn.Module,
    stopping: Stopping,
    log: Callable[[str], None],
    saver: Saver | None = None,
    label: str = "",
) -> RunState:
    """Train epochs run.epoch .. epochs-1 (a resumed run continues where its state stands); returns `run`
    with its history, the kept epoch's validation value (run.best) and weights (run.best_state, of `model`).
    `label` starts each log line ("churn " for a scenario)."""
    shown = stopping.shown or stopping.name
    for epoch in range(run.epoch, epochs):
        if stopping.patience is not None and run.bad >= stopping.patience:  # a resumed run may have stopped
            log(f"{label}{shown} did not improve for {stopping.patience} epochs: stopping")
            break
        started = time.perf_counter()
        train(run, epoch)
        value = float(validate(epoch))
        train_loss = _end_epoch(run, epoch, value, model, stopping, time.perf_counter() - started)
        log(f"{label}epoch {epoch + 1}: train_loss={train_loss:.4f} {shown}={value:.4f}")
        if saver is not None:
            saver.epoch_end(run)
    return run


def _end_epoch(
    run: RunState, epoch: int, value: float, model: nn.Module, stopping: Stopping, seconds: float
) -> float:
    """Record the epoch, keep the weights if they are the best yet (or the last ones are kept), reset the
    per-epoch counters; returns the epoch's training loss (the mean over its examples)."""
    train_loss = run.loss_sum / max(run.loss_count, 1)
    run.history.append(
        {"epoch": epoch + 1, "train_loss": train_loss, stopping.name: value, "seconds": round(seconds, 2)}
    )
    better = score(value, stopping.higher_is_better) > score(run.best, stopping.higher_is_better)
    if run.best_state is None or better or stopping.keep_last:
        run.best, run.best_state, run.bad = value, deepcopy(model.state_dict()), 0
    else:
        run.bad += 1
    run.epoch, run.batch, run.loss_sum, run.loss_count = epoch + 1, 0, 0.0, 0
    return train_loss
