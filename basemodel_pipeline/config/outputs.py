"""Config models of output destinations: where predictions and embeddings are written.

    outputs:
      default: warehouse                 # optional; without it: Parquet in the workspace
      destinations:
        warehouse:
          kind: snowflake
          connection_params: {...}       # the same parameters as a Snowflake data source
          table_prefix: BASEMODEL_
        scores_csv: {kind: csv, path: exports}

The built-in destinations `parquet`, `csv` and `tsv` (files in the workspace) exist unless redefined.
"""

from __future__ import annotations

from string import Formatter
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from basemodel_pipeline.config.base import Name, Strict
from basemodel_pipeline.config.sources import (
    BigQueryParams,
    ClickHouseParams,
    DatabricksParams,
    SnowflakeParams,
)

LOCAL_KINDS = ("parquet", "csv", "tsv")
WAREHOUSE_KINDS = ("snowflake", "bigquery", "databricks", "clickhouse")
OUTPUT_KINDS = LOCAL_KINDS + WAREHOUSE_KINDS


class FileOutput(Strict):
    kind: Literal["parquet", "csv", "tsv"]
    path: str | None = Field(
        default=None,
        description="Root directory of the files; default the workspace. Relative paths are relative to the "
        "workspace. Files land in <path>/predictions/<scenario>/<as_of>/ and <path>/embeddings/<as_of>/.",
    )
    compression: Literal["zstd", "snappy", "gzip", "none"] = Field(
        default="zstd", description="Parquet only."
    )


TABLE_PLACEHOLDERS = ("dataset", "scenario")


def check_table_template(template: str) -> None:
    """ValueError unless `template` uses only the plain placeholders {dataset} and {scenario} (no attribute,
    index, conversion or format spec: a table name template must not reach into Python objects)."""
    allowed = " and ".join(f"{{{p}}}" for p in TABLE_PLACEHOLDERS)
    try:
        fields = [(f, conv, spec) for _, f, spec, conv in Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise ValueError(
            f"not a valid template ({exc}): only the placeholders {allowed} may be used, and {{{{ }}}} for "
            "literal braces"
        ) from None
    for field, conversion, spec in fields:
        if field not in TABLE_PLACEHOLDERS or conversion or spec:
            written = f"{{{field}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}"
            raise ValueError(
                f"{written} is not allowed: only the placeholders {allowed} may be used, as they are "
                "(no attributes, indexes, conversions or format specs)"
            )


class WarehouseOutput(Strict):
    table: str | None = Field(
        default=None,
        description="Table to write, optionally qualified (db.schema.table) and with the placeholders "
        "{dataset} (predictions | embeddings) and {scenario}. Default: <table_prefix>predictions_<scenario> "
        "and <table_prefix>embeddings in the connection's database/schema.",
    )
    table_prefix: str = Field(default="basemodel_", description="Prefix of the default table names.")
    mode: Literal["create_or_append"] = Field(
        default="create_or_append",
        description="Create the table if missing, then replace the rows of the (scenario, as_of) being "
        "written in one step; other dates and scenarios are kept.",
    )

    @field_validator("table")
    @classmethod
    def _placeholders(cls, table: str | None) -> str | None:
        if table is not None:
            check_table_template(table)
        return table

    def table_name(self, dataset: str, scenario: str | None) -> str:
        if self.table is not None:
            return self.table.format(dataset=dataset, scenario=scenario or "")
        if dataset == "predictions":
            return f"{self.table_prefix}predictions_{scenario}"
        return f"{self.table_prefix}{dataset}"


class SnowflakeOutput(WarehouseOutput):
    kind: Literal["snowflake"]
    connection_params: SnowflakeParams


class BigQueryOutput(WarehouseOutput):
    kind: Literal["bigquery"]
    connection_params: BigQueryParams


class DatabricksOutput(WarehouseOutput):
    kind: Literal["databricks"]
    connection_params: DatabricksParams


class ClickHouseOutput(WarehouseOutput):
    kind: Literal["clickhouse"]
    connection_params: ClickHouseParams


OutputDestination = Annotated[
    FileOutput | SnowflakeOutput | BigQueryOutput | DatabricksOutput | ClickHouseOutput,
    Field(discriminator="kind"),
]


class OutputsConfig(Strict):
    default: str | None = Field(
        default=None, description="Name of the destination used when none is given; default: parquet."
    )
    destinations: dict[Name, OutputDestination] = Field(
        default_factory=dict, description="Named destinations; parquet, csv and tsv exist unless redefined."
    )

    @model_validator(mode="after")
    def _default_exists(self) -> OutputsConfig:
        if self.default is not None and self.default not in self.names():
            raise ValueError(
                f"default: '{self.default}' is not a destination (known: {', '.join(self.names())})"
            )
        return self

    def names(self) -> list[str]:
        return sorted(set(LOCAL_KINDS) | set(self.destinations))

    def destination(self, name: str | None) -> tuple[str, OutputDestination]:
        """(name, destination) for a name, the configured default, or Parquet in the workspace."""
        name = name or self.default or "parquet"
        if name in self.destinations:
            return name, self.destinations[name]
        if name in LOCAL_KINDS:
            return name, FileOutput(kind=name)  # type: ignore[arg-type]
        from basemodel_pipeline.errors import ConfigError

        raise ConfigError(
            f"unknown output destination '{name}'; known: {', '.join(self.names())} "
            "(define it under outputs.destinations in the config)"
        )
