"""Hive through PyHive (HiveServer2 Thrift protocol); rows are converted to Arrow batches client-side."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from pyhive import hive
from sqlglot import exp
from thrift.transport.TTransport import TTransportException

from basemodel_pipeline.config.models import DataSource
from basemodel_pipeline.config.sources import HiveLocation
from basemodel_pipeline.retry import mentions
from basemodel_pipeline.sources.base import Backend
from basemodel_pipeline.sources.dbapi import cursor_reader
from basemodel_pipeline.sources.sql import table_from_name

HIVE_TYPES = {
    "BOOLEAN_TYPE": pa.bool_(),
    "TINYINT_TYPE": pa.int8(),
    "SMALLINT_TYPE": pa.int16(),
    "INT_TYPE": pa.int32(),
    "BIGINT_TYPE": pa.int64(),
    "FLOAT_TYPE": pa.float32(),
    "DOUBLE_TYPE": pa.float64(),
    "DECIMAL_TYPE": pa.float64(),
    "TIMESTAMP_TYPE": pa.timestamp("us"),
    "DATE_TYPE": pa.date32(),
    "BINARY_TYPE": pa.binary(),
}
AUTH_WORDS = ("sasl", "authentication", "login", "password", "credentials", "permission")


class HiveBackend(Backend):
    dialect = "hive"
    transient_types = (ConnectionError, TimeoutError)

    def __init__(self, src: DataSource, workspace: Path) -> None:
        super().__init__(src, workspace)
        self.location: HiveLocation = src.data_location  # type: ignore[assignment]
        p = self.location.connection_params
        self.con = hive.connect(
            host=p.host,
            port=p.port,
            username=p.username,
            password=p.password if p.auth in ("LDAP", "CUSTOM") else None,
            database=p.database,
            auth=p.auth,
            kerberos_service_name=p.kerberos_service_name,
        )

    def table(self) -> exp.Expression:
        table = table_from_name(self.location.table_name, self.dialect)
        if not table.db:
            table.set("db", exp.to_identifier(self.location.connection_params.database, quoted=True))
        return table

    def execute(self, sql: str) -> pa.RecordBatchReader:
        cursor = self.con.cursor()
        cursor.execute(sql)
        fields = [
            pa.field(name.split(".")[-1], HIVE_TYPES.get(code, pa.string()))
            for name, code, *_ in cursor.description
        ]
        return cursor_reader(cursor, pa.schema(fields))

    @classmethod
    def endpoint(cls, location: HiveLocation) -> str:
        return f"{location.connection_params.host}:{location.connection_params.port}"

    @classmethod
    def is_transient(cls, exc: BaseException) -> bool:
        text = str(exc).lower()
        if isinstance(exc, TTransportException):
            return not mentions(text, AUTH_WORDS)
        if isinstance(exc, hive.OperationalError):  # the server answered with an error status
            return mentions(text, ("timeout", "timed out", "unavailable", "too many"))
        return super().is_transient(exc)

    def close(self) -> None:
        self.con.close()
