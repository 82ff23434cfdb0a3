"""Fine-tune one scenario model: ``python -m basemodel_pipeline.entrypoints.finetune --config PATH --scenario NAME``.

Under Dagster the scenario defaults to the partition key of the ``scenario_model`` asset.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.entrypoints._common import EntrypointArgs, main
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.pipeline import run_finetune
from basemodel_pipeline.progress import Progress


def stage(cfg: PipelineConfig, args: EntrypointArgs, progress: Progress) -> Mapping[str, Any]:
    assert args.scenario is not None
    cfg.scenario(args.scenario)  # unknown name -> ConfigError before any work
    if args.options.get("gates"):  # the deployment's overrides (Dagster's quality_gates resource)
        try:
            gates = cfg.quality_gates.overridden(args.options["gates"])
        except ValueError as exc:
            raise UserError(f"--gates: not valid quality_gates overrides ({exc})") from None
        cfg = cfg.model_copy(update={"quality_gates": gates})
    meta = dict(run_finetune(cfg, args.scenario, progress))
    report = Path(meta["path"]) / "metrics.json"
    if report.is_file():  # the scenario's report (test metrics beside the baselines), linked in the UI
        meta["report_file"] = str(report)
    return meta


if __name__ == "__main__":
    main("finetune", stage, scenario=True, needs_scenario=True, gates=True)
