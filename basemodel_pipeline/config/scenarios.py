"""Config models of scenarios and their targets.

A scenario is a task type plus a target over the window after each split time. Targets are declarative
(one model per kind below) or a Python function (``kind: python``). Every target names its event
``source`` and the columns it reads (``columns()``), so validation can reject unknown names before any data
is read (PipelineConfig._references, sources.data_checks).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from basemodel_pipeline.config.base import ColumnName, Name, Strict

TARGET_TIMEOUT_S = 10.0  # a python target's import and each call (per example: milliseconds, as a rule)
# multilabel LightGBM: rows one per-label booster trains on (docs/scenarios.md, "The cost of LightGBM")
LIGHTGBM_MAX_ROWS = 10_000
CandidateName = Literal[
    "neural",
    "lightgbm_hybrid",
    "lightgbm_hybrid_seeds",
    "lightgbm_aggregates",
    "popularity",
    "recent_popularity",
    "cooccurrence",
    "reranker",
    "repeat_purchases",
]
TASKS_PACKAGE = "basemodel_pipeline.tasks"  # importing it registers the shipped task types


@dataclass(frozen=True)
class TaskRules:
    """What validating a scenario needs to know of its task type. Each task class registers its own when it
    is registered (tasks/base.py ``register``): the config names no task types."""

    target_kind: str  # the kind of declarative target it reads (besides python)
    ranked: bool = (
        False  # its candidates are the ranking ones (no LightGBM, no blend) and it needs its target
    )
    per_class: bool = False  # a python target of it names its classes (>= 2)


TASK_RULES: dict[str, TaskRules] = {}


def task_rules(name: str) -> TaskRules:
    """The rules of task type `name`; ValueError naming the known ones for an unknown name. The shipped task
    types register on first use: tasks/ sits above config/ (docs/architecture.md), so it is imported by name."""
    if name not in TASK_RULES:
        importlib.import_module(TASKS_PACKAGE)
    if name not in TASK_RULES:
        raise ValueError(f"task '{name}' is not a task type; known: {', '.join(sorted(TASK_RULES))}")
    return TASK_RULES[name]


class Condition(Strict):
    """One predicate on an event column; a list of them is AND-ed. Categorical values are compared as text."""

    column: ColumnName
    op: Literal["==", "!=", "in", "not in", ">", ">=", "<", "<="] = "=="
    value: str | float | int | list[str | float | int]

    @model_validator(mode="after")
    def _list_for_in(self) -> Condition:
        if self.op in ("in", "not in") and not isinstance(self.value, list):
            raise ValueError(f"op '{self.op}' needs a list value, got {self.value!r}")
        if self.op not in ("in", "not in") and isinstance(self.value, list):
            raise ValueError(f"op '{self.op}' needs a single value; use 'in' for a list")
        return self


class _Windowed(Strict):
    declarative: ClassVar[bool] = True  # its task builds its labels (tasks/<task>.py ``examples``)

    source: ColumnName
    horizon_days: int = Field(gt=0, description="Target window: [split time, split time + horizon_days).")
    filter: list[Condition] = Field(default_factory=list, description="Only events matching all of these.")
    active_in_last_days: int | None = Field(
        default=None,
        gt=0,
        description="Population: only entities with an event in the source in this many days before the split "
        "(default: every entity with history in it).",
    )

    def columns(self) -> list[tuple[str, str]]:
        """(YAML field, column name) of every column the target reads from its source."""
        return [(f"filter[{i}].column", c.column) for i, c in enumerate(self.filter)]


class BinaryTarget(_Windowed):
    """Positive when an entity has any (event: any) or no (event: none) matching event in the window."""

    kind: Literal["binary"] = "binary"
    event: Literal["any", "none"] = "any"


class MultilabelTarget(_Windowed):
    """One label per value of `column`: did the entity have a matching event with that value in the window."""

    kind: Literal["multilabel"] = "multilabel"
    column: ColumnName
    min_positive_entities: int = Field(
        default=50,
        ge=0,
        description="Keep values with at least this many positive entities in training (0: every value).",
    )
    top_k: int | None = Field(default=None, gt=0, description="Keep only the K most frequent values.")

    def columns(self) -> list[tuple[str, str]]:
        return [("column", self.column), *super().columns()]


class MulticlassTarget(_Windowed):
    """The most frequent value of `column` among the entity's matching events in the window (no event: dropped)."""

    kind: Literal["multiclass"] = "multiclass"
    column: ColumnName
    top_k: int = Field(default=20, gt=1, description="Classes: the K most frequent target values.")
    other_class: bool = Field(
        default=True, description="Group the remaining values into one '(other)' class; false drops them."
    )

    def columns(self) -> list[tuple[str, str]]:
        return [("column", self.column), *super().columns()]


