"""Config models of data sources: where the data lives and which columns to read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import Field, model_validator

from basemodel_pipeline.config.base import ColumnName, Name, Strict

SECRET = "Secret: write ${ENV_VAR} and export it; never put the value in the file."


class S3Options(Strict):
    """Where and how to reach S3 (or an S3-compatible store). Unset fields come from the AWS_* variables."""

    endpoint: str | None = Field(
        default=None, description="host:port of an S3-compatible endpoint (MinIO, moto); default AWS."
    )
    region: str | None = Field(default=None, description="Default: AWS_REGION or AWS_DEFAULT_REGION.")
    access_key_id: str | None = Field(default=None, description="Default: AWS_ACCESS_KEY_ID.")
    secret_access_key: str | None = Field(
        default=None, description=f"Default: AWS_SECRET_ACCESS_KEY. {SECRET}", exclude=True
    )
    session_token: str | None = Field(default=None, description="Default: AWS_SESSION_TOKEN.", exclude=True)
    use_ssl: bool = True
    url_style: Literal["vhost", "path"] = "vhost"


class ParquetLocation(Strict):
    database_type: Literal["parquet"]
    path: str = Field(
        description="File, directory or glob, local or s3://bucket/prefix; relative paths are relative to "
        "the config file."
    )
    s3: S3Options = Field(default_factory=S3Options, description="Only for s3:// paths.")
    engine: Literal["auto", "duckdb", "pyarrow"] = Field(
        default="auto",
        description="s3:// reader: DuckDB httpfs (installed offline from the duckdb-extension-httpfs wheel) "
        "or pyarrow's S3 filesystem; auto tries httpfs and falls back to pyarrow.",
    )
    cache_path: str | None = Field(
        default=None,
        description="Local directory: s3:// files are copied here and read locally; later runs copy only "
        "new or changed files.",
    )

    def display(self) -> str:
        return self.path

    def resolved(self, absolute: Callable[[str], str]) -> ParquetLocation:
        """Local paths made absolute (relative to the config file's directory)."""
        cache = absolute(self.cache_path) if self.cache_path else None
        return self.model_copy(update={"path": absolute(self.path), "cache_path": cache})


class WarehouseLocation(Strict):
    table_name: str = Field(description="Table or view to read; qualify it as the warehouse expects.")

    def display(self) -> str:
        return f"{self.database_type}:{self.table_name}"  # type: ignore[attr-defined]

    def resolved(self, absolute: Callable[[str], str]) -> WarehouseLocation:
        return self


class SnowflakeParams(Strict):
    account: str
    user: str
    password: str | None = Field(default=None, description=SECRET, exclude=True)
    private_key_file: str | None = Field(default=None, description="Key-pair auth instead of a password.")
    private_key_file_pwd: str | None = Field(default=None, description=SECRET, exclude=True)
    authenticator: str | None = None
    role: str | None = None
    warehouse: str | None = None
    database: str
    schema_name: str = Field(alias="schema")
    host: str | None = Field(default=None, description="Only for proxies/emulators; default from account.")
    port: int | None = None
    protocol: Literal["https", "http"] = "https"


class SnowflakeLocation(WarehouseLocation):
    database_type: Literal["snowflake"]
    connection_params: SnowflakeParams


class BigQueryParams(Strict):
    project_id: str
    dataset_id: str
    credentials_path: str | None = Field(
        default=None, description="Service-account JSON; default: application default credentials."
    )
    location: str | None = None
    billing_project_id: str | None = Field(default=None, description="Project billed for queries.")
    api_endpoint: str | None = Field(default=None, description="Only for emulators: http://host:port.")
    storage_api_endpoint: str | None = Field(
        default=None, description="Only for emulators: host:port of the Storage Read API (plain gRPC)."
    )
    storage_api: bool = Field(default=True, description="Read results through the BigQuery Storage Read API.")


class BigQueryLocation(WarehouseLocation):
    database_type: Literal["bigquery"]
    connection_params: BigQueryParams


class DatabricksParams(Strict):
    server_hostname: str
    http_path: str
    access_token: str = Field(description=SECRET, exclude=True)
    catalog: str | None = None
    schema_name: str | None = Field(default=None, alias="schema")
    connection_uri: str | None = Field(
        default=None, description="Only for proxies and test servers: full http(s)://host:port/path."
    )


class DatabricksLocation(WarehouseLocation):
    database_type: Literal["databricks"]
    connection_params: DatabricksParams


class SynapseParams(Strict):
    server: str = Field(description="e.g. myworkspace.sql.azuresynapse.net")
    port: int = 1433
    database: str
    schema_name: str = Field(default="dbo", alias="schema")
    username: str | None = None
    password: str | None = Field(default=None, description=SECRET, exclude=True)
    access_token: str | None = Field(
        default=None,
        description=f"Microsoft Entra ID access token instead of a password. {SECRET}",
        exclude=True,
    )
    encrypt: bool = True
    ca_file: str | None = Field(default=None, description="CA bundle for TLS; default: certifi's bundle.")
    login_timeout_s: int = 30


class SynapseLocation(WarehouseLocation):
    database_type: Literal["synapse"]
    connection_params: SynapseParams


class HiveParams(Strict):
    host: str
    port: int = 10000
    username: str | None = None
    password: str | None = Field(default=None, description=SECRET, exclude=True)
    database: str = "default"
    auth: Literal["NONE", "NOSASL", "LDAP", "CUSTOM", "KERBEROS"] = "NONE"
    kerberos_service_name: str | None = None


class HiveLocation(WarehouseLocation):
    database_type: Literal["hive"]
    connection_params: HiveParams


class ClickHouseParams(Strict):
    host: str
    port: int | None = Field(default=None, description="HTTP(S) port; default 8123, or 8443 with secure.")
    username: str = "default"
    password: str = Field(default="", description=SECRET, exclude=True)
    database: str = "default"
    secure: bool = False


class ClickHouseLocation(WarehouseLocation):
    database_type: Literal["clickhouse"]
    connection_params: ClickHouseParams


DataLocation = Annotated[
    ParquetLocation
    | SnowflakeLocation
    | BigQueryLocation
    | DatabricksLocation
    | SynapseLocation
    | HiveLocation
    | ClickHouseLocation,
    Field(discriminator="database_type"),
]
DATABASE_TYPES = ("parquet", "snowflake", "bigquery", "databricks", "synapse", "hive", "clickhouse")


class SqlLambda(Strict):
    alias: Name = Field(description="Name of the computed column.")
    expression: str = Field(description="One SQL expression in the source's dialect, e.g. price * quantity.")


class DateColumn(Strict):
    name: ColumnName
    format: str | None = Field(
        default=None,
        description="strptime format when the column is stored as text, e.g. '%Y-%m-%d %H:%M:%S'. "
        "Leave empty for DATE/TIMESTAMP columns.",
    )


class JoinedDataSource(Strict):
    name: ColumnName = Field(description="Name of an `attribute` data source.")
    join_on: dict[ColumnName, ColumnName] = Field(
        min_length=1, description="Mapping {column in this source: column in the joined source}."
    )


ColumnType = Literal["categorical", "numeric", "ignore"]


class DataSource(Strict):
    type: Literal["event", "main_entity_attribute", "attribute"]
    name: Name
    data_location: DataLocation
    main_entity_column: ColumnName | None = None
    date_column: DateColumn | None = None
    allowed_columns: list[ColumnName] | None = None
    disallowed_columns: list[ColumnName] | None = None
    where_condition: str | None = Field(
        default=None, description="SQL boolean expression on the source, in the source's dialect."
    )
    sql_lambdas: list[SqlLambda] = Field(
        default_factory=list, description="Computed columns: [{alias, expression}], evaluated in the source."
    )
    joined_data_sources: list[JoinedDataSource] = Field(default_factory=list)
    column_types: dict[ColumnName, ColumnType] = Field(
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

    def keeps(self, column: str) -> bool:
        """Whether a column of this source's extract is one the config selects (keys, computed columns,
        allowed or not disallowed): extracts written under an older config may hold columns dropped since."""
        name = column.lower()
        always = {c.lower() for c in self.key_columns()} | {lam.alias.lower() for lam in self.sql_lambdas}
        if name in always:
            return True
        if self.allowed_columns is not None:
            return name in {c.lower() for c in self.allowed_columns}
        return name not in {c.lower() for c in self.disallowed_columns or []}

    def key_columns(self) -> list[str]:
        """Columns the pipeline needs regardless of allowed/disallowed columns."""
        cols = [c for c in (self.main_entity_column,) if c]
        if self.date_column is not None:
            cols.append(self.date_column.name)
        for join in self.joined_data_sources:
            cols.extend(join.join_on)
        return cols
