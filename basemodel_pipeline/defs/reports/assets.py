"""Test metrics of every scenario next to the baselines, in <workspace>/reports/summary.json."""

import dagster as dg

from basemodel_pipeline.defs.models.assets import scenario_model
from basemodel_pipeline.defs.shared.conditions import AFTER_INPUTS_CHANGED
from basemodel_pipeline.defs.shared.execution import materialize_in_process
from basemodel_pipeline.defs.shared.resources import BasemodelConfigResource
from basemodel_pipeline.defs.shared.versions import code_version
from basemodel_pipeline.pipeline import write_summary


@dg.asset(
    deps=[scenario_model],
    group_name="reports",
    kinds={"json"},
    automation_condition=AFTER_INPUTS_CHANGED,
    code_version=code_version("metrics_summary"),
)
def metrics_summary(basemodel_config: BasemodelConfigResource) -> dg.MaterializeResult:
    """Each scenario's test metric: model, aggregates + LightGBM, popularity (reports/summary.json)."""
    return materialize_in_process(lambda: write_summary(basemodel_config.load()))
