"""The estimator protocol every candidate model of a scenario follows, and what the candidates share.

A scenario fits several candidates on its training windows, compares them on validation windows
(candidates/selection.py) and publishes the best one, which ``predict`` then scores with
(inference/predict.py). Every candidate:

    fit(train: Rows, stop: Rows)   train on the training windows; `stop` (validation rows) only early-stops
    predict(rows: Rows)            metric-ready outputs: probabilities [n] / [n, C], values [n], or ranked
                                   items [n, K] (recommendation)
    refit(rows: Rows)              train again on more windows (training + validation) for the epochs or
                                   rounds early stopping chose (scenarios/refit.py)
    save() -> (meta, files)        JSON-able meta and files (LightGBM model text, safetensors): no pickle
    load_candidate(meta, files, ctx)  the inverse, given the scenario context (candidates/loading.py)
    describe() -> dict             what it is, in JSON: its name, a one-line description, the inputs it reads
                                   (INPUTS) and its fitted parameters that matter (metrics.json shows the
                                   published one's, the report too)

Regression outputs are kept inside the range of the training labels (a non-negative amount is never
predicted below zero), by every candidate, so what the report measures is what ``predict`` publishes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from basemodel_pipeline.candidates.inputs import Rows
from basemodel_pipeline.config import Scenario
from basemodel_pipeline.progress import NullProgress, Progress
from basemodel_pipeline.targets.labels import TargetSpec
from basemodel_pipeline.tasks import Task

# What a candidate reads (describe()["inputs"])
NETWORK = "network outputs"  # the scenario network's outputs (Rows.logits)
EMBEDDING = "foundation embedding"  # the trunk's residual stream (Rows.embedding)
AGGREGATES = "aggregates"  # the automatic aggregate features (Rows.tabular)
EVENTS = "recent events"  # the entity's events before the split, read from the event cache
TRAINING_LABELS = "training labels"  # priors of the training windows
ITEM_STATS = "item statistics"  # own items, item popularity and co-occurrence (candidates/item_stats.py)
INPUTS = (NETWORK, EMBEDDING, AGGREGATES, EVENTS, TRAINING_LABELS, ITEM_STATS)


@dataclass
class Context:
    """What every candidate of one scenario shares."""

    scenario: Scenario
    spec: TargetSpec
    task: Task  # the scenario's task type (tasks/): decoding, metrics, baselines
    seed: int = 0
    progress: Progress = field(default_factory=NullProgress)  # LightGBM fits log a line per booster


class Candidate(Protocol):
    name: str

    def fit(self, train: Rows, stop: Rows) -> None: ...

    def predict(self, rows: Rows) -> np.ndarray: ...

    def refit(self, rows: Rows) -> None: ...

    def save(self) -> tuple[dict[str, Any], dict[str, bytes]]: ...

    def describe(self) -> dict[str, Any]: ...


def labels_of(ctx: Context, rows: Rows) -> np.ndarray:
    """Dense labels of fitted rows (binary [n], multiclass [n], multilabel [n, C], regression [n])."""
    assert rows.labels is not None
    return np.asarray(ctx.task.truth(rows.labels))


def description(name: str, text: str, inputs: Iterable[str], **parameters: Any) -> dict[str, Any]:
    """A candidate's describe(): plain JSON (numbers rounded to 6 digits, NaN and infinities as None)."""
    return {"name": name, "description": text, "inputs": list(inputs), "parameters": plain(parameters)}


def plain(value: Any) -> Any:
    """`value` as plain JSON types: numpy scalars and arrays to numbers and lists, dict keys to strings."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [plain(v) for v in value]
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return round(float(value), 6) if math.isfinite(value) else None
    return value


def summary(values: list[int]) -> Any:
    """A per-booster count as one number, or its range over many boosters."""
    if len(values) == 1:
        return int(values[0])
    if not values:
        return None
    return {
        "boosters": len(values),
        "min": min(values),
        "median": float(np.median(values)),
        "max": max(values),
    }


def ordered(inputs: Iterable[str]) -> list[str]:
    """Inputs without repeats, in INPUTS order (a blend's: its members' together)."""
    used = set(inputs)
    return [i for i in INPUTS if i in used]
