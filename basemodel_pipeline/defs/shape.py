"""The graph's shape (which extract assets exist) comes from the config when Dagster loads the code.

If the config file does not exist yet (a fresh checkout before `make demo`), the graph takes its shape from
the demo config (transactions, products, demographics), so `dagster dev` always shows a complete graph; a
run then fails with "config file not found" until the file exists. A config that exists but is invalid is
an error at load time, shown by Dagster with the file, line and field.
"""

from __future__ import annotations

from pathlib import Path

from basemodel_pipeline.config import DataSource, PipelineConfig, load_config, parse_config
from basemodel_pipeline.demo import DEMO_CONFIG


def shape_config(config_path: str) -> PipelineConfig:
    """The config that gives the graph its shape (sources, first partition day)."""
    path = Path(config_path)
    if path.is_file():
        return load_config(path)
    return parse_config(DEMO_CONFIG, Path("demo_config.yaml"))


def data_sources(config_path: str) -> list[DataSource]:
    return list(shape_config(config_path).data_sources)
