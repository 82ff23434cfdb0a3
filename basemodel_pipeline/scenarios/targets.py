"""Targets -> labelled examples (entity index, split time, label) from the event cache.

Declarative targets are vectorised over all examples at once (CSR window rows, bincount); Python targets
(targets/python.py) are called per example. Labels with many columns (large multilabel,
recommendation) are kept sparse (``SparseLabels``, targets/labels.py) and densified one mini-batch at a
time.
"""

from __future__ import annotations

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
from basemodel_pipeline.targets.events import (
    regression_values,
    target_source,
    vocab,
    window_events,
)
from basemodel_pipeline.targets.labels import Examples, SparseLabels, TargetSpec
from basemodel_pipeline.targets.python import python_examples
from basemodel_pipeline.targets.windows import candidate_pairs
from basemodel_pipeline.tasks import task_for, task_named
from basemodel_pipeline.tasks.multilabel import MultilabelDetails
from basemodel_pipeline.tasks.recommendation import RecommendationDetails
from basemodel_pipeline.tasks.regression import RegressionDetails

SPARSE_FROM_CLASSES = 512  # multilabel targets with more classes keep their labels sparse
OTHER_CLASS = "(other)"


def _column(src: EventSource, scenario: Scenario, column: str, kind: str) -> None:
    info = src.info.get(column)
    if info is None or info.type != kind:
        known = ", ".join(c for c, i in src.info.items() if i.type == kind) or "none"
        raise ConfigError(
            f"scenario '{scenario.name}': target.column '{column}' is not a {kind} column of source "
            f"'{src.name}' ({kind} columns: {known})"
        )


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
        return TargetSpec(scenario.task, list(target.classes), [], task_named(scenario.task).details())
    src = target_source(cache, scenario)
    if isinstance(target, BinaryTarget):
        return TargetSpec("binary", [], [])
    if isinstance(target, RegressionTarget):
        if target.aggregation == "sum":
            _column(src, scenario, target.column or "", "numeric")
        return TargetSpec("regression", [], [], RegressionDetails(log1p=target.log1p))
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
    e, t = candidate_pairs(cache, scenario, train_times)
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
        return TargetSpec("multilabel", [str(values[c]) for c in codes], codes.tolist(), MultilabelDetails())
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
    details = RecommendationDetails(
        n_items=n_items,
        head="dense" if dense else "sketch",
        partitions=target.sketch_partitions,
        width=target.sketch_width,
        popularity=pop.astype(int).tolist(),
        source=target.source,
        column=target.column,
        items=[str(v) for v in values[1:]],
    )
    return TargetSpec("recommendation", [], [], details)


def _list_classes(
    cache: EventCache, scenario: Scenario, target: MultilabelTarget, indicators: list, train_times: np.ndarray
) -> TargetSpec:
    """Multilabel over a list-valued column: one label per indicated value (cache/plan.py: the column's most
    frequent values), kept like any multilabel class (min_positive_entities, top_k)."""
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
        raise ConfigError(
            f"scenario '{scenario.name}': no value of '{target.column}' has >= "
            f"{target.min_positive_entities} positive entities in training; lower min_positive_entities"
        )
    chosen = [indicators[k] for k in keep]
    details = MultilabelDetails(list_columns=[i.name for i in chosen])
    return TargetSpec("multilabel", [i.list_value for i in chosen], [], details)


def _list_columns(spec: TargetSpec) -> list[str]:
    return spec.details.list_columns if isinstance(spec.details, MultilabelDetails) else []


def list_label_pairs(
    cache: EventCache, scenario: Scenario, spec: TargetSpec, e: np.ndarray, t: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(example index, class) of every list value present in a matching window event."""
    owner, rows = window_events(cache, scenario, e, t)
    src = cache.source(scenario.target.source)
    pairs = [
        np.unique(owner[np.asarray(src.columns[c])[rows] > 0]) * len(spec.classes) + j
        for j, c in enumerate(_list_columns(spec))
    ]
    key = np.unique(np.concatenate(pairs)) if pairs else np.zeros(0, np.int64)
    return key // len(spec.classes), key % len(spec.classes)


# ---- examples per kind -----------------------------------------------------------------------------
def binary_examples(cache: EventCache, scenario: Scenario, times: np.ndarray) -> Examples:
    e, t = candidate_pairs(cache, scenario, times)
    owner, _ = window_events(cache, scenario, e, t)
    any_event = np.bincount(owner, minlength=len(e)) > 0
    label = any_event if scenario.target.event == "any" else ~any_event
    return Examples(e, t, label.astype(np.float32))


def multilabel_examples(
    cache: EventCache, scenario: Scenario, spec: TargetSpec, times: np.ndarray
) -> Examples:
    e, t = candidate_pairs(cache, scenario, times)
    if _list_columns(spec):
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
    e, t = candidate_pairs(cache, scenario, times)
    ex_idx, code = most_frequent_code(cache, scenario, e, t)
    size = cache.source(scenario.target.source).info[scenario.target.column].vocab_size + 1
    other = len(spec.classes) - 1 if spec.classes[-1] == OTHER_CLASS else -1
    lut = np.full(size, other, np.int64)
    lut[np.asarray(spec.class_codes, np.int64)] = np.arange(len(spec.class_codes))
    cls = lut[code]
    keep = cls >= 0
    return Examples(e[ex_idx[keep]], t[ex_idx[keep]], cls[keep])


def regression_examples(cache: EventCache, scenario: Scenario, times: np.ndarray) -> Examples:
    e, t = candidate_pairs(cache, scenario, times)
    return Examples(e, t, regression_values(cache, scenario, e, t).astype(np.float32))


def recommendation_examples(
    cache: EventCache, scenario: Scenario, spec: TargetSpec | None, times: np.ndarray
) -> Examples:
    """Items of the window as a distribution per example (weights sum to 1); examples without items dropped."""
    target = scenario.target
    assert isinstance(target, RecommendationTarget)
    src = cache.source(target.source)
    e, t = candidate_pairs(cache, scenario, times)
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
        return python_examples(cache, scenario, task_for(spec), times)
    if isinstance(target, BinaryTarget):
        return binary_examples(cache, scenario, times)
    if isinstance(target, MultilabelTarget):
        return multilabel_examples(cache, scenario, spec, times)
    if isinstance(target, MulticlassTarget):
        return multiclass_examples(cache, scenario, spec, times)
    if isinstance(target, RegressionTarget):
        return regression_examples(cache, scenario, times)
    return recommendation_examples(cache, scenario, spec, times)
