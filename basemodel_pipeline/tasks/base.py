"""The task protocol: what a scenario's task type decides, in one class per task, and the registry that finds
the class by the config's ``task:`` name (docs/tasks.md).

A ``Task`` is built from the scenario's ``TargetSpec`` (what the checkpoint stores) and owns

    target -> labels    its output space fixed on the training windows (``choose_spec``, a class method) and
                        the labelled examples of its declarative target (``examples``); ``spec_for`` and
                        ``labelled`` add Python targets (targets/python.py), the same for every task
    labels -> targets   the head's width (``out_dim``), its bias at the training prior, the training targets
                        of a mini-batch and the loss (the scenario network is TrunkWithHead, model/trunk.py)
    details             the typed record of what the head needs beyond its classes (``details``,
                        ``fit_details``: regression's mean and range, recommendation's catalogue)
    decoding            logits -> metric-ready outputs (``scores``), kept inside the labels' range
                        (``finish``), and the link scale blends average on (``link`` / ``unlink``); what
                        turns outputs into the published quantity (``calibrate``: log1p amounts -> money)
    metrics             every metric of the task (``evaluate``) and the one it is judged by
                        (``primary_metric``, ``primary``); class-level, so no spec is needed
    baselines           what the ``popularity`` candidate predicts without training
                        (``popularity``, ``constant_prior``, ``class_prior``)
    outputs             the columns of the predictions table (``output_table``)
    explanations        the scalar integrated gradients explain (``explained``, ``explained_what``)
    python targets      the check of one returned label and the label array (``check_label``, ``stack_labels``)

and says what the pipeline may do with it through class attributes (``ranked``, ``per_class``, ``per_label``,
``lightgbm``, ``explainable``, ``charts``). Call sites ask ``task_for(spec)`` or ``task_named(name)`` and call
these instead of comparing task names.
"""

from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from typing import Any, ClassVar, TypeVar

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import Scenario
from basemodel_pipeline.config.models import PythonTarget
from basemodel_pipeline.config.scenarios import TASK_RULES, TaskRules
from basemodel_pipeline.errors import ConfigError
from basemodel_pipeline.evaluation import baselines, metrics
from basemodel_pipeline.targets.events import target_source
from basemodel_pipeline.targets.labels import Examples, Labels, TargetDetails, TargetSpec
from basemodel_pipeline.targets.python import python_examples

Label = float | np.ndarray


