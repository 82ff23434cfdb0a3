"""Pydantic models of the YAML config (BaseModel-style data_sources / data_params / training_params / scenarios).

Every model forbids unknown keys, so a typo is reported with its YAML path instead of being ignored.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]*$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataLocation(Strict):
    database_type: Literal["parquet"] = Field(
        description="Where the data lives. Other backends arrive with the connectors issue."
    )
    path: str = Field(description="File, directory or glob; relative paths are relative to the config file.")


class DateColumn(Strict):
    name: str
    format: str | None = Field(
        default=None,
        description="strptime format when the column is stored as text, e.g. '%Y-%m-%d %H:%M:%S'. "
        "Leave empty for DATE/TIMESTAMP columns.",
    )


class JoinedDataSource(Strict):
    name: str = Field(description="Name of an `attribute` data source.")
    join_on: dict[str, str] = Field(
        min_length=1, description="Mapping {column in this source: column in the joined source}."
    )


ColumnType = Literal["categorical", "numeric", "ignore"]


class DataSource(Strict):
    type: Literal["event", "main_entity_attribute", "attribute"]
    name: Annotated[str, Field(pattern=IDENTIFIER)]
    data_location: DataLocation
    main_entity_column: str | None = None
    date_column: DateColumn | None = None
    allowed_columns: list[str] | None = None
    disallowed_columns: list[str] | None = None
    where_condition: str | None = Field(default=None, description="SQL boolean expression on the source.")
    joined_data_sources: list[JoinedDataSource] = Field(default_factory=list)
    column_types: dict[str, ColumnType] = Field(
        default_factory=dict, description="Override the inferred type of a column."
    )

    @model_validator(mode="after")
    def _check_kind(self) -> DataSource:
        if self.allowed_columns is not None and self.disallowed_columns is not None:
            raise ValueError("set allowed_columns or disallowed_columns, not both")
        if self.type in ("event", "main_entity_attribute") and not self.main_entity_column:
            raise ValueError(f"a data source of type '{self.type}' needs main_entity_column")
        if self.type == "event" and self.date_column is None:
            raise ValueError("a data source of type 'event' needs date_column {name, format}")
        if self.type != "event" and self.date_column is not None:
            raise ValueError(f"date_column is only for event sources, not type '{self.type}'")
        if self.type != "event" and self.joined_data_sources:
            raise ValueError("joined_data_sources is only for event sources")
        return self

    def key_columns(self) -> list[str]:
        """Columns the pipeline needs regardless of allowed/disallowed columns."""
        cols = [c for c in (self.main_entity_column,) if c]
        if self.date_column is not None:
            cols.append(self.date_column.name)
        for join in self.joined_data_sources:
            cols.extend(join.join_on)
        return cols


class DataParams(Strict):
    data_start_date: dt.date = Field(description="Events before this date are ignored.")
    training_start_date: dt.date | None = Field(
        default=None,
        description="First split point for training examples (default: data_start_date + 28 days).",
    )
    validation_start_date: dt.date = Field(description="Split points from this date on are validation only.")
    training_end_date: dt.date = Field(
        description="No training or validation target window extends past this date; the test split point."
    )
    split_interval_days: int = Field(default=7, gt=0, description="Days between scenario split points.")

    @property
    def first_split(self) -> dt.date:
        return self.training_start_date or self.data_start_date + dt.timedelta(days=28)

    @property
    def test_date(self) -> dt.date:
        return self.training_end_date

    @model_validator(mode="after")
    def _ordered(self) -> DataParams:
        order = [
            ("data_start_date", self.data_start_date),
            ("training_start_date", self.first_split),
            ("validation_start_date", self.validation_start_date),
            ("training_end_date", self.training_end_date),
        ]
        for (a, da), (b, db) in zip(order, order[1:], strict=False):
            if not da < db:
                raise ValueError(f"{a} ({da}) must be before {b} ({db})")
        return self


class FoundationParams(Strict):
    horizon_days: int = Field(default=28, gt=0, description="Future window the foundation model predicts.")
    half_lives_days: list[float] = Field(default=[7.0, 30.0, 120.0], min_length=1)
    sketch_partitions: int = Field(
        default=4, gt=0, description="Hash partitions per high-cardinality column."
    )
    sketch_width: int = Field(default=32, gt=1, description="Buckets per partition.")
    max_direct_vocab: int = Field(
        default=64, gt=0, description="Columns with at most this many values are counted per value."
    )
    aggregate_features: bool = Field(
        default=True,
        description="Append automatic windowed aggregates (counts, sums, recency...) to the sketches.",
    )
    hidden_dim: int = Field(default=512, gt=0)
    num_blocks: int = Field(default=2, gt=0)
    dropout: float = Field(default=0.1, ge=0.0, lt=1.0)
    epochs: int = Field(default=4, gt=0)
    split_points_per_entity: int = Field(
        default=8, gt=0, description="Random split points per entity per epoch."
    )
    batch_size: int = Field(default=256, gt=0)
    learning_rate: float = Field(default=1e-3, gt=0)
    weight_decay: float = Field(default=1e-4, ge=0)
    warmup_steps: int = Field(default=50, ge=0)
    validation_entities: int = Field(
        default=20000, gt=0, description="Entities sampled for the foundation's validation loss."
    )
    checkpoint_every_steps: int = Field(
        default=200,
        ge=0,
        description="Save a resumable training state every N steps (0: off).",
    )
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"


class FinetuneParams(Strict):
    epochs: int = Field(default=12, gt=0)
    batch_size: int = Field(default=256, gt=0)
    learning_rate: float = Field(default=1e-3, gt=0)
    weight_decay: float = Field(default=1e-4, ge=0)
    patience: int = Field(
        default=3, gt=0, description="Epochs without validation improvement before stopping."
    )
    mode: Literal["full", "frozen"] = Field(
        default="frozen",
        description="frozen: train only the head on the foundation trunk (best on small data); full: fine-tune all.",
    )
    seed: int = 0


class TrainingParams(Strict):
    foundation: FoundationParams = Field(default_factory=FoundationParams)
    finetune: FinetuneParams = Field(default_factory=FinetuneParams)


class BinaryTarget(Strict):
    """Positive when an entity has any (event: any) or no (event: none) event of `source` in the window."""

    kind: Literal["binary"] = "binary"
    source: str
    event: Literal["any", "none"] = "any"
    horizon_days: int = Field(gt=0)
    active_in_last_days: int | None = Field(
        default=None,
        gt=0,
        description="Population: only entities with an event in this many days before the split.",
    )


class MultilabelTarget(Strict):
    """One label per value of `column`: did the entity have an event with that value in the window."""

    kind: Literal["multilabel"] = "multilabel"
    source: str
    column: str
    horizon_days: int = Field(gt=0)
    min_positive_entities: int = Field(
        default=50, gt=0, description="Keep values with at least this many positive entities in training."
    )


Target = Annotated[BinaryTarget | MultilabelTarget, Field(discriminator="kind")]


class Scenario(Strict):
    name: Annotated[str, Field(pattern=IDENTIFIER)]
    task: Literal["binary", "multilabel"]
    target: Target

    @model_validator(mode="after")
    def _task_matches_target(self) -> Scenario:
        if self.task != self.target.kind:
            raise ValueError(
                f"task '{self.task}' needs a target of kind '{self.task}', got '{self.target.kind}'"
            )
        return self


class PipelineConfig(Strict):
    workspace: str = Field(
        default="workspace", description="Artifact directory, relative to the config file."
    )
    data_sources: list[DataSource] = Field(min_length=1)
    data_params: DataParams
    training_params: TrainingParams = Field(default_factory=TrainingParams)
    scenarios: list[Scenario] = Field(default_factory=list)

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
