"""Multiclass: which one of C classes (a household's favourite department)? Softmax over C outputs,
cross-entropy, biases at the log class frequencies.

Outputs are probabilities [n, C] that sum to 1; the scenario is judged by accuracy. Blends average
log-probabilities. The popularity baseline is the entity's recent share of events with each class (plus
"(other)", the rest of its events), normalised. The predictions table holds a row per (entity, class): the
whole distribution."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import Scenario
from basemodel_pipeline.errors import ConfigError
from basemodel_pipeline.evaluation import metrics
from basemodel_pipeline.targets.columns import class_values, most_frequent_code
from basemodel_pipeline.targets.labels import Examples, Labels, TargetSpec
from basemodel_pipeline.targets.windows import candidate_pairs
from basemodel_pipeline.tasks.base import Label, Task, register

EPS = 1e-6  # probabilities are clipped to at least EPS before their log (blends)
OTHER_CLASS = "(other)"  # the class of every value past top_k (target.other_class)


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(1, keepdims=True)
    ez = np.exp(z)
    return ez / ez.sum(1, keepdims=True)


def class_rows(ids: np.ndarray, as_of: dt.date, labels: np.ndarray, scores: np.ndarray, keep: np.ndarray):
    """Predictions with one row per (entity, label) where keep [n, C] is true."""
    rows, cols = np.nonzero(keep)
    return pa.table(
        {
            "entity_id": ids[rows],
            "as_of": pa.array([as_of] * len(rows), pa.date32()),
            "label": labels[cols],
            "score": scores[rows, cols],
        }
    )


@register
class Multiclass(Task):
    name = "multiclass"
    primary_metric = "accuracy"
    lightgbm = "multiclass"
    per_class = True
    explainable = True
    charts = "curves"

    @property
    def out_dim(self) -> int:
        return len(self.spec.classes)

    # ---- target -> labels ----------------------------------------------------------------------------
    @classmethod
    def choose_spec(cls, cache: EventCache, scenario: Scenario, train_times: np.ndarray) -> TargetSpec:
        """The top_k values most often an example's most frequent one in training (and "(other)")."""
        target, values = scenario.target, class_values(cache, scenario)
        e, t = candidate_pairs(cache, scenario, train_times)
        _, top = most_frequent_code(cache, scenario, e, t)
        freq = np.bincount(top, minlength=len(values))
        freq[0] = 0
        codes = np.argsort(-freq, kind="stable")[: target.top_k]
        codes = np.sort(codes[freq[codes] > 0])
        classes = [str(values[c]) for c in codes]
        if target.other_class and (freq > 0).sum() > len(codes):
            classes.append(OTHER_CLASS)
        if len(classes) < 2:
            raise ConfigError(
                f"scenario '{scenario.name}': fewer than 2 classes of '{target.column}' in training"
            )
        return TargetSpec(cls.name, classes, codes.tolist())

    def examples(self, cache: EventCache, scenario: Scenario, times: np.ndarray) -> Examples:
        """The class of the window's most frequent value (examples without a matching event dropped)."""
        spec = self.spec
        e, t = candidate_pairs(cache, scenario, times)
        ex_idx, code = most_frequent_code(cache, scenario, e, t)
        size = cache.source(scenario.target.source).info[scenario.target.column].vocab_size + 1
        other = len(spec.classes) - 1 if spec.classes[-1] == OTHER_CLASS else -1
        lut = np.full(size, other, np.int64)
        lut[np.asarray(spec.class_codes, np.int64)] = np.arange(len(spec.class_codes))
        cls = lut[code]
        keep = cls >= 0
        return Examples(e[ex_idx[keep]], t[ex_idx[keep]], cls[keep])

    # ---- labels -> targets ---------------------------------------------------------------------------
    def init_bias(self, head: nn.Linear, labels: Labels) -> None:
        freq = np.bincount(np.asarray(labels, np.int64), minlength=head.out_features) + 1.0
        with torch.no_grad():
            head.bias.copy_(torch.from_numpy(np.log(freq / freq.sum()).astype(np.float32)))

    def targets(self, labels: Labels, idx: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(labels, np.int64)[idx])

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits, target)

    # ---- decoding ------------------------------------------------------------------------------------
    def scores(self, logits: np.ndarray) -> np.ndarray:
        z = logits - logits.max(1, keepdims=True)
        ez = np.exp(z.astype(np.float64))
        return ez / ez.sum(1, keepdims=True)

    def finish(self, out: np.ndarray) -> np.ndarray:
        """Every class a column: a class LightGBM never saw in training (the highest codes) scores 0."""
        n = len(self.spec.classes)
        return np.c_[out, np.zeros((len(out), n - out.shape[1]))] if out.shape[1] < n else out

    def link(self, out: np.ndarray) -> np.ndarray:
        return np.log(np.clip(np.asarray(out, np.float64), EPS, 1.0))

    def unlink(self, z: np.ndarray) -> np.ndarray:
        return softmax(z)

    @classmethod
    def indicators(cls, truth: Any, n_classes: int) -> np.ndarray:
        return np.eye(n_classes)[np.asarray(truth)]

    # ---- metrics -------------------------------------------------------------------------------------
    @classmethod
    def evaluate(cls, y: Any, score: Any, k: int = 10, log1p: bool = False) -> dict[str, float]:
        return {
            "accuracy": metrics.accuracy(y, score),
            f"top{k}_accuracy": metrics.top_k_accuracy(y, score, k),
            "top3_accuracy": metrics.top_k_accuracy(y, score, 3),
            "log_loss": metrics.multiclass_log_loss(y, score),
            "macro_auroc_ovr": metrics.macro_auroc(np.eye(score.shape[1])[np.asarray(y)], score),
        }

    @classmethod
    def primary(cls, y: Any, score: Any) -> float:
        # the accuracy alone: evaluate's macro AUROC would cost a bootstrap C ranks a resample
        return metrics.accuracy(y, score)

    # ---- baselines -----------------------------------------------------------------------------------
    def class_prior(self, labels: Labels) -> np.ndarray:
        return np.bincount(np.asarray(labels, np.int64), minlength=len(self.spec.classes)) / max(
            len(labels), 1
        )

    def constant_prior(self, y: np.ndarray) -> np.ndarray:
        return np.bincount(y.astype(np.int64), minlength=len(self.spec.classes)) / len(y)

    def popularity(
        self, cache: EventCache, entity: np.ndarray, time: np.ndarray, scenario: Scenario, prior: Any
    ) -> np.ndarray:
        pop = self.column_shares(cache, entity, time, scenario, prior)
        if len(self.spec.classes) > pop.shape[1]:  # "(other)": the rest of the entity's events
            pop = np.c_[pop, np.clip(1.0 - pop.sum(1), 0.0, None)]
        return pop / np.maximum(pop.sum(1, keepdims=True), 1e-12)

    # ---- outputs -------------------------------------------------------------------------------------
    def output_table(
        self, ids: np.ndarray, as_of: dt.date, out: Any, top_k: int | None, threshold: float | None
    ) -> pa.Table:
        classes = np.array(self.spec.classes, dtype=object)
        return class_rows(ids, as_of, classes, out, np.ones(out.shape, dtype=bool))

    # ---- explanations --------------------------------------------------------------------------------
    def explained(self, out: torch.Tensor, index: int) -> torch.Tensor:
        return torch.log_softmax(out, -1)[:, index]

    def explained_what(self, label: str | None) -> str:
        return f"log-probability of class '{label}' (log-softmax)"

    # ---- python targets ------------------------------------------------------------------------------
    def check_label(self, value: Any) -> Label:
        """A class name or a class index."""
        classes = self.spec.classes
        if isinstance(value, str):
            if value not in classes:
                raise ValueError(f"returned class '{value}', not one of target.classes {classes}")
            return float(classes.index(value))
        k = super().check_label(value)
        if k != int(k) or not 0 <= k < len(classes):
            raise ValueError(f"returned class index {k}; needs an integer in [0, {len(classes)})")
        return k

    def stack_labels(self, labels: list[Label]) -> np.ndarray:
        return np.asarray(labels, np.int64)
