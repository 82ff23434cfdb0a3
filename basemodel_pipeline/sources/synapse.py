"""Azure Synapse (dedicated or serverless SQL pool) in T-SQL through mssql-python.

Driver choice: python-tds (pytds), a pure-Python TDS implementation: it installs from PyPI on any machine
with no system library. pyodbc needs unixODBC and msodbcsql from the OS; Microsoft's mssql-python bundles
its ODBC driver but that still needs libltdl7 from the OS ("Failed to load the driver" without it); pymssql
bundles FreeTDS but has no Entra ID token login. pytds does TLS (with pyOpenSSL) and takes an Entra ID
access token. Rows are converted to Arrow batches client-side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from sqlglot import exp

from basemodel_pipeline.config.models import DataSource
from basemodel_pipeline.config.sources import SynapseLocation, SynapseParams
from basemodel_pipeline.retry import mentions
from basemodel_pipeline.sources.base import Backend, arrow_to_duckdb_types
from basemodel_pipeline.sources.dbapi import cursor_reader
from basemodel_pipeline.sources.sql import table_from_name

SAMPLE_ROWS = 1000
# SQL Server error numbers: login failed / missing object / permission / syntax -> permanent
PERMANENT_WORDS = ("login failed", "invalid object name", "permission", "incorrect syntax", "18456", "28000")
TRANSIENT_NUMBERS = ("40613", "40197", "40501", "49918", "49919", "49920", "4060", "10928", "10929", "1205")


def connect_kwargs(p: SynapseParams) -> dict[str, Any]:
    """pytds.connect arguments. Holds the password or token: never log it."""
    kwargs: dict[str, Any] = {
        "server": p.server,
        "port": p.port,
        "database": p.database,
        "login_timeout": p.login_timeout_s,
        "timeout": 3600,
        "disable_connect_retry": True,  # retries are ours, with backoff
        "autocommit": True,
    }
    if p.access_token:
        token = p.access_token
        kwargs["access_token_callable"] = lambda: token
    else:
        kwargs["user"], kwargs["password"] = p.username, p.password
    if p.encrypt:
        import certifi

        kwargs["cafile"] = p.ca_file or certifi.where()
        kwargs["validate_host"] = True
    return kwargs


class SynapseBackend(Backend):
    dialect = "tsql"

    def __init__(self, src: DataSource, workspace: Path) -> None:
        super().__init__(src, workspace)
        self.location: SynapseLocation = src.data_location  # type: ignore[assignment]
        self.con = self.connect()

    def connect(self) -> Any:
        import pytds

        return pytds.connect(**connect_kwargs(self.location.connection_params))

    def table(self) -> exp.Expression:
        p = self.location.connection_params
        table = table_from_name(self.location.table_name, self.dialect)
        if not table.db:
            table.set("db", exp.to_identifier(p.schema_name, quoted=True))
        return table

    def schema(self) -> dict[str, str]:
        """Types from a sample of rows: T-SQL drivers describe columns only coarsely (NUMBER, DATETIME)."""
        sample = (
            exp.select(exp.Star())
            .from_(self.table())
            .limit(SAMPLE_ROWS)
            .sql(dialect=self.dialect, identify=True)
        )
        return arrow_to_duckdb_types(self.execute(sample).schema)

    def execute(self, sql: str) -> pa.RecordBatchReader:
        cursor = self.con.cursor()
        cursor.execute(sql)
        return cursor_reader(cursor)

    @classmethod
    def endpoint(cls, location: SynapseLocation) -> str:
        return f"{location.connection_params.server}:{location.connection_params.port}"

    @classmethod
    def is_transient(cls, exc: BaseException) -> bool:
        text = str(exc).lower()
        if mentions(text, PERMANENT_WORDS):
            return False
        if mentions(text, TRANSIENT_NUMBERS):
            return True
        if type(exc).__name__ in ("OperationalError", "ClosedConnectionError", "TimeoutError"):
            return "login" not in text  # network-level failures; LoginError is permanent
        if type(exc).__name__ == "LoginError":
            return False
        return super().is_transient(exc)

    def close(self) -> None:
        self.con.close()
