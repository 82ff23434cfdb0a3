"""Databricks SQL warehouses and clusters through databricks-sql-connector: Arrow results (fetchmany_arrow)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from databricks import sql as dbsql
from databricks.sql import exc as dberr
from sqlglot import exp

from basemodel_pipeline.config.models import DataSource
from basemodel_pipeline.config.sources import DatabricksLocation
from basemodel_pipeline.retry import host_port, mentions
from basemodel_pipeline.sources.base import Backend
from basemodel_pipeline.sources.sql import table_from_name

BATCH_ROWS = 100_000
AUTH_WORDS = ("401", "403", "unauthorized", "forbidden", "invalid access token", "permission_denied")


class DatabricksBackend(Backend):
    dialect = "databricks"

    def __init__(self, src: DataSource, workspace: Path) -> None:
        super().__init__(src, workspace)
        self.location: DatabricksLocation = src.data_location  # type: ignore[assignment]
        p = self.location.connection_params
        kwargs: dict[str, Any] = {
            "server_hostname": p.server_hostname,
            "http_path": p.http_path,
            "access_token": p.access_token,
            "catalog": p.catalog,
            "schema": p.schema_name,
            "_retry_stop_after_attempts_count": 3,  # the connector's own retries; ours wrap them
            "enable_telemetry": False,  # no usage reports to Databricks from a data pipeline
        }
        if p.connection_uri:
            kwargs["_connection_uri"] = p.connection_uri
        self.con = dbsql.connect(**{k: v for k, v in kwargs.items() if v is not None})

    def table(self) -> exp.Expression:
        p = self.location.connection_params
        table = table_from_name(self.location.table_name, self.dialect)
        if not table.db and p.schema_name:
            table.set("db", exp.to_identifier(p.schema_name, quoted=True))
        if not table.catalog and p.catalog and table.db:
            table.set("catalog", exp.to_identifier(p.catalog, quoted=True))
        return table

    def execute(self, sql: str) -> pa.RecordBatchReader:
        cursor = self.con.cursor()
        cursor.execute(sql)
        first = cursor.fetchmany_arrow(BATCH_ROWS)
        schema = first.schema

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                table = first
                while table.num_rows:
                    yield from table.cast(schema).to_batches()
                    table = cursor.fetchmany_arrow(BATCH_ROWS)
            finally:
                cursor.close()

        return pa.RecordBatchReader.from_batches(schema, batches())

    @classmethod
    def endpoint(cls, location: DatabricksLocation) -> str | None:
        p = location.connection_params
        return host_port(p.connection_uri) or host_port(p.server_hostname, 443)

    @classmethod
    def is_transient(cls, exc: BaseException) -> bool:
        text = str(exc).lower()
        if isinstance(
            exc,
            dberr.ServerOperationError
            | dberr.ProgrammingError
            | dberr.NonRecoverableNetworkError
            | dberr.InvalidServerResponseError,
        ):
            return False
        if mentions(text, AUTH_WORDS):
            return False
        if isinstance(exc, dberr.RequestError | dberr.OperationalError):
            return True
        return super().is_transient(exc)

    def close(self) -> None:
        self.con.close()