class Task(ABC):
    """One task type. Subclasses set the class attributes and implement the abstract methods; the defaults
    fit a task with one output per row and 0-d labels (binary, regression)."""

    name: ClassVar[str]  # the config's name of the task type: Scenario.task
    target_kind: ClassVar[str | None] = None  # the declarative target it reads (config kind); None: its name
    primary_metric: ClassVar[str]  # the metric a scenario of this task is judged by
    lightgbm: ClassVar[str | None] = (
        None  # LightGBM's objective of its LightGBM candidates (evaluation/gbm.py,
    )
    # one booster per label column when ``per_label``); None: no LightGBM candidate
    ranked: ClassVar[bool] = False  # outputs are ranked item lists (candidates/rerank.py candidates)
    per_class: ClassVar[bool] = False  # one output per named class (spec.classes)
    per_label: ClassVar[bool] = False  # each class its own yes/no question (one booster, one AUROC per label)
    explainable: ClassVar[bool] = False  # integrated gradients explain its outputs (inference/explain.py)
    calibrate_blend: ClassVar[bool] = False  # Platt scaling of the blended logit (candidates/blend.py)
    least_squares_blend: ClassVar[bool] = False  # blend weights by least squares (values, not probabilities)
    needs_both_labels: ClassVar[bool] = False  # a split whose labels hold one value cannot be learned
    charts: ClassVar[str] = ""  # the report's charts (reports/html.py): curves, values, ranking; "": none
    details: ClassVar[type[TargetDetails]] = TargetDetails  # the spec's typed details (none by default)

    def __init__(self, spec: TargetSpec) -> None:
        if not isinstance(spec.details, self.details):
            raise TypeError(
                f"a {self.name} target spec holds {type(spec.details).__name__}, not {self.details.__name__}"
            )
        self.spec = spec

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"

    # ---- target -> labels ----------------------------------------------------------------------------
    @classmethod
    def choose_spec(cls, cache: EventCache, scenario: Scenario, train_times: np.ndarray) -> TargetSpec:
        """The output space of the scenario's declarative target (its classes, the details its head needs),
        fixed on the training windows; the task's name and empty details by default."""
        return TargetSpec(cls.name, [], [], cls.details())

    def examples(self, cache: EventCache, scenario: Scenario, times: np.ndarray) -> Examples:
        """The labelled examples of the scenario's declarative target at the split `times`."""
        raise ConfigError(
            f"scenario '{scenario.name}': a {self.name} scenario has no declarative target; use a python "
            "target (target.kind: python)"
        )

    @classmethod
    def spec_for(cls, cache: EventCache, scenario: Scenario, train_times: np.ndarray) -> TargetSpec:
        """The spec of the scenario: a Python target's classes as configured, else ``choose_spec``'s."""
        if isinstance(scenario.target, PythonTarget):
            return TargetSpec(cls.name, list(scenario.target.classes), [], cls.details())
        target_source(cache, scenario)  # a source the cache does not hold is one line naming the field
        return cls.choose_spec(cache, scenario, train_times)

    def labelled(self, cache: EventCache, scenario: Scenario, times: np.ndarray) -> Examples:
        """The scenario's examples: those a Python target's function labels, else ``examples``'."""
        if isinstance(scenario.target, PythonTarget):
            return python_examples(cache, scenario, self, times)
        return self.examples(cache, scenario, times)

    # ---- labels -> targets ---------------------------------------------------------------------------
    @property
    def out_dim(self) -> int:
        """Outputs of the scenario network's head."""
        return 1

    @classmethod
    def fit_details(cls, details: TargetDetails, train_labels: Labels) -> TargetDetails:
        """The spec's details with what the head needs from the training labels (regression: mean, std,
        range, hurdle); unchanged by default."""
        return details

    def truth(self, labels: Labels) -> Any:
        """Labels as the metrics and the candidates take them (dense arrays; CSR arrays for recommendation)."""
        return labels

    @abstractmethod
    def init_bias(self, head: nn.Linear, labels: Labels) -> None:
        """Set the head's bias at the training prior (the base rate, not p = 0.5)."""

    @abstractmethod
    def targets(self, labels: Labels, idx: np.ndarray) -> torch.Tensor:
        """Training targets of rows `idx` as a tensor."""

    @abstractmethod
    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor: ...

    # ---- decoding ------------------------------------------------------------------------------------
    @abstractmethod
    def scores(self, logits: np.ndarray) -> np.ndarray:
        """Metric-ready outputs of the network: probabilities [n] / [n, C] or values [n]."""

    def network_outputs(self, logits: np.ndarray) -> Any:
        """What the metrics take from the network's logits (early stopping): its scores."""
        return self.scores(logits)

    def finish(self, out: np.ndarray) -> np.ndarray:
        """A candidate's outputs as published: every class present, values inside the labels' range."""
        return out

    def link(self, out: np.ndarray) -> np.ndarray:
        """Outputs on the scale blends average them on (logits, log-probabilities, values)."""
        return np.asarray(out, np.float64)

    def unlink(self, z: np.ndarray) -> np.ndarray:
        """The inverse of ``link``: a blended link value as an output."""
        return self.finish(z)

    @property
    def calibrated(self) -> bool:
        """Whether outputs go through ``calibrate`` before they are published."""
        return False

    def calibrate(self, val_out: Any, val_truth: Any) -> Any:
        """Fit what turns outputs into the published quantity on held-out (validation) outputs and labels;
        None when the outputs are published as they are (regression of log1p amounts: a map to money)."""
        return None

    def calibrated_metrics(self, truth: Any, out: Any, calibration: Any) -> dict[str, float]:
        """Metrics of the published quantity (``calibrate``'s), beside ``evaluate``'s; none by default."""
        return {}

    def publish_calibration(self, calibration: Any) -> None:  # noqa: B027 - nothing to keep by default
        """Keep the published candidate's calibration in the spec's details (model.json), for ``output_table``."""

    @classmethod
    def indicators(cls, truth: Any, n_classes: int) -> np.ndarray:
        """Metric-ready labels as 0/1 indicators, one per output (the report's micro-averaged curves)."""
        return np.asarray(truth)

    # ---- metrics (class-level: no spec needed) -------------------------------------------------------
    @classmethod
    @abstractmethod
    def evaluate(cls, y: Any, score: Any, k: int = 10, log1p: bool = False) -> dict[str, float]:
        """Every metric of the task (evaluation/metrics.py); ``log1p``: the target is log(1 + amount)."""

    @classmethod
    def primary(cls, y: Any, score: Any) -> float:
        """The primary metric alone."""
        return cls.evaluate(y, score)[cls.primary_metric]

    @classmethod
    def higher_is_better(cls) -> bool:
        return metrics.higher_is_better(cls.primary_metric)

    @classmethod
    def metric_width(cls, out: np.ndarray) -> int:
        """How many per-column metrics one primary metric costs (the bootstrap's rounds shrink with it)."""
        return 1

    # ---- baselines -----------------------------------------------------------------------------------
    def class_prior(self, labels: Labels) -> np.ndarray | None:
        """Share of training examples with each class (None: a task without classes)."""
        return None

    def constant_prior(self, y: np.ndarray) -> np.ndarray | None:
        """The constant a baseline without a target column predicts (python targets), from dense training
        labels; None: no constant (binary ranks by recent activity instead)."""
        return None

    def constant(self, prior: list[float], n: int) -> np.ndarray:
        """``n`` rows of the constant prediction."""
        return np.tile(np.asarray(prior), (n, 1))

    def popularity(
        self, cache: EventCache, entity: np.ndarray, time: np.ndarray, scenario: Scenario, prior: Any
    ) -> np.ndarray:
        """Scores that need no training for (entity, time) pairs, from the history of a declarative target's
        source before each time; `prior` (class_prior's, or None) breaks ties (candidates.Popularity)."""
        raise NotImplementedError(f"no popularity baseline for {self.name} scenarios")

    def column_shares(
        self, cache: EventCache, entity: np.ndarray, time: np.ndarray, scenario: Scenario, prior: Any
    ) -> np.ndarray:
        """Each class's share of the entity's recent events in the target column (the class codes in the spec's
        order), the prior breaking ties: the popularity of the tasks with named classes."""
        target = scenario.target
        return baselines.class_shares(
            cache, entity, time, target.source, target.column, np.array(self.spec.class_codes), prior
        )

    # ---- outputs -------------------------------------------------------------------------------------
    @abstractmethod
    def output_table(
        self, ids: np.ndarray, as_of: dt.date, out: Any, top_k: int | None, threshold: float | None
    ) -> pa.Table:
        """The predictions table (docs/inference.md): entity_id, as_of and the task's columns."""

    def empty_outputs(self, top_k: int) -> Any:
        """Outputs of zero entities, shaped like the scenario's."""
        return self.scores(np.zeros((0, self.out_dim), np.float32))

    # ---- explanations --------------------------------------------------------------------------------
    def explained(self, out: torch.Tensor, index: int) -> torch.Tensor:
        """Model outputs [n, out_dim] -> the scalar [n] explained (output `index`)."""
        return out[:, index]

    def explained_what(self, label: str | None) -> str:
        return "the model output"

    # ---- python targets ------------------------------------------------------------------------------
    def check_label(self, value: Any) -> Label:
        """The validated label a target function returned, or ValueError saying what is wrong."""
        arr = np.asarray(value, dtype=np.float64)
        if arr.size != 1:
            raise ValueError(f"returned shape {arr.shape}; a {self.name} target needs shape (1,)")
        if not np.all(np.isfinite(arr)):
            raise ValueError("returned NaN or inf")
        return float(arr.ravel()[0])

    def stack_labels(self, labels: list[Label]) -> np.ndarray:
        """The checked labels of the kept examples as one array."""
        return np.asarray(labels, np.float32)


