"""Regression: how much (spend in the window)? One output, MSE on the standardised target (mean/std of the
training labels). For a non-negative target that is often zero, a hurdle: two outputs, the probability of any
amount (cross-entropy) and the standardised amount when there is one (MSE on those rows); the prediction is
their product, the expected amount. Every output stays within the training labels' range.

Outputs are values [n]; the scenario is judged by RMSE (lower is better). Blends fit non-negative weights and
an intercept by least squares. The popularity baseline is the same quantity in the window before the split
(the training mean for python targets).

A ``log1p`` target (spend) is learned and judged on log(1 + amount), but published in money: expm1 of a
log-scale prediction is the geometric, not the arithmetic, mean (a hurdle's p x log-amount is worse still), so
a sum of them underestimates revenue several times. ``calibrate`` fits, on the validation windows' held-out
outputs, the monotone map from a candidate's output to the mean amount of the rows with that output
(isotonic regression, read with linear interpolation): the expected amount given the prediction, which keeps
the ranking and makes the mean prediction match the mean amount. The predictions table's ``value`` is that
expected amount; ``value_log1p`` keeps the model's log-scale output."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import Scenario
from basemodel_pipeline.dates import DAY
from basemodel_pipeline.evaluation import metrics
from basemodel_pipeline.targets.columns import check_column
from basemodel_pipeline.targets.events import regression_values, target_source
from basemodel_pipeline.targets.labels import Examples, Labels, TargetDetails, TargetSpec
from basemodel_pipeline.targets.windows import candidate_pairs
from basemodel_pipeline.tasks.base import Task, register

HURDLE_ZERO_SHARE = 0.1  # a non-negative target zero in at least this share of rows -> hurdle


class RegressionDetails(TargetDetails):
    """A regression spec's details: the target's scale and the training labels' statistics (fit_details)."""

    log1p: bool = False  # the target is log(1 + amount); the predictions table holds the amount
    mean: float = 0.0  # of the training labels: the head predicts (y - mean) / std
    std: float = 1.0
    min: float | None = None  # the range every output keeps to (None: unbounded)
    max: float | None = None
    hurdle: bool = False  # two outputs: P(any amount) and the standardised amount when there is one
    positive_share: float | None = None  # hurdle: the share of rows with an amount, their mean and std
    positive_mean: float | None = None
    positive_std: float | None = None
    money_x: list[float] | None = None  # log1p: the published output -> expected amount map (calibrate)
    money_y: list[float] | None = None


def amount_map(out: np.ndarray, amount: np.ndarray) -> tuple[list[float], list[float]]:
    """The increasing map from outputs to the mean amount of the rows with that output (isotonic regression on
    held-out rows), as the (x, y) knots np.interp reads."""
    from sklearn.isotonic import IsotonicRegression

    iso = IsotonicRegression(increasing=True, out_of_bounds="clip").fit(
        np.asarray(out, np.float64), np.asarray(amount, np.float64)
    )
    return [float(v) for v in iso.X_thresholds_], [float(v) for v in iso.y_thresholds_]


def amounts(out: np.ndarray, knots: tuple[list[float], list[float]] | None) -> np.ndarray:
    """Log1p-scale outputs as expected amounts through `knots` (expm1 when there are none)."""
    out = np.asarray(out, np.float64)
    if not knots or len(knots[0]) == 0:
        return np.expm1(np.maximum(out, 0.0))
    return np.interp(out, knots[0], knots[1])


def regression_stats(y: np.ndarray) -> dict[str, Any]:
    """What a regression head needs from its training labels: mean/std, the range its outputs keep to, and
    whether to use the hurdle (a non-negative target that is zero in at least HURDLE_ZERO_SHARE of rows)."""
    out: dict[str, Any] = {
        "mean": float(y.mean()),
        "std": float(y.std() + 1e-6),
        "min": float(y.min()),
        "max": float(y.max()),
    }
    pos = y[y > 0]
    if y.min() >= 0 and np.mean(y == 0) >= HURDLE_ZERO_SHARE and len(pos) >= 2:
        out.update(
            hurdle=True,
            positive_share=float(len(pos) / len(y)),
            positive_mean=float(pos.mean()),
            positive_std=float(pos.std() + 1e-6),
        )
    return out


