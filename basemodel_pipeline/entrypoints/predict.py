"""Score entities: ``python -m basemodel_pipeline.entrypoints.predict --config PATH --scenario NAME [--as-of DATE]
[--precision auto|fp32|bf16|int8] [--output DESTINATION] [--workers K | --shard I/K | --merge-shards K]``.

Under Dagster the scenario defaults to the partition key of the ``predictions`` asset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.entrypoints._common import EntrypointArgs, main
from basemodel_pipeline.inference.shards import parse_shard
from basemodel_pipeline.pipeline import run_predict
from basemodel_pipeline.progress import Progress


def stage(cfg: PipelineConfig, args: EntrypointArgs, progress: Progress) -> Mapping[str, Any]:
    assert args.scenario is not None
    cfg.scenario(args.scenario)  # unknown name -> ConfigError before any work
    options = dict(args.options)
    workers = options.pop("workers", 1)
    if options.get("merge_shards"):
        from basemodel_pipeline.pipeline import run_merge_shards

        return run_merge_shards(
            cfg, args.scenario, args.as_of, options["merge_shards"], options.get("destination")
        )
    if options.get("shard"):
        options["shard"] = parse_shard(options["shard"])
    if workers > 1:
        from pathlib import Path

        from basemodel_pipeline.pipeline import run_predict_workers

        destination = options.get("destination")
        forwarded = ["--precision", options["precision"]] + (["--output", destination] if destination else [])
        return run_predict_workers(
            cfg, Path(args.config), args.scenario, args.as_of, workers, forwarded, destination, progress
        )
    return run_predict(cfg, args.scenario, args.as_of, progress, **options)


if __name__ == "__main__":
    main("predict", stage, scenario=True, needs_scenario=True, as_of=True, scoring=True)
