"""The scenario network's outputs as a candidate of classifiers and regression (the network itself is trained
by scenarios/network.py; its ranking counterpart is ranking_baselines.NeuralRanking)."""

from __future__ import annotations

from typing import Any

import numpy as np

from basemodel_pipeline.candidates.base import NETWORK, Context, description
from basemodel_pipeline.candidates.inputs import Rows


class Neural:
    """The fine-tuned network's head, its outputs decoded by the task."""

    name = "neural"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def fit(self, train: Rows, stop: Rows) -> None:
        pass

    def predict(self, rows: Rows) -> np.ndarray:
        return self.ctx.task.scores(rows.logits())

    def refit(self, rows: Rows) -> None:
        pass  # the network is trained again by scenarios/refit.py (the fine-tuning stage owns the loop)

    def save(self) -> tuple[dict[str, Any], dict[str, bytes]]:
        return {"kind": "neural"}, {}

    def describe(self) -> dict[str, Any]:
        text = "the fine-tuned network (foundation trunk + task head), its outputs decoded by the task"
        return description(self.name, text, [NETWORK], outputs=self.ctx.task.out_dim)
