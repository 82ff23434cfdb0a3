"""Which candidate a scenario publishes: chosen on validation windows, never on the test window.

The validation examples are split by entity into two halves (``split_validation``):

    stop     early stopping of every fitted candidate (the network's epochs, LightGBM's rounds)
    select   the comparison: every candidate's primary metric on the same rows

The blend's weights are fitted on `select` too, so its score there is cross-fitted: weights fitted on one
entity half of `select` score the other half, and the other way round. Every candidate is scored the same way
(the mean of the metric over the two halves), so the numbers compare. The published candidate is the best;
ties go to the simpler one (``PREFERENCE``). A scenario can pin a candidate (``publish: NAME``): it is then
published whatever the comparison says, and the report says so. The test window is scored after the choice,
for the report only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from basemodel_pipeline.candidates.base import Candidate, Context
from basemodel_pipeline.candidates.blend import Blend, fitted_blend
from basemodel_pipeline.errors import ConfigError
from basemodel_pipeline.evaluation.resampling import bootstrap_rounds, entity_folds, paired_bootstrap
from basemodel_pipeline.targets.labels import SparseLabels, take_labels
from basemodel_pipeline.tasks import Task

PREFERENCE = (
    "popularity",
    "recent_popularity",
    "repeat_purchases",
    "cooccurrence",
    "lightgbm_aggregates",
    "neural",
    "lightgbm_hybrid",
    "lightgbm_hybrid_seeds",
    "reranker",
    "blend",
)  # simplest first: a tie goes to the earlier name
BASELINES = (
    "lightgbm_aggregates",
    "popularity",
    "recent_popularity",
    "repeat_purchases",
    "cooccurrence",
)  # need no network
BOOTSTRAP_ROUNDS = 200  # select rows resampled to tell the best single candidate from the blend


@dataclass
class Selection:
    """The outcome of the comparison on validation, stored in the checkpoint and shown in the report."""

    published: str
    metric: str
    validation: dict[str, float]  # primary metric on the `select` rows per candidate
    reason: str
    pinned: bool = False
    blend: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "published": self.published,
            "metric": self.metric,
            "validation": self.validation,
            "reason": self.reason,
            "pinned": self.pinned,
            "blend": self.blend,
        }


def split_validation(entity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(stop, select) row indices of validation examples: two halves by entity (every row of an entity in
    the same half). With fewer than 4 entities both halves are all rows."""
    if len(np.unique(entity)) < 4:
        idx = np.arange(len(entity))
        return idx, idx
    mixed = (np.asarray(entity).astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93)) >> np.uint64(33)
    fold = (mixed & np.uint64(1)).astype(np.int64)  # a different hash from entity_folds: independent halves
    return np.flatnonzero(fold == 0), np.flatnonzero(fold == 1)


def _better(task: Task, a: float, b: float) -> bool:
    if not np.isfinite(a):
        return False
    if not np.isfinite(b):
        return True
    return a > b if task.higher_is_better() else a < b


def primary(task: Task | type[Task], y: Any, out: Any) -> float:
    """The primary metric; recommendation labels come as SparseLabels (relevant items per row)."""
    if isinstance(y, SparseLabels):
        y = (y.indptr, y.indices, y.n_cols)
    return float(task.primary(y, out))


def _halves_metric(task: Task, y: Any, out: Any, halves: list[np.ndarray]) -> float:
    vals = [primary(task, take_labels(y, h), out[h]) for h in halves]
    vals = [v for v in vals if np.isfinite(v)]
    return float(np.mean(vals)) if vals else float("nan")


