"""Reports: metrics_summary, the scenarios' test metrics beside their baselines (in-process)."""

from __future__ import annotations

import dagster as dg

from basemodel_pipeline.defs.reports.assets import metrics_summary
from basemodel_pipeline.defs.shared.deployment import Deployment


def defs(deployment: Deployment) -> dg.Definitions:
    return dg.Definitions(assets=[metrics_summary])
