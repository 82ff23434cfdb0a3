"""The graph's shape (which extract assets exist) comes from the config when Dagster loads the code.

Locally (BASEMODEL_ENV=local), if the config file does not exist yet (a fresh checkout before `make demo`),
the graph takes its shape from the demo config (transactions, products, demographics), so `dagster dev`
always shows a complete graph; a run then fails with "config file not found" until the file exists.
Anywhere else (ci, prod) a missing config fails the code location's load with one line: a misconfigured
deployment must not show the demo's graph. A config that exists but is invalid is an error at load time in
every environment, shown by Dagster with the file, line and field.
"""

from __future__ import annotations

from pathlib import Path

from basemodel_pipeline.config import DataSource, PipelineConfig, load_config, parse_config
from basemodel_pipeline.demo.datasets import DEMO_CONFIG
from basemodel_pipeline.errors import ConfigError


def shape_config(config_path: str, env: str = "local") -> PipelineConfig:
    """The config that gives the graph its shape (sources, first partition day); the demo's only locally."""
    path = Path(config_path)
    if path.is_file():
        return load_config(path)
    if env != "local":
        raise ConfigError(
            f"{path}: config file not found (BASEMODEL_CONFIG); BASEMODEL_ENV={env} never shows the demo graph "
            "(only local does): point BASEMODEL_CONFIG at the pipeline's YAML config"
        )
    return parse_config(DEMO_CONFIG, Path("demo_config.yaml"))


def data_sources(config_path: str) -> list[DataSource]:
    return list(shape_config(config_path).data_sources)
