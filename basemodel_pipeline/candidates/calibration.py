"""What turns a scenario's outputs into the quantity it publishes, fitted on the validation windows after the
choice (Task.calibrate: a log1p amount's map to money, tasks/regression.py), and how well the published
model's amounts add up on the test windows."""

from __future__ import annotations

from typing import Any

import numpy as np

from basemodel_pipeline.candidates.base import Candidate, Context
from basemodel_pipeline.candidates.blend import fitted_blend
from basemodel_pipeline.candidates.inputs import Rows
from basemodel_pipeline.candidates.selection import Selection
from basemodel_pipeline.evaluation.metrics import mean_interval


def calibrate_outputs(
    ctx: Context,
    candidates: dict[str, Candidate],
    selection: Selection,
    published: Candidate,
    val_out: dict[str, Any],
    select: Rows,
    y_select: Any,
) -> dict[str, Any]:
    """Each output's calibration ("model": the published candidate's, and the blend's when one was fitted),
    from its held-out outputs on the selection rows; the published one goes into the spec (model.json)."""
    outs = dict(val_out)
    if "blend" in selection.validation:
        blend = (
            published if selection.published == "blend" else fitted_blend(ctx, candidates, selection.blend)
        )
        outs["blend"] = blend.predict(select)
    outs["model"] = outs[selection.published]
    calibrations = {name: ctx.task.calibrate(out, y_select) for name, out in outs.items()}
    ctx.task.publish_calibration(calibrations["model"])
    return calibrations


def amounts_summary(model: dict[str, float], truth: Any, entity: np.ndarray) -> dict[str, Any]:
    """A log1p amount published in money: the mean expected amount on the test windows beside the mean amount
    and its 95% interval (entities resampled): whether a revenue forecast summing `predict`'s values holds."""
    lo, hi = mean_interval(np.expm1(np.asarray(truth, np.float64)), entity)
    mean = model["mean_predicted"]
    return {
        "mean_predicted": mean,
        "mean_actual": model["mean_actual"],
        "mean_actual_95": [lo, hi],
        "mean_within_interval": bool(lo <= mean <= hi),
    }
