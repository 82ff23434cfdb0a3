"""Column helpers of declarative targets, shared by the task classes that read a target column: the check that
the column exists with the right type, the refusal of a list-valued column where it cannot be a target, and the
(example, code) counts of the window's matching events."""

from __future__ import annotations

import numpy as np

from basemodel_pipeline.cache.store import EventCache, EventSource
from basemodel_pipeline.config.models import Scenario
from basemodel_pipeline.errors import ConfigError
from basemodel_pipeline.targets.events import target_source, vocab, window_events


def check_column(src: EventSource, scenario: Scenario, column: str, kind: str) -> None:
    """ConfigError (one line) unless `column` is a `kind` ("numeric", "categorical") column of `src`."""
    info = src.info.get(column)
    if info is None or info.type != kind:
        known = ", ".join(c for c, i in src.info.items() if i.type == kind) or "none"
        raise ConfigError(
            f"scenario '{scenario.name}': target.column '{column}' is not a {kind} column of source "
            f"'{src.name}' ({kind} columns: {known})"
        )


def refuse_list_column(src: EventSource, scenario: Scenario, column: str) -> None:
    """ConfigError when `column` holds lists of values: only a multilabel target reads those."""
    if src.list_indicators(column):
        raise ConfigError(
            f"scenario '{scenario.name}': target.column '{column}' holds lists of values; a list "
            f"column can be a multilabel target (one label per value), not a {scenario.task} target"
        )


def class_values(cache: EventCache, scenario: Scenario) -> np.ndarray:
    """The values by code (code 0: missing) of the target column, one value per event: a categorical column
    of the target's source, not a list column (ConfigError, one line, otherwise)."""
    target, src = scenario.target, target_source(cache, scenario)
    refuse_list_column(src, scenario, target.column)
    check_column(src, scenario, target.column, "categorical")
    return vocab(src, target.column)[0]


def code_counts(
    cache: EventCache, scenario: Scenario, e: np.ndarray, t: np.ndarray, column: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct (example, code) pairs of matching window events and their event counts."""
    src = cache.source(scenario.target.source)
    owner, rows = window_events(cache, scenario, e, t)
    codes = np.asarray(src.columns[column])[rows].astype(np.int64)
    size = src.info[column].vocab_size + 1
    keys, counts = np.unique(owner * size + codes, return_counts=True)
    return keys // size, keys % size, counts


def most_frequent_code(
    cache: EventCache, scenario: Scenario, e: np.ndarray, t: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(example index, most frequent code) for examples with matching events; ties -> the smaller code."""
    ex_idx, code, counts = code_counts(cache, scenario, e, t, scenario.target.column)
    order = np.lexsort((code, -counts, ex_idx))
    ex_idx, code = ex_idx[order], code[order]
    first = np.r_[True, ex_idx[1:] != ex_idx[:-1]]
    return ex_idx[first], code[first]