@register
class Regression(Task):
    name = "regression"
    primary_metric = "rmse"
    lightgbm = "regression"
    explainable = True
    least_squares_blend = True
    charts = "values"
    details = RegressionDetails

    def __init__(self, spec: TargetSpec) -> None:
        super().__init__(spec)
        self.d: RegressionDetails = spec.details  # type: ignore[assignment]  # checked by Task

    @property
    def hurdle(self) -> bool:
        return self.d.hurdle

    @property
    def out_dim(self) -> int:
        return 2 if self.hurdle else 1

    @classmethod
    def fit_details(cls, details: TargetDetails, train_labels: Labels) -> TargetDetails:
        return details.with_values(**regression_stats(np.asarray(train_labels, np.float64)))

    # ---- target -> labels ----------------------------------------------------------------------------
    @classmethod
    def choose_spec(cls, cache: EventCache, scenario: Scenario, train_times: np.ndarray) -> TargetSpec:
        target = scenario.target
        if target.aggregation == "sum":
            check_column(target_source(cache, scenario), scenario, target.column or "", "numeric")
        return TargetSpec(cls.name, [], [], RegressionDetails(log1p=target.log1p))

    def examples(self, cache: EventCache, scenario: Scenario, times: np.ndarray) -> Examples:
        """The count or sum of the window's matching events (log1p of it for a ``log1p`` target)."""
        e, t = candidate_pairs(cache, scenario, times)
        return Examples(e, t, regression_values(cache, scenario, e, t).astype(np.float32))

    # ---- labels -> targets ---------------------------------------------------------------------------
    def init_bias(self, head: nn.Linear, labels: Labels) -> None:
        """Zero (the standardised mean); with a hurdle, the log-odds of any amount."""
        with torch.no_grad():
            head.bias.zero_()
            if self.hurdle:
                share = float(np.clip(self.d.positive_share or 0.0, 1e-4, 1 - 1e-4))
                head.bias[0] = float(np.log(share / (1 - share)))

    def targets(self, labels: Labels, idx: np.ndarray) -> torch.Tensor:
        d = self.d
        y = np.asarray(labels, np.float32)[idx]
        if self.hurdle:
            pos = y > 0
            amount = np.where(pos, (y - d.positive_mean) / d.positive_std, 0.0)  # type: ignore[operator]
            return torch.from_numpy(np.stack([pos, amount], 1).astype(np.float32))
        return torch.from_numpy(((y - d.mean) / d.std).astype(np.float32)[:, None])

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if not self.hurdle:
            return nn.functional.mse_loss(logits, target)
        pos = target[:, 0]
        any_amount = nn.functional.binary_cross_entropy_with_logits(logits[:, 0], pos)
        amount = ((logits[:, 1] - target[:, 1]) ** 2 * pos).sum() / pos.sum().clamp_min(1.0)
        return any_amount + amount

    # ---- decoding ------------------------------------------------------------------------------------
    def scores(self, logits: np.ndarray) -> np.ndarray:
        d, z = self.d, logits.astype(np.float64)
        if self.hurdle:
            p = 1.0 / (1.0 + np.exp(-z[:, 0]))
            top = np.inf if d.max is None else d.max
            amount = np.clip(z[:, 1] * d.positive_std + d.positive_mean, 0.0, top)  # type: ignore[operator]
            return self.clip(p * amount)
        return self.clip(z[:, 0] * d.std + d.mean)

    def clip(self, values: np.ndarray) -> np.ndarray:
        """Values within the training labels' range (min / max, when known)."""
        lo, hi = self.d.min, self.d.max
        return np.clip(values, -np.inf if lo is None else lo, np.inf if hi is None else hi)

    def finish(self, out: np.ndarray) -> np.ndarray:
        return self.clip(out)

    # ---- metrics -------------------------------------------------------------------------------------
    @classmethod
    def evaluate(cls, y: Any, score: Any, k: int = 10, log1p: bool = False) -> dict[str, float]:
        return metrics.regression_metrics(y, score, log1p)

    @property
    def calibrated(self) -> bool:
        return self.d.log1p

    def calibrate(self, val_out: Any, val_truth: Any) -> tuple[list[float], list[float]] | None:
        if not self.d.log1p or len(np.asarray(val_out)) == 0:
            return None
        return amount_map(np.asarray(val_out), np.expm1(np.asarray(val_truth, np.float64)))

    def calibrated_metrics(self, truth: Any, out: Any, calibration: Any) -> dict[str, float]:
        """For a log1p target, the amounts' metrics of the expected amounts (they replace those of expm1)."""
        if not self.d.log1p:
            return {}
        return metrics.amount_metrics(np.expm1(np.asarray(truth, np.float64)), amounts(out, calibration))

    def publish_calibration(self, calibration: Any) -> None:
        if calibration is not None:
            self.d.money_x, self.d.money_y = calibration

    # ---- baselines -----------------------------------------------------------------------------------
    def constant_prior(self, y: np.ndarray) -> np.ndarray:
        return np.array([np.mean(y)])

    def constant(self, prior: list[float], n: int) -> np.ndarray:
        return np.full(n, prior[0])

    def popularity(
        self, cache: EventCache, entity: np.ndarray, time: np.ndarray, scenario: Scenario, prior: Any
    ) -> np.ndarray:
        """The same quantity in the window of the same length before the split."""
        before = regression_values(cache, scenario, entity, time - scenario.target.horizon_days * DAY)
        return self.clip(before)

    # ---- outputs -------------------------------------------------------------------------------------
    def output_table(
        self, ids: np.ndarray, as_of: dt.date, out: Any, top_k: int | None, threshold: float | None
    ) -> pa.Table:
        columns: dict[str, Any] = {"entity_id": ids, "as_of": pa.array([as_of] * len(ids), pa.date32())}
        if not self.d.log1p:
            return pa.table({**columns, "value": out})
        knots = (self.d.money_x, self.d.money_y) if self.d.money_x is not None else None
        return pa.table({**columns, "value": amounts(out, knots), "value_log1p": np.asarray(out, np.float64)})

    # ---- explanations --------------------------------------------------------------------------------
    def explained(self, out: torch.Tensor, index: int) -> torch.Tensor:
        d = self.d
        if self.hurdle:  # P(any amount) x the amount if any (before clipping to the range)
            amount = out[:, 1] * d.positive_std + d.positive_mean  # type: ignore[operator]
            return torch.sigmoid(out[:, 0]) * amount
        return out[:, 0] * d.std + d.mean

    def explained_what(self, label: str | None) -> str:
        log1p = " (log1p of the target)" if self.d.log1p else ""
        return f"predicted value{log1p}"
