"""Build (or reuse) the event cache: ``python -m basemodel_pipeline.entrypoints.cache --config PATH``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.entrypoints._common import EntrypointArgs, main
from basemodel_pipeline.pipeline import run_cache
from basemodel_pipeline.progress import Progress


def stage(cfg: PipelineConfig, args: EntrypointArgs, progress: Progress) -> Mapping[str, Any]:
    return run_cache(cfg, progress)


if __name__ == "__main__":
    main("cache", stage)
