"""Score entities: ``python -m basemodel_pipeline.entrypoints.predict --config PATH --scenario NAME [--as-of DATE]
[--precision auto|fp32|bf16|int8] [--output DESTINATION] [--workers K | --shard I/K | --merge-shards K] ...``:
one flag per field of inference.options.ScoringOptions, the flags of `basemodel predict`.

Under Dagster the scenario defaults to the partition key of the ``predictions`` asset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.entrypoints._common import EntrypointArgs, main
from basemodel_pipeline.inference.options import ScoringOptions
from basemodel_pipeline.pipeline import run_predict
from basemodel_pipeline.progress import Progress


def stage(cfg: PipelineConfig, args: EntrypointArgs, progress: Progress) -> Mapping[str, Any]:
    assert args.scenario is not None and isinstance(args.scoring, ScoringOptions)
    return run_predict(cfg, args.scenario, args.scoring, progress)


if __name__ == "__main__":
    main("predict", stage, scenario=True, needs_scenario=True, scoring=ScoringOptions)
