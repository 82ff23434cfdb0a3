"""Pydantic models of the YAML config (BaseModel-style data_sources / data_params / training_params / scenarios).

Every model forbids unknown keys, so a typo is reported with its YAML path instead of being ignored.
"""

from __future__ import annotations

from pydantic import Field, PrivateAttr, field_validator, model_validator

from basemodel_pipeline.config.base import IDENTIFIER, Strict
from basemodel_pipeline.config.gates import QualityGatesParams
from basemodel_pipeline.config.outputs import OutputsConfig
from basemodel_pipeline.config.params import (
    CacheParams,
    DataParams,
    FinetuneParams,
    FoundationParams,
    TrainingParams,
)
from basemodel_pipeline.config.retention import RetentionParams
from basemodel_pipeline.config.scenarios import (
    BinaryTarget,
    Condition,
    MulticlassTarget,
    MultilabelTarget,
    PythonTarget,
    RecommendationTarget,
    RegressionTarget,
    Scenario,
    Target,
)
from basemodel_pipeline.config.sources import (
    ColumnType,
    DataLocation,
    DataSource,
    DateColumn,
    JoinedDataSource,
)

__all__ = [
    "IDENTIFIER",
    "BinaryTarget",
    "CacheParams",
    "ColumnType",
    "Condition",
    "DataLocation",
    "DataParams",
    "DataSource",
    "DateColumn",
    "FinetuneParams",
    "FoundationParams",
    "JoinedDataSource",
    "MulticlassTarget",
    "MultilabelTarget",
    "PipelineConfig",
    "PythonTarget",
    "QualityGatesParams",
    "RecommendationTarget",
    "RegressionTarget",
    "RetentionParams",
    "Scenario",
    "Strict",
    "Target",
    "TrainingParams",
]


class PipelineConfig(Strict):
    workspace: str = Field(
        default="workspace", description="Artifact directory, relative to the config file."
    )
    data_sources: list[DataSource] = Field(min_length=1)
    data_params: DataParams
    training_params: TrainingParams = Field(default_factory=TrainingParams)
    cache: CacheParams = Field(default_factory=CacheParams)
    scenarios: list[Scenario] = Field(default_factory=list)
    outputs: OutputsConfig = Field(default_factory=OutputsConfig)
    retention: RetentionParams = Field(default_factory=RetentionParams)
    quality_gates: QualityGatesParams = Field(default_factory=QualityGatesParams)

    @property
    def longest_horizon_days(self) -> int:
        """The longest scenario target window (the foundation's horizon when there is no scenario): how far
        before the data's end `training_end_date: auto` puts the test split point."""
        horizons = [sc.target.horizon_days for sc in self.scenarios]
        return max(horizons, default=self.training_params.foundation.horizon_days)

    # the config file's directory (set by the loader; not a YAML key): relative paths were resolved against it
    _config_dir: str | None = PrivateAttr(default=None)

    @property
    def config_dir(self) -> str | None:
        """Absolute directory of the config file the paths were resolved against (None when unknown)."""
        return self._config_dir

    @field_validator("data_sources")
    @classmethod
    def _unique_names(cls, sources: list[DataSource]) -> list[DataSource]:
        names = [s.name for s in sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"data source names must be unique; repeated: {', '.join(dupes)}")
        if not any(s.type == "event" for s in sources):
            raise ValueError("at least one data source of type 'event' is required")
        if sum(s.type == "main_entity_attribute" for s in sources) > 1:
            raise ValueError("at most one data source of type 'main_entity_attribute' is allowed")
        return sources

    @model_validator(mode="after")
    def _references(self) -> PipelineConfig:
        by_name = {s.name: s for s in self.data_sources}
        for i, src in enumerate(self.data_sources):
            for j, join in enumerate(src.joined_data_sources):
                other = by_name.get(join.name)
                if other is None or other.type != "attribute":
                    raise ValueError(
                        f"data_sources[{i}].joined_data_sources[{j}].name: '{join.name}' is not an "
                        f"attribute data source (known attribute sources: {self._names('attribute')})"
                    )
        seen = set()
        for i, sc in enumerate(self.scenarios):
            if sc.name in seen:
                raise ValueError(f"scenarios[{i}].name: scenario '{sc.name}' is defined twice")
            seen.add(sc.name)
            src = by_name.get(sc.target.source)
            if src is None or src.type != "event":
                raise ValueError(
                    f"scenarios[{i}].target.source: '{sc.target.source}' is not an event data source "
                    f"(known: {self._names('event')})"
                )
        return self

    def _names(self, kind: str) -> str:
        return ", ".join(s.name for s in self.data_sources if s.type == kind) or "none"

    def sources(self, kind: str) -> list[DataSource]:
        return [s for s in self.data_sources if s.type == kind]

    def source(self, name: str) -> DataSource:
        for s in self.data_sources:
            if s.name == name:
                return s
        raise KeyError(name)

    def scenario(self, name: str) -> Scenario:
        for s in self.scenarios:
            if s.name == name:
                return s
        from basemodel_pipeline.errors import ConfigError

        known = ", ".join(s.name for s in self.scenarios) or "none"
        raise ConfigError(f"unknown scenario '{name}'; the config defines: {known}")