def choose(
    ctx: Context,
    candidates: dict[str, Candidate],
    outputs: dict[str, np.ndarray],
    y: np.ndarray,
    entity: np.ndarray,
    blend_members: list[str],
    pinned: str | None = None,
) -> tuple[Selection, Candidate]:
    """Compare candidates on the `select` rows (their outputs there, labels `y`, entity indices `entity`),
    fit a blend of `blend_members` when there are two or more, and return (selection, published candidate)."""
    task = ctx.task
    metric = task.primary_metric
    entity = np.asarray(entity, np.int64)
    fold = entity_folds(entity, 2)
    halves = [np.flatnonzero(fold == k) for k in (0, 1)]
    halves = [h for h in halves if len(h)] or [np.arange(len(y))]
    scores = {name: _halves_metric(task, y, out, halves) for name, out in outputs.items()}
    pool: dict[str, Candidate] = dict(candidates)
    blend_info: dict[str, Any] = {}
    blend_out: np.ndarray | None = None  # cross-fitted blend outputs of the select rows
    members = [m for m in blend_members if m in candidates]
    if len(members) >= 2:
        blend = Blend(ctx, [candidates[m] for m in members])
        member_out = [outputs[m] for m in members]
        if len(halves) == 2:  # cross-fitted score: weights from one half, metric on the other
            crossed = []
            for fit_h, score_h in (halves, halves[::-1]):
                part = Blend(ctx, blend.members).fit_outputs([o[fit_h] for o in member_out], y[fit_h])
                out_h = part.combine([o[score_h] for o in member_out])
                blend_out = np.zeros((len(y), *out_h.shape[1:])) if blend_out is None else blend_out
                blend_out[score_h] = out_h
                crossed.append(primary(task, y[score_h], out_h))
            crossed = [v for v in crossed if np.isfinite(v)]
            scores["blend"] = float(np.mean(crossed)) if crossed else float("nan")
        blend.fit_outputs(member_out, y)
        if len(halves) < 2:
            scores["blend"] = primary(task, y, blend.combine(member_out))
        pool["blend"] = blend
        blend_info = {
            "members": members,
            "weights": [round(float(w), 4) for w in blend.weights],
            "scale": round(blend.scale, 4),
            "intercept": round(blend.intercept, 4),
        }
    if pinned is not None:
        if pinned not in pool:
            raise ConfigError(
                f"scenario '{ctx.scenario.name}': publish: '{pinned}' is not one of its candidates "
                f"({', '.join(sorted(pool))})"
            )
        reason = f"pinned by the scenario config (publish: {pinned})"
        return Selection(pinned, metric, scores, reason, True, blend_info), pool[pinned]
    order = sorted(pool, key=lambda n: PREFERENCE.index(n) if n in PREFERENCE else len(PREFERENCE))
    best = order[0]
    for name in order[1:]:
        if _better(task, scores.get(name, float("nan")), scores.get(best, float("nan"))):
            best = name
    runner_up = [n for n in order if n != best and np.isfinite(scores.get(n, float("nan")))]
    second = max(
        runner_up,
        key=lambda n: scores[n] if task.higher_is_better() else -scores[n],
        default=None,
    )
    reason = f"best validation {metric} ({scores.get(best, float('nan')):.4f})"
    if second is not None:
        reason += f"; next: {second} ({scores[second]:.4f})"
    if best != "blend" and blend_out is not None and np.isfinite(scores.get("blend", float("nan"))):
        lo = _gain_lower_bound(task, y, outputs[best], blend_out, fold, entity)
        if lo <= 0:  # not better than the blend beyond validation noise: the combination is safer
            reason = (
                f"the blend ({scores['blend']:.4f}) is within the validation noise of the best single "
                f"candidate, {best} ({scores[best]:.4f}; 95% lower bound of its gain {lo:+.4f}): a "
                "combination of models holds up better on new windows than a choice made on noise"
            )
            best = "blend"
    return Selection(best, metric, scores, reason, False, blend_info), pool[best]


def with_blend(
    ctx: Context, candidates: dict[str, Candidate], selection: Selection, published: Candidate, outputs: dict
) -> dict[str, Any]:
    """Each candidate's `outputs` on some rows, and the blend's when the selection fitted one (published or
    not), combined from its members' outputs there rather than by scoring the members again."""
    if "blend" not in selection.validation:
        return outputs
    blend = published if selection.published == "blend" else fitted_blend(ctx, candidates, selection.blend)
    assert isinstance(blend, Blend)
    return {**outputs, "blend": blend.combine([outputs[m] for m in selection.blend["members"]])}


def _gain_lower_bound(
    task: Task, y: Any, best: np.ndarray, blend: np.ndarray, fold: np.ndarray, entity: np.ndarray
) -> float:
    """2.5th percentile of best's gain over the blend on resamples of the select entities (within each entity
    half; an entity's windows together), signed so that > 0 means better; fewer resamples when each costs
    thousands of per-class AUROCs."""
    rounds = bootstrap_rounds(task.metric_width(best), BOOTSTRAP_ROUNDS, floor=20)
    _, lo, hi = paired_bootstrap(task.primary, y, best, blend, rounds=rounds, groups=fold, clusters=entity)
    bound = lo if task.higher_is_better() else -hi
    return bound if np.isfinite(bound) else float("-inf")  # unmeasurable noise: no proven gain


NOT_APPLICABLE = {"repeat_purchases": "items: new ranks only items the entity never had: nothing to repeat"}


def worse_on_test(task: Task, test: dict[str, Any]) -> list[str]:
    """The baselines that scored better than the published model ("model") on the test window: the choice made
    on validation did not hold there (a warning in the log, the report and the Dagster metadata)."""
    model = test.get("model")
    if model is None or not np.isfinite(model):
        return []
    return [
        name for name in BASELINES if isinstance(test.get(name), float) and _better(task, test[name], model)
    ]
