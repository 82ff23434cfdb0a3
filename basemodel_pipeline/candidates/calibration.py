"""What turns a scenario's outputs into the quantity it publishes, fitted on the validation windows after the
choice (Task.calibrate: a log1p amount's map to money, tasks/regression.py), and how well the published
model's amounts add up on the test windows."""

from __future__ import annotations

from typing import Any

import numpy as np

from basemodel_pipeline.candidates.base import Candidate, Context
from basemodel_pipeline.candidates.inputs import Rows
from basemodel_pipeline.candidates.selection import Selection, with_blend
from basemodel_pipeline.evaluation.metrics import mean_interval


def calibrate_outputs(
    ctx: Context,
    candidates: dict[str, Candidate],
    selection: Selection,
    published: Candidate,
    val_out: dict[str, Any],
    y_select: Any,
    stop: tuple[Rows, Any],
) -> dict[str, Any]:
    """Each output's calibration ("model": the published candidate's, and the blend's when one was fitted),
    from its held-out outputs on every validation row: the selection rows (`val_out`, their outputs, and
    `y_select`) and the early-stopping rows (`stop`: rows, truth). The early-stopping half of the entities chose epochs and rounds,
    not what a map learns; with it the map sees twice the entities, so a heavy-tailed amount's level is not
    the luck of one half (Complete Journey spend: the selection half's mean 28-day spend was 138.6 against
    143.3 over all validation rows). The published one goes into the spec (model.json)."""
    stop_rows, y_stop = stop
    outs, truth = with_blend(ctx, candidates, selection, published, dict(val_out)), np.asarray(y_select)
    if len(stop_rows):
        more = {name: cand.predict(stop_rows) for name, cand in candidates.items()}
        more = with_blend(ctx, candidates, selection, published, more)
        outs = {name: np.concatenate([out, more[name]]) for name, out in outs.items()}
        truth = np.concatenate([truth, np.asarray(y_stop)])
    outs["model"] = outs[selection.published]
    calibrations = {name: ctx.task.calibrate(out, truth) for name, out in outs.items()}
    ctx.task.publish_calibration(calibrations["model"])
    return calibrations


def amounts_summary(
    model: dict[str, float], truth: Any, entity: np.ndarray, calibration_examples: int
) -> dict[str, Any]:
    """A log1p amount published in money: the mean expected amount on the test windows beside the mean amount
    and its 95% interval (entities resampled): whether a revenue forecast summing `predict`'s values holds;
    and the validation rows the money map learned from."""
    lo, hi = mean_interval(np.expm1(np.asarray(truth, np.float64)), entity)
    mean = model["mean_predicted"]
    return {
        "mean_predicted": mean,
        "mean_actual": model["mean_actual"],
        "mean_actual_95": [lo, hi],
        "mean_within_interval": bool(lo <= mean <= hi),
        "calibration_examples": int(calibration_examples),
    }
