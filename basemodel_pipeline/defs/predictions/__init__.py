"""Predictions (per scenario) and entity_embeddings (Pipes), with the predictions' output check."""

from __future__ import annotations

import dagster as dg

from basemodel_pipeline.defs.predictions.assets import entity_embeddings, predictions
from basemodel_pipeline.defs.predictions.checks import predictions_checks
from basemodel_pipeline.defs.shared.deployment import Deployment


def defs(deployment: Deployment) -> dg.Definitions:
    return dg.Definitions(assets=[predictions, entity_embeddings], asset_checks=predictions_checks)
