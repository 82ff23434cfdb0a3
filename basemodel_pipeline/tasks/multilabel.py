"""Multilabel: which of C labels apply (the departments a household buys from)? A binary question per label:
C sigmoid outputs, binary cross-entropy, labels densified per mini-batch (thousands of labels cost memory
only per batch), biases at each label's log-odds.

Outputs are probabilities [n, C]; the scenario is judged by macro AUROC (over the labels with both values).
LightGBM fits one booster per label (the most frequent ``lightgbm_top_labels``), the popularity baseline is
the entity's recent share of events with each label. The predictions table holds a row per (entity, label):
every label up to MAX_LABELS_ALL labels, else the DEFAULT_TOP_K best (or ``--top-k`` / ``--threshold``)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pyarrow as pa

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import Scenario
from basemodel_pipeline.errors import ConfigError
from basemodel_pipeline.evaluation import baselines, metrics
from basemodel_pipeline.targets.columns import check_column, code_counts
from basemodel_pipeline.targets.events import target_source, vocab, window_events
from basemodel_pipeline.targets.labels import (
    Examples,
    Labels,
    SparseLabels,
    TargetDetails,
    TargetSpec,
    dense_labels,
)
from basemodel_pipeline.targets.windows import candidate_pairs
from basemodel_pipeline.tasks.base import Label, register
from basemodel_pipeline.tasks.binary import Binary, sigmoid
from basemodel_pipeline.tasks.multiclass import class_rows

MAX_LABELS_ALL = 100  # predictions: every label's score up to this many labels
DEFAULT_TOP_K = 20  # predictions: the best labels per entity above MAX_LABELS_ALL labels
SPARSE_FROM_CLASSES = 512  # targets with more classes keep their labels sparse (densified per mini-batch)


class MultilabelDetails(TargetDetails):
    """A multilabel spec's details: over a list-valued column, the cache's indicator column of each class
    (cache/plan.py), in the order of the classes; [] for a column of single values (the class codes)."""

    list_columns: list[str] = []


def _no_value_error(scenario: Scenario) -> ConfigError:
    target = scenario.target
    return ConfigError(
        f"scenario '{scenario.name}': no value of '{target.column}' has >= "
        f"{target.min_positive_entities} positive entities in training; lower min_positive_entities"
    )


def _list_spec(
    cache: EventCache, scenario: Scenario, indicators: list, train_times: np.ndarray
) -> TargetSpec:
    """Over a list-valued column: one label per indicated value (cache/plan.py: the column's most frequent
    values), kept like any multilabel class (min_positive_entities, top_k)."""
    target = scenario.target
    e, t = candidate_pairs(cache, scenario, train_times)
    owner, rows = window_events(cache, scenario, e, t)
    src = cache.source(target.source)
    buyers = np.array(
        [len(np.unique(e[owner[np.asarray(src.columns[i.name])[rows] > 0]])) for i in indicators], np.int64
    )
    keep = np.flatnonzero(buyers >= max(target.min_positive_entities, 1))
    if target.top_k is not None:
        keep = np.sort(keep[np.argsort(-buyers[keep], kind="stable")[: target.top_k]])
    if not len(keep):
        raise _no_value_error(scenario)
    chosen = [indicators[k] for k in keep]
    details = MultilabelDetails(list_columns=[i.name for i in chosen])
    return TargetSpec("multilabel", [i.list_value for i in chosen], [], details)


def list_label_pairs(
    cache: EventCache, scenario: Scenario, spec: TargetSpec, e: np.ndarray, t: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(example index, class) of every list value present in a matching window event."""
    owner, rows = window_events(cache, scenario, e, t)
    src = cache.source(scenario.target.source)
    pairs = [
        np.unique(owner[np.asarray(src.columns[c])[rows] > 0]) * len(spec.classes) + j
        for j, c in enumerate(spec.details.list_columns)  # type: ignore[attr-defined]  # MultilabelDetails
    ]
    key = np.unique(np.concatenate(pairs)) if pairs else np.zeros(0, np.int64)
    return key // len(spec.classes), key % len(spec.classes)


