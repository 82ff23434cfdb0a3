"""Binary: will it happen (churn, a purchase in the window)? One sigmoid output, binary cross-entropy.

Outputs are probabilities [n]; the scenario is judged by AUROC. Blends average logits and then calibrate the
blended logit (Platt scaling). The popularity baseline ranks by recent activity (distinct active days in the
28 days before the split), reversed for a target that is the absence of events (churn)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import Scenario
from basemodel_pipeline.evaluation import baselines, metrics
from basemodel_pipeline.targets.events import window_events
from basemodel_pipeline.targets.labels import Examples, Labels, SparseLabels, dense_labels
from basemodel_pipeline.targets.windows import candidate_pairs
from basemodel_pipeline.tasks.base import Label, Task, register

EPS = 1e-6  # probabilities are clipped to [EPS, 1 - EPS] before their logit


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, np.float64), EPS, 1 - EPS)
    return np.log(p / (1 - p))


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


@register
class Binary(Task):
    name = "binary"
    primary_metric = "auroc"
    lightgbm = "binary"
    explainable = True
    calibrate_blend = True
    needs_both_labels = True
    charts = "curves"

    # ---- target -> labels ----------------------------------------------------------------------------
    def examples(self, cache: EventCache, scenario: Scenario, times: np.ndarray) -> Examples:
        """1 when the window holds a matching event (``event: any``), or none (``event: none``: churn)."""
        e, t = candidate_pairs(cache, scenario, times)
        owner, _ = window_events(cache, scenario, e, t)
        any_event = np.bincount(owner, minlength=len(e)) > 0
        label = any_event if scenario.target.event == "any" else ~any_event
        return Examples(e, t, label.astype(np.float32))

    # ---- labels -> targets ---------------------------------------------------------------------------
    def init_bias(self, head: nn.Linear, labels: Labels) -> None:
        """Each output's bias at the log-odds of its training prevalence (clipped to [1e-4, 1 - 1e-4])."""
        if isinstance(labels, SparseLabels):
            prev = np.bincount(labels.indices, minlength=labels.n_cols) / max(len(labels), 1)
        else:
            y = dense_labels(labels)
            prev = y.reshape(len(y), -1).mean(0)
        prev = np.clip(prev, 1e-4, 1 - 1e-4)
        with torch.no_grad():
            head.bias.copy_(torch.from_numpy(np.log(prev / (1 - prev)).astype(np.float32)))

    def targets(self, labels: Labels, idx: np.ndarray) -> torch.Tensor:
        """0/1 targets [len(idx), out_dim], densified per mini-batch (thousands of labels cost memory only
        per batch)."""
        y = dense_labels(labels, idx)
        return torch.from_numpy(np.ascontiguousarray(y.reshape(len(idx), -1), dtype=np.float32))

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.binary_cross_entropy_with_logits(logits, target)

    # ---- decoding ------------------------------------------------------------------------------------
    def scores(self, logits: np.ndarray) -> np.ndarray:
        return sigmoid(logits.astype(np.float64))[:, 0]

    def link(self, out: np.ndarray) -> np.ndarray:
        return logit(out)

    def unlink(self, z: np.ndarray) -> np.ndarray:
        return sigmoid(z)

    # ---- metrics -------------------------------------------------------------------------------------
    @classmethod
    def evaluate(cls, y: Any, score: Any, k: int = 10, log1p: bool = False) -> dict[str, float]:
        return {
            "auroc": metrics.auroc(y, score),
            "average_precision": metrics.average_precision(y, score),
            "log_loss": metrics.log_loss(y, score),
        }

    @classmethod
    def primary(cls, y: Any, score: Any) -> float:
        return metrics.auroc(y, score)

    # ---- baselines -----------------------------------------------------------------------------------
    def popularity(
        self, cache: EventCache, entity: np.ndarray, time: np.ndarray, scenario: Scenario, prior: Any
    ) -> np.ndarray:
        """Recent activity; its negative for a target that is the absence of events (``event: none``)."""
        target = scenario.target
        pop = baselines.recent_activity(cache, entity, time, target.source)
        return -pop if getattr(target, "event", None) == "none" else pop

    # ---- outputs -------------------------------------------------------------------------------------
    def output_table(
        self, ids: np.ndarray, as_of: dt.date, out: Any, top_k: int | None, threshold: float | None
    ) -> pa.Table:
        return pa.table({"entity_id": ids, "as_of": pa.array([as_of] * len(ids), pa.date32()), "score": out})

    # ---- explanations --------------------------------------------------------------------------------
    def explained_what(self, label: str | None) -> str:
        return "logit of the score (log-odds of the probability)"

    # ---- python targets ------------------------------------------------------------------------------
    def check_label(self, value: Any) -> Label:
        label = super().check_label(value)
        if label not in (0.0, 1.0):
            raise ValueError(f"returned {[label]}; a {self.name} target holds 0/1 values")
        return label
