"""The rule-of-thumb baseline of classifiers and regression: what needs no training.

A declarative target asks its task (Task.popularity): recent activity (binary), the entity's recent share of
each class with the training prior breaking ties (multiclass, multilabel), the same quantity in the window
before the split (regression). A Python target has no column to read: the training prior, or recent activity
for binary (its direction chosen on the early-stopping rows).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from basemodel_pipeline.candidates.base import EVENTS, TRAINING_LABELS, Context, description, labels_of
from basemodel_pipeline.candidates.inputs import Rows
from basemodel_pipeline.evaluation import baselines, metrics

RULES = {  # describe(): each task type's rule for a declarative target (Task.popularity)
    "binary": "recent activity: active days in the 28 days before the split (negated for an absence of events)",
    "multiclass": "the entity's recent share of each class, the training prior breaking ties",
    "multilabel": "the entity's recent share of each label, the training prior breaking ties",
    "regression": "the same quantity in the window of the same length before the split",
}
PRIOR_SHOWN = 20  # describe(): priors of at most this many classes are listed, longer ones counted


class Popularity:
    """Scores that need no training: what a rule of thumb would say (see the module docstring)."""

    name = "popularity"

    def __init__(self, ctx: Context, sign: float = 1.0, prior: list[float] | None = None) -> None:
        self.ctx, self.sign, self.prior = ctx, sign, prior

    def fit(self, train: Rows, stop: Rows) -> None:
        target, task = self.ctx.scenario.target, self.ctx.task
        if target.declarative:
            prior = task.class_prior(train.labels)
        else:
            prior = task.constant_prior(labels_of(self.ctx, train))
            if prior is None:  # recent activity, its direction chosen on the early-stopping rows
                s = baselines.recent_activity(stop.cache, stop.entity, stop.time, target.source)
                self.sign = 1.0 if metrics.auroc(labels_of(self.ctx, stop), s) >= 0.5 else -1.0
        if prior is not None:
            self.prior = [float(v) for v in prior]

    def predict(self, rows: Rows) -> np.ndarray:
        ctx, target = self.ctx, self.ctx.scenario.target
        cache, e, t = rows.cache, rows.entity, rows.time
        if target.declarative:
            prior = None if self.prior is None else np.asarray(self.prior)
            return ctx.task.popularity(cache, e, t, ctx.scenario, prior)
        if self.prior is None:
            return self.sign * baselines.recent_activity(cache, e, t, target.source)
        return ctx.task.constant(self.prior, len(rows))

    def refit(self, rows: Rows) -> None:
        pass  # nothing learned beyond priors and a sign

    def save(self) -> tuple[dict[str, Any], dict[str, bytes]]:
        return {"kind": "popularity", "sign": self.sign, "prior": self.prior}, {}

    def describe(self) -> dict[str, Any]:
        declarative = self.ctx.scenario.target.declarative
        if declarative:
            rule = RULES.get(self.ctx.task.name, "the task's own rule (Task.popularity)")
        elif self.prior is None:
            rule = "recent activity, its direction chosen on the early-stopping rows"
        else:
            rule = "the training prior, the same for every entity"
        inputs, params = [], {}
        if declarative or self.prior is None:
            inputs.append(EVENTS)
        if not declarative and self.prior is None:
            params["sign"] = self.sign
        if self.prior is not None:
            inputs.append(TRAINING_LABELS)
            shown = len(self.prior) <= PRIOR_SHOWN
            params.update({"prior": self.prior} if shown else {"prior_classes": len(self.prior)})
        return description(self.name, f"baseline without training: {rule}", inputs, **params)
