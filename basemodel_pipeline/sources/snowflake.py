"""Snowflake through snowflake-connector-python: results stream as Arrow batches (fetch_arrow_batches)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import snowflake.connector
from snowflake.connector import errors as sf_errors
from snowflake.connector.constants import FIELD_TYPES
from sqlglot import exp

from basemodel_pipeline.config.models import DataSource
from basemodel_pipeline.config.sources import SnowflakeLocation
from basemodel_pipeline.retry import connection_failure
from basemodel_pipeline.sources.base import Backend
from basemodel_pipeline.sources.sql import table_from_name

# login / authorization failures: retrying cannot help
AUTH_ERRNOS = {250001, 390100, 390101, 390102, 390144, 390189, 390190, 390318, 390422}


class SnowflakeBackend(Backend):
    dialect = "snowflake"
    transient_types = (ConnectionError, TimeoutError, sf_errors.RequestTimeoutError)

    def __init__(self, src: DataSource, workspace: Path) -> None:
        super().__init__(src, workspace)
        self.location: SnowflakeLocation = src.data_location  # type: ignore[assignment]
        p = self.location.connection_params
        kwargs = {
            "account": p.account,
            "user": p.user,
            "password": p.password,
            "private_key_file": p.private_key_file,
            "private_key_file_pwd": p.private_key_file_pwd,
            "authenticator": p.authenticator,
            "role": p.role,
            "warehouse": p.warehouse,
            "database": p.database,
            "schema": p.schema_name,
            "host": p.host,
            "port": p.port,
            "protocol": p.protocol,
            "login_timeout": 60,
            "session_parameters": {"TIMEZONE": "UTC", "CLIENT_OUT_OF_BAND_TELEMETRY_ENABLED": False},
        }
        self.con = snowflake.connector.connect(**{k: v for k, v in kwargs.items() if v is not None})

    def table(self) -> exp.Expression:
        return table_from_name(self.location.table_name, self.dialect)

    def execute(self, sql: str) -> pa.RecordBatchReader:
        cur = self.con.cursor()
        cur.execute(sql)
        schema = pa.schema([pa.field(d.name, FIELD_TYPES[d.type_code].pa_type(d)) for d in cur.description])

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                for table in cur.fetch_arrow_batches():
                    # chunks may use narrower types than the result's declared ones: cast to one schema
                    yield from table.rename_columns(schema.names).cast(schema).to_batches()
            finally:
                cur.close()

        return pa.RecordBatchReader.from_batches(schema, batches())

    @classmethod
    def endpoint(cls, location: SnowflakeLocation) -> str:
        p = location.connection_params
        host = p.host or f"{p.account}.snowflakecomputing.com"
        return f"{host}:{p.port or (443 if p.protocol == 'https' else 80)}"

    @classmethod
    def is_transient(cls, exc: BaseException) -> bool:
        # 250001 is the connector's code for any failed login: a refused or timed-out connection and a 502/504
        # under it are worth retrying; a 403 (wrong account) or a rejected login is not
        if connection_failure(exc) is not None or "service is unavailable" in str(exc).lower():
            return True
        errno = getattr(exc, "errno", None)
        if errno in AUTH_ERRNOS or isinstance(exc, sf_errors.ProgrammingError):
            return False
        if (
            isinstance(exc, sf_errors.OperationalError | sf_errors.InterfaceError)
            and errno not in AUTH_ERRNOS
        ):
            return "password" not in str(exc).lower()
        return super().is_transient(exc)

    def close(self) -> None:
        self.con.close()
