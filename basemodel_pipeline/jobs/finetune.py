"""Fine-tune one scenario model: ``python -m basemodel_pipeline.jobs.finetune --config PATH --scenario NAME``.

Under Dagster the scenario defaults to the partition key of the ``scenario_model`` asset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.jobs._common import JobArgs, main
from basemodel_pipeline.pipeline import run_finetune
from basemodel_pipeline.progress import Progress


def stage(cfg: PipelineConfig, args: JobArgs, progress: Progress) -> Mapping[str, Any]:
    assert args.scenario is not None
    cfg.scenario(args.scenario)  # unknown name -> ConfigError before any work
    return run_finetune(cfg, args.scenario, progress)


if __name__ == "__main__":
    main("finetune", stage, scenario=True, needs_scenario=True)
