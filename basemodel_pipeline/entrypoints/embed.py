"""Export foundation embeddings: ``python -m basemodel_pipeline.entrypoints.embed --config PATH [--as-of DATE]
[--precision P] [--output DESTINATION]``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.entrypoints._common import EntrypointArgs, main
from basemodel_pipeline.pipeline import run_embed
from basemodel_pipeline.progress import Progress


def stage(cfg: PipelineConfig, args: EntrypointArgs, progress: Progress) -> Mapping[str, Any]:
    options = {k: v for k, v in args.options.items() if k != "workers"}
    return run_embed(cfg, args.as_of, progress, **options)


if __name__ == "__main__":
    main("embed", stage, as_of=True, scoring=True)
