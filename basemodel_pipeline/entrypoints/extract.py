"""Extract data sources into <workspace>/extracts/.

python -m basemodel_pipeline.entrypoints.extract --config PATH [--source NAME]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.entrypoints._common import EntrypointArgs, main
from basemodel_pipeline.pipeline import run_extract
from basemodel_pipeline.progress import Progress


def stage(cfg: PipelineConfig, args: EntrypointArgs, progress: Progress) -> Mapping[str, Any]:
    if args.source is not None:
        names = [s.name for s in cfg.data_sources]
        if args.source not in names:
            from basemodel_pipeline.errors import ConfigError

            raise ConfigError(f"unknown data source '{args.source}'; the config defines: {', '.join(names)}")
    result = run_extract(cfg, args.source, progress)
    # one source: its own metadata; several: {source: {...}} flattened to "source.rows" etc.
    return result[args.source] if args.source else result


if __name__ == "__main__":
    main("extract", stage, source=True)
