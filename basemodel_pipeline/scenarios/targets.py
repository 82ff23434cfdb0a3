"""Targets -> labelled examples (entity index, split time, label) from the event cache.

Declarative targets are vectorised over all examples at once (CSR window rows, bincount); Python targets
(scenarios/python_target.py) are called per example. Labels with many columns (large multilabel,
recommendation) are kept sparse (``SparseLabels``) and densified one mini-batch at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from basemodel_pipeline.cache.store import EventCache, EventSource
from basemodel_pipeline.config.models import (
    BinaryTarget,
    MulticlassTarget,
    MultilabelTarget,
    PythonTarget,
    RecommendationTarget,
    RegressionTarget,
    Scenario,
)
from basemodel_pipeline.dates import DAY
from basemodel_pipeline.errors import ConfigError
from basemodel_pipeline.scenarios.events import filter_rows, vocab

SPARSE_FROM_CLASSES = 512  # multilabel targets with more classes keep their labels sparse
OTHER_CLASS = "(other)"


@dataclass
class SparseLabels:
    """Row-compressed labels [n, n_cols]: row i holds columns indices[indptr[i]:indptr[i+1]] with values."""

    indptr: np.ndarray  # int64 [n + 1]
    indices: np.ndarray  # int64 [nnz]
    values: np.ndarray  # float32 [nnz]
    n_cols: int

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.indptr) - 1, self.n_cols

    def __len__(self) -> int:
        return len(self.indptr) - 1

    def rows(self, idx: np.ndarray) -> SparseLabels:
        idx = np.asarray(idx, dtype=np.int64)
        lo, hi = self.indptr[idx], self.indptr[idx + 1]
        lengths = hi - lo
        take = np.repeat(lo - np.r_[0, np.cumsum(lengths)[:-1]], lengths) + np.arange(lengths.sum())
        return SparseLabels(np.r_[0, np.cumsum(lengths)], self.indices[take], self.values[take], self.n_cols)

    def dense(self, idx: np.ndarray | None = None) -> np.ndarray:
        part = self if idx is None else self.rows(idx)
        out = np.zeros(part.shape, dtype=np.float32)
        owner = np.repeat(np.arange(len(part)), np.diff(part.indptr))
        out[owner, part.indices] = part.values
        return out

    @classmethod
    def from_pairs(
        cls, owner: np.ndarray, col: np.ndarray, value: np.ndarray, n: int, n_cols: int
    ) -> SparseLabels:
        order = np.lexsort((col, owner))
        indptr = np.r_[0, np.cumsum(np.bincount(owner, minlength=n))].astype(np.int64)
        return cls(indptr, col[order].astype(np.int64), value[order].astype(np.float32), n_cols)


Labels = np.ndarray | SparseLabels


def take_labels(labels: Labels, idx: np.ndarray) -> Labels:
    return labels.rows(idx) if isinstance(labels, SparseLabels) else labels[idx]


def dense_labels(labels: Labels, idx: np.ndarray | None = None) -> np.ndarray:
    if isinstance(labels, SparseLabels):
        return labels.dense(idx)
    return labels if idx is None else labels[idx]


def label_columns(labels: Labels, cols: np.ndarray) -> np.ndarray:
    """Dense [n, len(cols)] of the given label columns (without densifying the others)."""
    if not isinstance(labels, SparseLabels):
        return np.asarray(labels)[:, cols]
    lut = np.full(labels.n_cols, -1, np.int64)
    lut[np.asarray(cols, np.int64)] = np.arange(len(cols))
    owner = np.repeat(np.arange(len(labels)), np.diff(labels.indptr))
    j = lut[labels.indices]
    out = np.zeros((len(labels), len(cols)), np.float32)
    out[owner[j >= 0], j[j >= 0]] = labels.values[j >= 0]
    return out


@dataclass
class Examples:
    entity: np.ndarray  # int64 [n] entity index
    time: np.ndarray  # int64 [n] split time, epoch seconds
    labels: (
        Labels  # binary/regression [n]; multiclass [n] int class; multilabel [n, C]; recommendation sparse
    )

    def __len__(self) -> int:
        return len(self.entity)

    def subset(self, keep: np.ndarray) -> Examples:
        idx = np.flatnonzero(keep) if np.asarray(keep).dtype == bool else np.asarray(keep)
        return Examples(self.entity[idx], self.time[idx], take_labels(self.labels, idx))


def concat_examples(parts: list[Examples]) -> Examples:
    """The rows of several Examples, in order (dense or sparse labels alike)."""
    labels = [p.labels for p in parts]
    if isinstance(labels[0], SparseLabels):
        sizes = np.cumsum([0] + [lab.indptr[-1] for lab in labels[:-1]])
        indptr = np.concatenate(
            [[0]] + [lab.indptr[1:] + off for lab, off in zip(labels, sizes, strict=True)]
        )
        merged: Labels = SparseLabels(
            indptr.astype(np.int64),
            np.concatenate([lab.indices for lab in labels]),
            np.concatenate([lab.values for lab in labels]),
            labels[0].n_cols,
        )
    else:
        merged = np.concatenate([np.asarray(lab) for lab in labels])
    return Examples(
        np.concatenate([p.entity for p in parts]), np.concatenate([p.time for p in parts]), merged
    )


@dataclass
class TargetSpec:
    """What a trained scenario needs to rebuild its labels and decode its outputs: stored in the checkpoint.

    ``extra`` holds task-specific values: regression ``mean``/``std``/``log1p``; recommendation ``n_items``,
    ``head`` (dense | sketch), ``partitions``, ``width``, ``seed``, ``popularity`` [n_items] (training
    target counts) and ``items`` (item names, code k -> items[k - 1])."""

    task: str
    classes: list[str]  # class names (multiclass/multilabel); [] otherwise
    class_codes: list[int]  # vocabulary codes of the classes in the target column ([] for python targets)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"task": self.task, "classes": self.classes, "class_codes": self.class_codes, **self.extra}

    @classmethod
    def from_dict(cls, d: dict) -> TargetSpec:
        rest = {k: v for k, v in d.items() if k not in ("task", "classes", "class_codes")}
        return cls(d["task"], list(d.get("classes", [])), list(d.get("class_codes", [])), rest)

    @property
    def out_dim(self) -> int:
        if self.task in ("multiclass", "multilabel"):
            return len(self.classes)
        if self.task == "recommendation":
            e = self.extra
            return e["n_items"] if e["head"] == "dense" else e["partitions"] * e["width"]
        return 2 if self.task == "regression" and self.extra.get("hurdle") else 1


# ---- shared pieces ---------------------------------------------------------------------------------
def _grid(cache: EventCache, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = cache.n_entities
    return np.repeat(np.arange(n, dtype=np.int64), len(times)), np.tile(times.astype(np.int64), n)


def population(
    cache: EventCache, source: str, e: np.ndarray, t: np.ndarray, active_days: int | None
) -> np.ndarray:
    """Entities with history before t (and, if set, an event in the `active_days` before t)."""
    src = cache.source(source)
    pos = src.positions(e, t)
    if active_days is None:
        return pos > src.offsets[e]
    return pos > src.positions(e, t - active_days * DAY)


def _source(cache: EventCache, scenario: Scenario) -> EventSource:
    try:
        return cache.source(scenario.target.source)
    except Exception as err:
        raise ConfigError(f"scenario '{scenario.name}': target.source: {err}") from None


def _column(src: EventSource, scenario: Scenario, column: str, kind: str) -> None:
    info = src.info.get(column)
    if info is None or info.type != kind:
        known = ", ".join(c for c, i in src.info.items() if i.type == kind) or "none"
        raise ConfigError(
            f"scenario '{scenario.name}': target.column '{column}' is not a {kind} column of source "
            f"'{src.name}' ({kind} columns: {known})"
        )


def window_events(
    cache: EventCache, scenario: Scenario, e: np.ndarray, t: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(example index, event row) of the target's matching events in [t, t + horizon_days)."""
    target = scenario.target
    src = _source(cache, scenario)
    owner, rows = src.window_rows(e, t, t + target.horizon_days * DAY)
    if target.filter:
        keep = filter_rows(src, rows, target.filter, f"scenario '{scenario.name}': target")
        owner, rows = owner[keep], rows[keep]
    return owner, rows


