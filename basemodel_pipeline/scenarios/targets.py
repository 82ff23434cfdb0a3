"""Declarative targets -> labelled examples (entity index, split time, label) from the event cache."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from basemodel_pipeline.cache.store import DAY, EventCache
from basemodel_pipeline.config.models import BinaryTarget, MultilabelTarget, Scenario
from basemodel_pipeline.errors import ConfigError


@dataclass
class Examples:
    entity: np.ndarray  # int64 [n] entity index
    time: np.ndarray  # int64 [n] split time, epoch seconds
    labels: np.ndarray  # float32 [n] (binary) or [n, C] (multilabel)

    def __len__(self) -> int:
        return len(self.entity)


@dataclass
class TargetSpec:
    """What a trained scenario needs to rebuild its labels: stored in the checkpoint."""

    task: str
    classes: list[str]  # class names (multilabel); [] for binary
    class_codes: list[int]  # vocabulary codes of the classes in the target column

    def to_dict(self) -> dict:
        return {"task": self.task, "classes": self.classes, "class_codes": self.class_codes}


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


def binary_examples(cache: EventCache, target: BinaryTarget, times: np.ndarray) -> Examples:
    e, t = _grid(cache, times)
    keep = population(cache, target.source, e, t, target.active_in_last_days)
    e, t = e[keep], t[keep]
    src = cache.source(target.source)
    any_event = src.positions(e, t + target.horizon_days * DAY) > src.positions(e, t)
    label = any_event if target.event == "any" else ~any_event
    return Examples(e, t, label.astype(np.float32))


def class_counts(
    cache: EventCache, target: MultilabelTarget, e: np.ndarray, t: np.ndarray, n_codes: int
) -> np.ndarray:
    """[n, n_codes + 1] number of events per code of the target column in [t, t + horizon)."""
    src = cache.source(target.source)
    owner, rows = src.window_rows(e, t, t + target.horizon_days * DAY)
    codes = np.asarray(src.columns[target.column])[rows].astype(np.int64)
    flat = owner * (n_codes + 1) + codes
    return np.bincount(flat, minlength=len(e) * (n_codes + 1)).reshape(len(e), n_codes + 1)


def choose_classes(cache: EventCache, scenario: Scenario, train_times: np.ndarray) -> TargetSpec:
    """Classes of a multilabel target: values with >= min_positive_entities buyers in the training windows."""
    target = scenario.target
    if isinstance(target, BinaryTarget):
        return TargetSpec("binary", [], [])
    src = cache.source(target.source)
    info = src.info.get(target.column)
    if info is None or info.type != "categorical":
        known = ", ".join(c for c, i in src.info.items() if i.type == "categorical")
        raise ConfigError(
            f"scenario '{scenario.name}': target.column '{target.column}' is not a categorical "
            f"column of source '{target.source}' (categorical columns: {known})"
        )
    e, t = _grid(cache, train_times)
    keep = population(cache, target.source, e, t, None)
    counts = class_counts(cache, target, e[keep], t[keep], info.vocab_size)
    rows, code = np.nonzero(counts)
    pairs = np.unique(e[keep][rows] * (info.vocab_size + 1) + code)  # distinct (entity, value) buyers
    buyers = np.bincount(pairs % (info.vocab_size + 1), minlength=info.vocab_size + 1)
    codes = [c for c in range(1, info.vocab_size + 1) if buyers[c] >= target.min_positive_entities]
    if not codes:
        raise ConfigError(
            f"scenario '{scenario.name}': no value of '{target.column}' has "
            f">= {target.min_positive_entities} positive entities in training; lower min_positive_entities"
        )
    vocab = src.vocab(target.column)
    return TargetSpec("multilabel", [vocab[c - 1] for c in codes], codes)


def multilabel_examples(
    cache: EventCache, target: MultilabelTarget, spec: TargetSpec, times: np.ndarray
) -> Examples:
    e, t = _grid(cache, times)
    keep = population(cache, target.source, e, t, None)
    e, t = e[keep], t[keep]
    n_codes = cache.source(target.source).info[target.column].vocab_size
    counts = class_counts(cache, target, e, t, n_codes)
    return Examples(e, t, (counts[:, spec.class_codes] > 0).astype(np.float32))


def build_examples(cache: EventCache, scenario: Scenario, spec: TargetSpec, times: np.ndarray) -> Examples:
    if isinstance(scenario.target, BinaryTarget):
        return binary_examples(cache, scenario.target, times)
    return multilabel_examples(cache, scenario.target, spec, times)
