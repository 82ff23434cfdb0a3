"""Score entities: ``python -m basemodel_pipeline.entrypoints.predict --config PATH --scenario NAME [--as-of DATE]
[--precision auto|fp32|bf16|int8] [--output DESTINATION] [--workers K | --shard I/K | --merge-shards K]``.

Under Dagster the scenario defaults to the partition key of the ``predictions`` asset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.entrypoints._common import EntrypointArgs, main
from basemodel_pipeline.inference.shards import ScoringPlan, parse_shard
from basemodel_pipeline.pipeline import run_predict
from basemodel_pipeline.progress import Progress


def stage(cfg: PipelineConfig, args: EntrypointArgs, progress: Progress) -> Mapping[str, Any]:
    assert args.scenario is not None
    options = dict(args.options)
    shard = options.pop("shard", None)
    plan = ScoringPlan(
        options.pop("workers", 1), parse_shard(shard) if shard else None, options.pop("merge_shards", None)
    )
    return run_predict(cfg, args.scenario, args.as_of, plan, progress, **options)


if __name__ == "__main__":
    main("predict", stage, scenario=True, needs_scenario=True, as_of=True, scoring=True)