def _candidates(cache: EventCache, scenario: Scenario, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    e, t = _grid(cache, times)
    keep = population(
        cache, scenario.target.source, e, t, getattr(scenario.target, "active_in_last_days", None)
    )
    return e[keep], t[keep]


def _code_counts(
    cache: EventCache, scenario: Scenario, e: np.ndarray, t: np.ndarray, column: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct (example, code) pairs of matching window events and their event counts."""
    src = cache.source(scenario.target.source)
    owner, rows = window_events(cache, scenario, e, t)
    codes = np.asarray(src.columns[column])[rows].astype(np.int64)
    size = src.info[column].vocab_size + 1
    keys, counts = np.unique(owner * size + codes, return_counts=True)
    return keys // size, keys % size, counts


# ---- class choice (from the training windows) ------------------------------------------------------
def choose_classes(cache: EventCache, scenario: Scenario, train_times: np.ndarray) -> TargetSpec:
    """The output space of a scenario, fixed on the training windows."""
    target = scenario.target
    if isinstance(target, PythonTarget):
        return TargetSpec(scenario.task, list(target.classes), [])
    src = _source(cache, scenario)
    if isinstance(target, BinaryTarget):
        return TargetSpec("binary", [], [])
    if isinstance(target, RegressionTarget):
        if target.aggregation == "sum":
            _column(src, scenario, target.column or "", "numeric")
        return TargetSpec("regression", [], [], {"log1p": target.log1p})
    indicators = src.list_indicators(target.column)
    if indicators:
        if not isinstance(target, MultilabelTarget):
            raise ConfigError(
                f"scenario '{scenario.name}': target.column '{target.column}' holds lists of values; a list "
                f"column can be a multilabel target (one label per value), not a {scenario.task} target"
            )
        return _list_classes(cache, scenario, target, indicators, train_times)
    _column(src, scenario, target.column, "categorical")
    values = vocab(src, target.column)[0]
    e, t = _candidates(cache, scenario, train_times)
    if isinstance(target, MultilabelTarget):
        ex_idx, code, _ = _code_counts(cache, scenario, e, t, target.column)
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
            raise ConfigError(
                f"scenario '{scenario.name}': no value of '{target.column}' has >= "
                f"{target.min_positive_entities} positive entities in training; lower min_positive_entities"
            )
        return TargetSpec("multilabel", [str(values[c]) for c in codes], codes.tolist())
    if isinstance(target, MulticlassTarget):
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
        return TargetSpec("multiclass", classes, codes.tolist())
    assert isinstance(target, RecommendationTarget)
    ex = recommendation_examples(cache, scenario, None, train_times)
    assert isinstance(ex.labels, SparseLabels)
    n_items = len(values) - 1
    pop = np.bincount(ex.labels.indices, minlength=n_items).astype(np.float64)
    dense = n_items <= target.dense_max_items
    extra = {
        "n_items": n_items,
        "head": "dense" if dense else "sketch",
        "partitions": target.sketch_partitions,
        "width": target.sketch_width,
        "seed": 12345,
        "popularity": pop.astype(int).tolist(),
        "source": target.source,
        "column": target.column,
        "items": [str(v) for v in values[1:]],
    }
    return TargetSpec("recommendation", [], [], extra)


def _list_classes(
    cache: EventCache, scenario: Scenario, target: MultilabelTarget, indicators: list, train_times: np.ndarray
) -> TargetSpec:
    """Multilabel over a list-valued column: one label per indicated value (cache/plan.py: the column's most
    frequent values), kept like any multilabel class (min_positive_entities, top_k)."""
    e, t = _candidates(cache, scenario, train_times)
    owner, rows = window_events(cache, scenario, e, t)
    src = cache.source(target.source)
    buyers = np.array(
        [len(np.unique(e[owner[np.asarray(src.columns[i.name])[rows] > 0]])) for i in indicators], np.int64
    )
    keep = np.flatnonzero(buyers >= max(target.min_positive_entities, 1))
    if target.top_k is not None:
        keep = np.sort(keep[np.argsort(-buyers[keep], kind="stable")[: target.top_k]])
    if not len(keep):
        raise ConfigError(
            f"scenario '{scenario.name}': no value of '{target.column}' has >= "
            f"{target.min_positive_entities} positive entities in training; lower min_positive_entities"
        )
    chosen = [indicators[k] for k in keep]
    return TargetSpec(
        "multilabel", [i.list_value for i in chosen], [], {"list_columns": [i.name for i in chosen]}
    )


def list_label_pairs(
    cache: EventCache, scenario: Scenario, spec: TargetSpec, e: np.ndarray, t: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(example index, class) of every list value present in a matching window event."""
    owner, rows = window_events(cache, scenario, e, t)
    src = cache.source(scenario.target.source)
    pairs = [
        np.unique(owner[np.asarray(src.columns[c])[rows] > 0]) * len(spec.classes) + j
        for j, c in enumerate(spec.extra["list_columns"])
    ]
    key = np.unique(np.concatenate(pairs)) if pairs else np.zeros(0, np.int64)
    return key // len(spec.classes), key % len(spec.classes)


# ---- examples per kind -----------------------------------------------------------------------------
def binary_examples(cache: EventCache, scenario: Scenario, times: np.ndarray) -> Examples:
    e, t = _candidates(cache, scenario, times)
    owner, _ = window_events(cache, scenario, e, t)
    any_event = np.bincount(owner, minlength=len(e)) > 0
    label = any_event if scenario.target.event == "any" else ~any_event
    return Examples(e, t, label.astype(np.float32))


def multilabel_examples(
    cache: EventCache, scenario: Scenario, spec: TargetSpec, times: np.ndarray
) -> Examples:
    e, t = _candidates(cache, scenario, times)
    if spec.extra.get("list_columns"):
        ex_idx, cls = list_label_pairs(cache, scenario, spec, e, t)
        keep = np.ones(len(cls), bool)
    else:
        ex_idx, code, _ = _code_counts(cache, scenario, e, t, scenario.target.column)
        size = cache.source(scenario.target.source).info[scenario.target.column].vocab_size + 1
        lut = np.full(size, -1, np.int64)
        lut[np.asarray(spec.class_codes, np.int64)] = np.arange(len(spec.class_codes))
        cls = lut[code]
        keep = cls >= 0
    labels = SparseLabels.from_pairs(ex_idx[keep], cls[keep], np.ones(keep.sum()), len(e), len(spec.classes))
    if len(spec.classes) <= SPARSE_FROM_CLASSES:
        return Examples(e, t, labels.dense())
    return Examples(e, t, labels)


def most_frequent_code(
    cache: EventCache, scenario: Scenario, e: np.ndarray, t: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(example index, most frequent code) for examples with matching events; ties -> the smaller code."""
    ex_idx, code, counts = _code_counts(cache, scenario, e, t, scenario.target.column)
    order = np.lexsort((code, -counts, ex_idx))
    ex_idx, code = ex_idx[order], code[order]
    first = np.r_[True, ex_idx[1:] != ex_idx[:-1]]
    return ex_idx[first], code[first]


def multiclass_examples(
    cache: EventCache, scenario: Scenario, spec: TargetSpec, times: np.ndarray
) -> Examples:
    e, t = _candidates(cache, scenario, times)
    ex_idx, code = most_frequent_code(cache, scenario, e, t)
    size = cache.source(scenario.target.source).info[scenario.target.column].vocab_size + 1
    other = len(spec.classes) - 1 if spec.classes[-1] == OTHER_CLASS else -1
    lut = np.full(size, other, np.int64)
    lut[np.asarray(spec.class_codes, np.int64)] = np.arange(len(spec.class_codes))
    cls = lut[code]
    keep = cls >= 0
    return Examples(e[ex_idx[keep]], t[ex_idx[keep]], cls[keep])


def regression_values(cache: EventCache, scenario: Scenario, e: np.ndarray, t: np.ndarray) -> np.ndarray:
    target = scenario.target
    owner, rows = window_events(cache, scenario, e, t)
    if target.aggregation == "count":
        y = np.bincount(owner, minlength=len(e)).astype(np.float64)
    else:
        vals = np.asarray(cache.source(target.source).columns[target.column])[rows].astype(np.float64)
        y = np.bincount(owner, weights=vals, minlength=len(e))
    return np.log1p(np.maximum(y, 0.0)) if target.log1p else y


def regression_examples(cache: EventCache, scenario: Scenario, times: np.ndarray) -> Examples:
    e, t = _candidates(cache, scenario, times)
    return Examples(e, t, regression_values(cache, scenario, e, t).astype(np.float32))


def recommendation_examples(
    cache: EventCache, scenario: Scenario, spec: TargetSpec | None, times: np.ndarray
) -> Examples:
    """Items of the window as a distribution per example (weights sum to 1); examples without items dropped."""
    target = scenario.target
    assert isinstance(target, RecommendationTarget)
    src = cache.source(target.source)
    e, t = _candidates(cache, scenario, times)
    owner, rows = window_events(cache, scenario, e, t)
    ts = np.asarray(src.ts)[rows]
    if target.next_basket:  # only the first active (UTC) day of each example's window
        day = ts // DAY
        first_day = np.full(len(e), np.iinfo(np.int64).max)
        np.minimum.at(first_day, owner, day)
        keep = day == first_day[owner]
        owner, rows, ts = owner[keep], rows[keep], ts[keep]
    size = src.info[target.column].vocab_size + 1
    code = np.asarray(src.columns[target.column])[rows].astype(np.int64)
    keep = code > 0
    owner, code, ts = owner[keep], code[keep], ts[keep]
    # first appearance of each (example, item): rows are time-ordered within an example
    key = owner * size + code
    _, first = np.unique(key, return_index=True)
    first.sort()
    owner, code, ts = owner[first], code[first], ts[first]
    if target.items != "all":
        h_owner, h_rows = src.window_rows(e, src.offsets[e], t)
        h_key = np.unique(h_owner * size + np.asarray(src.columns[target.column])[h_rows].astype(np.int64))
        seen = np.isin(owner * size + code, h_key)
        keep = ~seen if target.items == "new" else seen
        owner, code, ts = owner[keep], code[keep], ts[keep]
    if target.decay == "sequential":
        start = np.r_[0, np.cumsum(np.bincount(owner, minlength=len(e)))[:-1]]
        weight = target.gamma ** (np.arange(len(owner)) - start[owner])
    elif target.decay == "time":
        weight = 0.5 ** ((ts - t[owner]) / DAY / target.decay_half_life_days)
    else:
        weight = np.ones(len(owner))
    total = np.bincount(owner, weights=weight, minlength=len(e))
    has = total > 0
    remap = np.cumsum(has) - 1
    labels = SparseLabels.from_pairs(remap[owner], code - 1, weight / total[owner], int(has.sum()), size - 1)
    return Examples(e[has], t[has], labels)


def build_examples(cache: EventCache, scenario: Scenario, spec: TargetSpec, times: np.ndarray) -> Examples:
    target = scenario.target
    if isinstance(target, PythonTarget):
        from basemodel_pipeline.scenarios.python_target import python_examples

        return python_examples(cache, scenario, spec, times)
    if isinstance(target, BinaryTarget):
        return binary_examples(cache, scenario, times)
    if isinstance(target, MultilabelTarget):
        return multilabel_examples(cache, scenario, spec, times)
    if isinstance(target, MulticlassTarget):
        return multiclass_examples(cache, scenario, spec, times)
    if isinstance(target, RegressionTarget):
        return regression_examples(cache, scenario, times)
    return recommendation_examples(cache, scenario, spec, times)