# ---- the registry ----------------------------------------------------------------------------------------
TASKS: dict[str, type[Task]] = {}


T = TypeVar("T", bound=type[Task])


def register(cls: T) -> T:
    """Class decorator: make `cls` the task of its ``name`` (a later registration of a name replaces it), and
    give config validation its rules (config/scenarios.py ``TaskRules``)."""
    TASKS[cls.name] = cls
    TASK_RULES[cls.name] = TaskRules(cls.target_kind or cls.name, cls.ranked, cls.per_class)
    return cls


def unregister(name: str) -> None:
    """Forget the task type `name` (a task registered for a while, as tests do)."""
    TASKS.pop(name, None)
    TASK_RULES.pop(name, None)


def task_named(name: str) -> type[Task]:
    """The task class of a config ``task:`` name."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task '{name}'; known: {', '.join(sorted(TASKS))}") from None


def task_for(spec: TargetSpec) -> Task:
    """The task of a scenario's target spec, ready to train and decode."""
    return task_named(spec.task)(spec)


def spec_from_dict(d: dict) -> TargetSpec:
    """A target spec as ``TargetSpec.to_dict`` stored it, its details read as its task's record (a field the
    record does not know, or of the wrong type, raises pydantic's ValidationError)."""
    return TargetSpec.from_dict(d, task_named(str(d.get("task"))).details)
