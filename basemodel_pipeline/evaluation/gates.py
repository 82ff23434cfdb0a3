"""Quality gates: the verdicts a new checkpoint must pass before it is served (training/promotion.py runs them,
the Dagster checks show them). Each gate is a pure function of what the checkpoint recorded.

    foundation   loss_finite         every epoch's train and validation loss is finite (blocking)
                 loss_improving      the losses improve on the first epoch (a warning, never blocking)
    scenario     test_metric_above_floor   the test metric is within its bound (quality_gates.metric_floor(s))
                 beats_popularity          it beats the popularity baseline by more than the margin
                 refit_outputs_finite      after the production refit, what is served scores every test row
Every checkpoint also passes `checkpoint_sha256` (its files match the manifest), run where the files are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from basemodel_pipeline.config.gates import QualityGatesParams
from basemodel_pipeline.evaluation.metrics import higher_is_better


@dataclass(frozen=True)
class Gate:
    """One gate's verdict. A failed `blocking` gate keeps the checkpoint from being served; a failed
    non-blocking one is a warning."""

    name: str
    passed: bool
    detail: str
    blocking: bool = True
    values: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Gate:
        return cls(
            name=str(raw["name"]),
            passed=bool(raw["passed"]),
            detail=str(raw.get("detail", "")),
            blocking=bool(raw.get("blocking", True)),
            values=dict(raw.get("values") or {}),
        )


def rejecting(gates: list[Gate]) -> list[Gate]:
    """The blocking gates that failed (empty: the checkpoint may be served)."""
    return [g for g in gates if g.blocking and not g.passed]


def loss_gates(history: list[dict[str, Any]]) -> list[Gate]:
    """The foundation's loss gates from its training history [{epoch, train_loss, val_loss}, ...]."""
    if not history:
        return [Gate("loss_finite", False, "the checkpoint records no training history")]
    bad = [
        f"epoch {h.get('epoch')}: {k}={h[k]}"
        for h in history
        for k in ("train_loss", "val_loss")
        if k in h and not math.isfinite(float(h[k]))
    ]
    if bad:
        return [Gate("loss_finite", False, "non-finite loss: " + ", ".join(bad[:3]))]
    val = [float(h["val_loss"]) for h in history if "val_loss" in h]
    train = [float(h["train_loss"]) for h in history if "train_loss" in h]
    finite = Gate("loss_finite", True, f"losses finite; best validation loss {min(val or [math.nan]):.4f}")
    if len(val) >= 2 and not min(val[1:]) < val[0]:
        why = f"validation loss never improved on epoch 1 ({val[0]:.4f})"
        return [finite, Gate("loss_improving", False, why, blocking=False)]
    if len(train) >= 2 and not train[-1] < train[0]:
        why = f"training loss did not fall ({train[0]:.4f} -> {train[-1]:.4f})"
        return [finite, Gate("loss_improving", False, why, blocking=False)]
    return [finite, Gate("loss_improving", True, "losses improve", blocking=False)]


def floor_gate(metric: str, value: float, bound: float | None) -> Gate:
    """The test metric against its bound: a minimum (AUROC, accuracy...) or a maximum (rmse...)."""
    name = "test_metric_above_floor"
    if bound is None:
        return Gate(
            name,
            math.isfinite(value),
            f"test {metric} {value:.4f}; no bound configured for it",
            values={"value": value},
        )
    higher = higher_is_better(metric)
    ok = value >= bound if higher else value <= bound
    why = f"test {metric} {value:.4f} vs {'floor' if higher else 'ceiling'} {bound:.4f}"
    return Gate(name, math.isfinite(value) and ok, why, values={"value": value, "bound": bound})


def popularity_gate(metric: str, model: float, popularity: float | None, margin: float | None) -> Gate:
    """The test metric against the popularity baseline's on the same rows (+ margin, in its direction)."""
    name = "beats_popularity"
    if margin is None:
        return Gate(name, True, "not checked (quality_gates.popularity_margin is null)")
    if popularity is None or not math.isfinite(popularity):
        return Gate(name, math.isfinite(model), f"test {metric}: no popularity baseline to compare with")
    lift = model - popularity if higher_is_better(metric) else popularity - model
    why = (
        f"test {metric}: model {model:.4f}, popularity {popularity:.4f} "
        f"(better by {lift:.4f}, > {margin:g} needed)"
    )
    values = {"model": model, "popularity": popularity, "lift": lift}
    return Gate(name, math.isfinite(model) and lift > margin, why, values=values)


def scenario_gates(scenario: str, metrics: Mapping[str, Any], params: QualityGatesParams) -> list[Gate]:
    """The scenario gates on a fine-tuning run's test metrics (metric, test: {model, popularity, ...})."""
    metric = str(metrics["metric"])
    test = metrics["test"]
    model = float(test["model"]) if test.get("model") is not None else math.nan
    popularity = float(test["popularity"]) if test.get("popularity") is not None else None
    gates = [
        floor_gate(metric, model, params.bound(scenario, metric)),
        popularity_gate(metric, model, popularity, params.popularity_margin),
    ]
    refit = metrics.get("refit") or {}
    if refit.get("refit_on_all"):  # the production refit is served: it must score every test row
        ok = bool(refit.get("outputs_finite", True))
        why = (
            "the refitted model scores the test rows" if ok else "the refitted model's outputs are not finite"
        )
        gates.append(Gate("refit_outputs_finite", ok, why))
    return gates
