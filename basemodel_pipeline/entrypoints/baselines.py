"""Fit and stage one scenario's baselines (the CPU phase, no GPU):
``python -m basemodel_pipeline.entrypoints.baselines --config PATH --scenario NAME``.

Under Dagster the scenario defaults to the partition key of the ``scenario_baselines`` asset; the
``scenario_model`` step (entrypoints/finetune.py) then reads what this wrote (scenarios/baselines.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.entrypoints._common import EntrypointArgs, main
from basemodel_pipeline.pipeline import run_baselines
from basemodel_pipeline.progress import Progress


def stage(cfg: PipelineConfig, args: EntrypointArgs, progress: Progress) -> Mapping[str, Any]:
    assert args.scenario is not None
    cfg.scenario(args.scenario)  # unknown name -> ConfigError before any work
    return run_baselines(cfg, args.scenario, progress)


if __name__ == "__main__":
    main("baselines", stage, scenario=True, needs_scenario=True)
