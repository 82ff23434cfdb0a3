"""Config: pydantic models of the YAML file and its loader."""

from basemodel_pipeline.config.loader import data_fingerprint, load_config, parse_config
from basemodel_pipeline.config.models import (
    BinaryTarget,
    DataSource,
    MultilabelTarget,
    PipelineConfig,
    Scenario,
)

__all__ = [
    "BinaryTarget",
    "DataSource",
    "MultilabelTarget",
    "PipelineConfig",
    "Scenario",
    "data_fingerprint",
    "load_config",
    "parse_config",
]
