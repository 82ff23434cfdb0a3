"""Export foundation embeddings: ``python -m basemodel_pipeline.entrypoints.embed --config PATH [--as-of DATE]
[--precision P] [--output DESTINATION] [--device D] [--replay]``: one flag per field of
inference.options.EmbedOptions, the flags of `basemodel embed`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.entrypoints._common import EntrypointArgs, main
from basemodel_pipeline.inference.options import EmbedOptions
from basemodel_pipeline.pipeline import run_embed
from basemodel_pipeline.progress import Progress


def stage(cfg: PipelineConfig, args: EntrypointArgs, progress: Progress) -> Mapping[str, Any]:
    return run_embed(cfg, args.scoring, progress)


if __name__ == "__main__":
    main("embed", stage, scoring=EmbedOptions)
