"""Config models of data sources: where the data lives and which columns to read."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from basemodel_pipeline.config.base import IDENTIFIER, Strict


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