@register
class Multilabel(Binary):
    name = "multilabel"
    primary_metric = "macro_auroc"
    per_class = True
    per_label = True
    calibrate_blend = False
    needs_both_labels = False
    details = MultilabelDetails

    @property
    def list_columns(self) -> list[str]:
        return self.spec.details.list_columns  # type: ignore[attr-defined]  # checked by Task

    @property
    def out_dim(self) -> int:
        return len(self.spec.classes)

    def truth(self, labels: Labels) -> np.ndarray:
        return dense_labels(labels)

    # ---- target -> labels ----------------------------------------------------------------------------
    @classmethod
    def choose_spec(cls, cache: EventCache, scenario: Scenario, train_times: np.ndarray) -> TargetSpec:
        """The values bought by at least min_positive_entities entities in training (the top_k of them)."""
        target, src = scenario.target, target_source(cache, scenario)
        indicators = src.list_indicators(target.column)
        if indicators:
            return _list_spec(cache, scenario, indicators, train_times)
        check_column(src, scenario, target.column, "categorical")
        values = vocab(src, target.column)[0]
        e, t = candidate_pairs(cache, scenario, train_times)
        ex_idx, code, _ = code_counts(cache, scenario, e, t, target.column)
        pairs = np.unique(e[ex_idx] * len(values) + code)  # distinct (entity, value) buyers
        buyers = np.bincount(pairs % len(values), minlength=len(values))
        codes = np.arange(1, len(values))
        codes = codes[buyers[1:] >= max(target.min_positive_entities, 0)]
        if target.min_positive_entities > 0:
            codes = codes[buyers[codes] > 0]
        if target.top_k is not None:
            codes = codes[np.argsort(-buyers[codes], kind="stable")[: target.top_k]]
            codes.sort()
        if len(codes) < 1:
            raise _no_value_error(scenario)
        return TargetSpec(cls.name, [str(values[c]) for c in codes], codes.tolist(), MultilabelDetails())

    def examples(self, cache: EventCache, scenario: Scenario, times: np.ndarray) -> Examples:
        """1 for each class with a matching event in the window; sparse above SPARSE_FROM_CLASSES classes."""
        spec = self.spec
        e, t = candidate_pairs(cache, scenario, times)
        if self.list_columns:
            ex_idx, cls = list_label_pairs(cache, scenario, spec, e, t)
            keep = np.ones(len(cls), bool)
        else:
            ex_idx, code, _ = code_counts(cache, scenario, e, t, scenario.target.column)
            size = cache.source(scenario.target.source).info[scenario.target.column].vocab_size + 1
            lut = np.full(size, -1, np.int64)
            lut[np.asarray(spec.class_codes, np.int64)] = np.arange(len(spec.class_codes))
            cls = lut[code]
            keep = cls >= 0
        n_cls = len(spec.classes)
        labels = SparseLabels.from_pairs(ex_idx[keep], cls[keep], np.ones(keep.sum()), len(e), n_cls)
        return Examples(e, t, labels.dense() if n_cls <= SPARSE_FROM_CLASSES else labels)

    def scores(self, logits: np.ndarray) -> np.ndarray:
        return sigmoid(logits.astype(np.float64))

    # ---- metrics -------------------------------------------------------------------------------------
    @classmethod
    def evaluate(cls, y: Any, score: Any, k: int = 10, log1p: bool = False) -> dict[str, float]:
        return {
            "macro_auroc": metrics.macro_auroc(y, score),
            "micro_auroc": metrics.micro_auroc(y, score),
            "macro_average_precision": metrics.average_precision(y, score),
            "micro_average_precision": metrics.micro_average_precision(y, score),
            "macro_log_loss": metrics.macro_log_loss(y, score),
            "micro_log_loss": metrics.log_loss(y, score),
        }

    @classmethod
    def primary(cls, y: Any, score: Any) -> float:
        return metrics.macro_auroc(y, score)

    @classmethod
    def metric_width(cls, out: np.ndarray) -> int:
        return out.shape[1] if np.ndim(out) == 2 else 1

    # ---- baselines -----------------------------------------------------------------------------------
    def class_prior(self, labels: Labels) -> np.ndarray:
        if isinstance(labels, SparseLabels):
            return np.bincount(labels.indices, minlength=len(self.spec.classes)) / max(len(labels), 1)
        return (np.asarray(labels) > 0).mean(0)

    def constant_prior(self, y: np.ndarray) -> np.ndarray:
        return y.mean(0)

    def popularity(
        self, cache: EventCache, entity: np.ndarray, time: np.ndarray, scenario: Scenario, prior: Any
    ) -> np.ndarray:
        """The entity's share of recent events with each label (90 days; a list column's values, or the
        target column's codes), the training prior breaking ties."""
        if self.list_columns:
            return baselines.list_shares(
                cache, scenario.target.source, entity, time, self.list_columns, prior
            )
        return self.column_shares(cache, entity, time, scenario, prior)

    # ---- outputs -------------------------------------------------------------------------------------
    def output_table(
        self, ids: np.ndarray, as_of: dt.date, out: Any, top_k: int | None, threshold: float | None
    ) -> pa.Table:
        keep = np.ones(out.shape, dtype=bool)
        if top_k is None and threshold is None and len(self.spec.classes) > MAX_LABELS_ALL:
            top_k = DEFAULT_TOP_K
        if top_k is not None:
            kth = np.sort(out, axis=1)[:, -min(top_k, out.shape[1])][:, None]
            keep &= out >= kth
        if threshold is not None:
            keep &= out >= threshold
        return class_rows(ids, as_of, np.array(self.spec.classes, dtype=object), out, keep)

    # ---- explanations --------------------------------------------------------------------------------
    def explained_what(self, label: str | None) -> str:
        return f"logit of the probability of class '{label}'"

    # ---- python targets ------------------------------------------------------------------------------
    def check_label(self, value: Any) -> Label:
        arr, want = np.asarray(value, dtype=np.float64), (len(self.spec.classes),)
        if arr.shape != want:
            raise ValueError(f"returned shape {arr.shape}; a {self.name} target needs shape {want}")
        if not np.all(np.isfinite(arr)):
            raise ValueError("returned NaN or inf")
        if not np.all((arr == 0) | (arr == 1)):
            raise ValueError(f"returned {arr.ravel()[:5].tolist()}; a {self.name} target holds 0/1 values")
        return arr

    def stack_labels(self, labels: list[Label]) -> np.ndarray:
        return np.asarray(labels, np.float32).reshape(len(labels), len(self.spec.classes))
