"""A weighted combination of fitted candidates, its weights fitted on validation rows (candidates/selection.py
fits it on the `select` rows and cross-fits its score there)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from basemodel_pipeline.candidates.base import Candidate, Context, description, ordered
from basemodel_pipeline.candidates.inputs import Rows

BLEND_STEP = 0.1  # multilabel / multiclass blends: grid step of the weights on the simplex


def _simplex(k: int, step: float) -> list[np.ndarray]:
    n = round(1 / step)
    return [np.array(c) / n for c in itertools.product(range(n + 1), repeat=k) if sum(c) == n]


class Blend:
    """A weighted combination of fitted candidates on the link scale (Task.link: logits, log-probabilities or
    values), weights fitted on validation rows:

    binary          the weights on the simplex (step 0.1) that maximise AUROC, on the logits, then Platt
                    scaling of the blended logit (a scale and an intercept) so the output is a probability
    multilabel      the weights on the simplex that maximise macro AUROC, on the logits
    multiclass      the weights on the simplex that maximise accuracy, on the log-probabilities
    regression      least squares with non-negative weights and an intercept, clipped to the label range
    """

    name = "blend"

    def __init__(self, ctx: Context, members: list[Candidate]) -> None:
        self.ctx, self.members = ctx, members
        self.weights = np.full(len(members), 1.0 / max(len(members), 1))
        self.scale, self.intercept = 1.0, 0.0

    def fit_outputs(self, outputs: list[np.ndarray], y: np.ndarray) -> Blend:
        """Fit the weights on the members' outputs of the same validation rows."""
        task = self.ctx.task
        Z = [task.link(o) for o in outputs]
        if task.least_squares_blend:
            from sklearn.linear_model import LinearRegression

            lr = LinearRegression(positive=True).fit(np.c_[tuple(Z)], y)
            self.weights, self.intercept = lr.coef_.astype(np.float64), float(lr.intercept_)
            return self
        self.scale, self.intercept, best = 1.0, 0.0, -np.inf
        sign = 1.0 if task.higher_is_better() else -1.0
        for w in _simplex(len(Z), BLEND_STEP):
            score = sign * task.primary(y, self._combine(Z, w))
            if np.isfinite(score) and score > best + 1e-12:
                best, self.weights = score, w
        if task.calibrate_blend and len(np.unique(y)) > 1:  # calibrate the blended logit (Platt scaling)
            from sklearn.linear_model import LogisticRegression

            z = sum(wi * zi for wi, zi in zip(self.weights, Z, strict=True))
            lr = LogisticRegression(C=1.0).fit(np.asarray(z).reshape(-1, 1), y)
            self.scale, self.intercept = float(lr.coef_[0, 0]), float(lr.intercept_[0])
        return self

    def _combine(self, Z: list[np.ndarray], w: np.ndarray) -> np.ndarray:
        z = self.scale * sum(wi * zi for wi, zi in zip(w, Z, strict=True)) + self.intercept
        return self.ctx.task.unlink(z)

    def combine(self, outputs: list[np.ndarray]) -> np.ndarray:
        return self._combine([self.ctx.task.link(o) for o in outputs], self.weights)

    def fit(self, train: Rows, stop: Rows) -> None:
        pass  # members are fitted first; the weights come from fit_outputs on validation rows

    def predict(self, rows: Rows) -> np.ndarray:
        return self.combine([m.predict(rows) for m in self.members])

    def refit(self, rows: Rows) -> None:
        for m in self.members:  # the weights stay those fitted on validation
            m.refit(rows)

    def save(self) -> tuple[dict[str, Any], dict[str, bytes]]:
        members, files = [], {}
        for m in self.members:
            meta, f = m.save()
            members.append(meta)
            files.update(f)
        return {
            "kind": "blend",
            "members": members,
            "weights": [float(w) for w in self.weights],
            "scale": self.scale,
            "intercept": self.intercept,
        }, files

    def describe(self) -> dict[str, Any]:
        task = self.ctx.task
        if task.least_squares_blend:
            how = "least squares with non-negative weights and an intercept"
        else:
            how = f"weights on the simplex (step {BLEND_STEP}) that maximise validation {task.primary_metric}"
            how += ", then Platt scaling" if task.calibrate_blend else ""
        described = [m.describe() for m in self.members]
        text = (
            f"a weighted combination of {', '.join(d['name'] for d in described)} on the link scale ({how})"
        )
        return description(
            self.name,
            text,
            ordered(i for d in described for i in d["inputs"]),
            weights={d["name"]: float(w) for d, w in zip(described, self.weights, strict=True)},
            scale=self.scale,
            intercept=self.intercept,
            members={d["name"]: d["parameters"] for d in described},
        )


def fitted_blend(ctx: Context, candidates: dict[str, Candidate], info: dict[str, Any]) -> Blend:
    """The blend a selection fitted (Selection.blend: members, weights, scale, intercept), rebuilt from its
    fitted members (selection.with_blend: its outputs when another candidate is published)."""
    blend = Blend(ctx, [candidates[m] for m in info["members"]])
    blend.weights = np.asarray(info["weights"], np.float64)
    blend.scale, blend.intercept = float(info.get("scale", 1.0)), float(info["intercept"])
    return blend