class RegressionTarget(_Windowed):
    """Sum of `column` (aggregation: sum) or the number of matching events (aggregation: count) in the window."""

    kind: Literal["regression"] = "regression"
    aggregation: Literal["sum", "count"] = "sum"
    column: ColumnName | None = Field(default=None, description="Numeric column to sum (aggregation: sum).")
    log1p: bool = Field(default=False, description="Train and evaluate on log(1 + value).")

    @model_validator(mode="after")
    def _column_for_sum(self) -> RegressionTarget:
        if self.aggregation == "sum" and self.column is None:
            raise ValueError("aggregation 'sum' needs column (a numeric column of the source)")
        return self

    def columns(self) -> list[tuple[str, str]]:
        own = [("column", self.column)] if self.column else []
        return [*own, *super().columns()]


class RecommendationTarget(_Windowed):
    """Items (values of `column`) of the entity's matching events in the window, as a weighted distribution."""

    kind: Literal["recommendation"] = "recommendation"
    column: ColumnName
    next_basket: bool = Field(
        default=False, description="Only the items of the first active day in the window."
    )
    items: Literal["all", "new", "repeat"] = Field(
        default="all",
        description="new: items the entity never had before the split; repeat: only those it had.",
    )
    decay: Literal["none", "sequential", "time"] = Field(
        default="none",
        description="Weight of an item: none = equal; sequential = gamma ** (order of first appearance); "
        "time = halves every decay_half_life_days after the split.",
    )
    gamma: float = Field(default=0.9, gt=0, le=1)
    decay_half_life_days: float = Field(default=7.0, gt=0)
    dense_max_items: int = Field(
        default=5000,
        gt=0,
        description="Catalogues up to this size get a dense softmax head; larger ones a sketch head decoded "
        "with popularity correction.",
    )
    sketch_partitions: int = Field(default=4, gt=0)
    sketch_width: int = Field(default=2048, gt=1)

    def columns(self) -> list[tuple[str, str]]:
        return [("column", self.column), *super().columns()]


class PythonTarget(Strict):
    """`function` ("package.module:name") is called per example as target(history, future, attributes, ctx)."""

    declarative: ClassVar[bool] = False  # its function labels each example (targets/python.py)

    kind: Literal["python"] = "python"
    function: Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")]
    source: ColumnName = Field(description="Main event source (population: entities with history in it).")
    horizon_days: int = Field(gt=0)
    classes: list[str] = Field(
        default_factory=list, description="Class names (multiclass and multilabel: the output order)."
    )
    active_in_last_days: int | None = Field(default=None, gt=0)
    timeout_s: float = Field(
        default=TARGET_TIMEOUT_S,
        gt=0,
        description="Time limit, in seconds, of importing the module and of each call of the function (once per "
        "example); past it the stage stops with one line naming the function.",
    )

    def columns(self) -> list[tuple[str, str]]:
        return []


Target = Annotated[
    BinaryTarget
    | MultilabelTarget
    | MulticlassTarget
    | RegressionTarget
    | RecommendationTarget
    | PythonTarget,
    Field(discriminator="kind"),
]


