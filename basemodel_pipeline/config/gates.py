"""Config model of the `quality_gates` section: what a new checkpoint must pass before it is served.

    quality_gates:
      metric_floor: 0.55          # AUROC-type test metrics (auroc, macro_auroc, micro_auroc) of every scenario
      metric_floors: {spend: 1.5} # per scenario, its own metric: a minimum when higher is better, else a maximum
      popularity_margin: 0.0      # the test metric must beat popularity's by more than this; null: not checked

A checkpoint that fails a gate is kept on disk as a rejected candidate and never becomes LATEST
(training/promotion.py). A deployment can override the first and the last per environment (Dagster's
`quality_gates` resource, BASEMODEL_METRIC_FLOOR / BASEMODEL_POPULARITY_MARGIN).
"""

from __future__ import annotations

from pydantic import Field

from basemodel_pipeline.config.base import Strict


class QualityGatesParams(Strict):
    metric_floor: float = Field(
        default=0.55,
        description="Lowest AUROC-type test metric (auroc, macro_auroc, micro_auroc) a scenario may publish.",
    )
    metric_floors: dict[str, float] = Field(
        default_factory=dict,
        description="Per-scenario bound of its own test metric: a minimum when higher is better (accuracy, "
        "ndcg@10), a maximum when lower is better (rmse).",
    )
    popularity_margin: float | None = Field(
        default=0.0,
        description="A scenario's test metric must beat the popularity baseline's by more than this, in the "
        "metric's direction; null: not checked.",
    )

    def bound(self, scenario: str, metric: str) -> float | None:
        """The bound of `scenario`'s test metric, or None when none applies."""
        if scenario in self.metric_floors:
            return self.metric_floors[scenario]
        return self.metric_floor if metric.endswith("auroc") else None

    def overridden(self, overrides: dict[str, object]) -> QualityGatesParams:
        """These gates with a deployment's overrides (Dagster's quality_gates resource): metric_floor and
        popularity_margin replace the config's, metric_floors are merged over the config's."""
        update = {k: v for k, v in overrides.items() if k in ("metric_floor", "popularity_margin")}
        if overrides.get("metric_floors"):
            update["metric_floors"] = {**self.metric_floors, **dict(overrides["metric_floors"])}  # type: ignore[arg-type]
        return QualityGatesParams.model_validate({**self.model_dump(), **update})