class RetrainPolicy(Strict):
    """When the automation retrains a scenario after the cache changed (a new foundation, a code release or an
    edit of the scenario retrains it whatever this says)."""

    when: Literal["every_cache", "weekly", "drift"] = Field(
        default="every_cache",
        description="every_cache: after each new cache; weekly: after a new cache, at most once in "
        "min_days days; drift: when the population scored on the new cache drifted past drift_threshold.",
    )
    min_days: int = Field(default=7, gt=0, description="weekly: days since the last training.")
    drift_threshold: float = Field(
        default=0.1, gt=0, description="drift: mean PSI of the model's input features (evaluation/drift.py)."
    )


class Scenario(Strict):
    name: Name
    task: Name = Field(
        description="The task type (docs/tasks.md): binary, multiclass, multilabel, regression, "
        "recommendation, or one a module of tasks/ registers."
    )
    target: Target
    mode: Literal["frozen", "full", "lora"] | None = Field(
        default=None,
        description="Fine-tuning mode for this scenario (default: training_params.finetune.mode).",
    )
    lora_rank: int = Field(default=8, gt=0, description="Rank of the LoRA adapters (mode: lora).")
    retrain: RetrainPolicy = Field(default_factory=RetrainPolicy, description="When new data retrains it.")
    learning_rate: float | None = Field(default=None, gt=0, description="Overrides training_params.finetune.")
    epochs: int | None = Field(default=None, gt=0, description="Overrides training_params.finetune.")
    refit_on_all: bool | None = Field(
        default=None,
        description="Overrides training_params.finetune.refit_on_all for this scenario (false: publish the "
        "model as evaluated, without the production refit on the newest labelled windows).",
    )
    lightgbm_top_labels: int = Field(
        default=30,
        ge=0,
        description="Multilabel baseline: one LightGBM per most frequent label up to this many; popularity "
        "for the rest.",
    )
    lightgbm_max_rows: int = Field(
        default=LIGHTGBM_MAX_ROWS,
        ge=0,
        description=f"Multilabel LightGBM: training rows one per-label booster may use (default "
        f"{LIGHTGBM_MAX_ROWS:,}; 0: all). Above it, each booster keeps every row of the label's rarer class up to half of them and a sample of the "
        "other class, each class weighted by the inverse of its sampling rate (calibrated probabilities).",
    )
    lightgbm_validation_rows: int = Field(
        default=2,
        ge=0,
        description="Row-sampled multilabel LightGBM: validation rows a booster early-stops on, per row of its "
        "training sample, drawn the same way (0: every validation row). Every round scores and ranks them: "
        "on all of them a sampled booster spends most of its time stopping.",
    )
    k: int = Field(default=10, gt=0, description="K of the @K metrics (recommendation) and top-k accuracy.")
    candidates: list[CandidateName] | None = Field(
        default=None,
        description="Models to fit besides the baselines (default: all of the task's). The published one is "
        "chosen among them and the baselines on validation windows.",
    )
    publish: CandidateName | Literal["blend"] | None = Field(
        default=None,
        description="Pin the published candidate (default: the best on validation windows).",
    )

    @model_validator(mode="after")
    def _task_matches_target(self) -> Scenario:
        ranking = {"reranker", "repeat_purchases", "recent_popularity", "cooccurrence"}
        tabular = {"lightgbm_hybrid", "lightgbm_hybrid_seeds", "lightgbm_aggregates"}
        rules = task_rules(self.task)
        wrong = tabular | {"blend"} if rules.ranked else ranking
        for field, names in (
            ("candidates", self.candidates or []),
            ("publish", [self.publish] if self.publish else []),
        ):
            bad = [n for n in names if n in wrong]
            if bad:
                raise ValueError(f"{field}: {', '.join(bad)} is not a candidate of a {self.task} scenario")
        kind = self.target.kind
        if kind == "python":
            if rules.ranked:
                raise ValueError(f"{self.task} needs a declarative target (kind: {rules.target_kind})")
            if rules.per_class and len(self.target.classes) < 2:
                raise ValueError(
                    f"a python target of a {self.task} scenario needs target.classes (>= 2 names)"
                )
        elif kind != rules.target_kind:
            raise ValueError(
                f"task '{self.task}' needs a target of kind '{rules.target_kind}' or 'python', got '{kind}'"
            )
        return self
