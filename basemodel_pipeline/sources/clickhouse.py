"""ClickHouse through clickhouse-connect (HTTP): results stream as Arrow record batches (ArrowStream)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import clickhouse_connect
import pyarrow as pa
from clickhouse_connect.driver import exceptions as ch_errors
from sqlglot import exp

from basemodel_pipeline.config.models import DataSource
from basemodel_pipeline.config.sources import ClickHouseLocation
from basemodel_pipeline.sources.base import Backend
from basemodel_pipeline.sources.sql import table_from_name

# server error codes worth retrying: timeouts, network, overload, cancelled, too many parts/queries
TRANSIENT_CODES = {159, 160, 164, 202, 209, 210, 236, 241, 252, 394, 425, 439}
CODE = re.compile(r"Code: (\d+)")


CH_TYPES = {
    "String": "VARCHAR",
    "FixedString": "VARCHAR",
    "UUID": "VARCHAR",
    "Bool": "BOOLEAN",
    "Float32": "FLOAT",
    "Float64": "DOUBLE",
    "Date": "DATE",
    "Date32": "DATE",
}
WRAPPERS = re.compile(r"^(?:Nullable|LowCardinality)\((.*)\)$")


def duckdb_type(ch_type: str) -> str:
    """ClickHouse column type -> DuckDB type name (for column checks and date handling)."""
    while m := WRAPPERS.match(ch_type):
        ch_type = m.group(1)
    base = ch_type.split("(", 1)[0]
    if base.startswith("DateTime"):
        return "TIMESTAMP"
    if base.startswith(("Int", "UInt")):
        return "BIGINT"
    if base.startswith("Decimal"):
        return "DOUBLE"
    return CH_TYPES.get(base, "VARCHAR")


class ClickHouseBackend(Backend):
    dialect = "clickhouse"
    transient_types = (ConnectionError, TimeoutError, ch_errors.OperationalError)

    def __init__(self, src: DataSource, workspace: Path) -> None:
        super().__init__(src, workspace)
        self.location: ClickHouseLocation = src.data_location  # type: ignore[assignment]
        p = self.location.connection_params
        self.client = clickhouse_connect.get_client(
            host=p.host,
            port=p.port or (8443 if p.secure else 8123),
            username=p.username,
            password=p.password,
            database=p.database,
            secure=p.secure,
            connect_timeout=30,
            send_receive_timeout=600,
        )

    def table(self) -> exp.Expression:
        table = table_from_name(self.location.table_name, self.dialect)
        if not table.db:  # unqualified: the configured database
            table.set("db", exp.to_identifier(self.location.connection_params.database, quoted=True))
        return table

    def schema(self) -> dict[str, str]:
        """DESCRIBE TABLE, in DuckDB type names (Arrow output turns DateTime into a plain uint32)."""
        sql = f"DESCRIBE TABLE {self.table().sql(dialect=self.dialect, identify=True)}"
        rows = self.client.query(sql).result_rows
        return {name: duckdb_type(ch_type) for name, ch_type, *_ in rows}

    def execute(self, sql: str) -> pa.RecordBatchReader:
        stream = self.client.query_arrow_stream(sql)
        source = stream.__enter__()
        first = next(iter(source), None)
        schema = first.schema if first is not None else pa.schema([])

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                if first is not None:
                    yield first
                yield from source
            finally:
                stream.__exit__(None, None, None)

        if first is None:  # no rows: ClickHouse sends no batch, ask for the column types instead
            stream.__exit__(None, None, None)
            return pa.RecordBatchReader.from_batches(self._empty_schema(sql), iter(()))
        return pa.RecordBatchReader.from_batches(schema, batches())

    def _empty_schema(self, sql: str) -> pa.Schema:
        table = self.client.query_arrow(f"SELECT * FROM ({sql}) LIMIT 0")
        return table.schema

    @classmethod
    def endpoint(cls, location: ClickHouseLocation) -> str:
        p = location.connection_params
        return f"{p.host}:{p.port or (8443 if p.secure else 8123)}"

    @classmethod
    def is_transient(cls, exc: BaseException) -> bool:
        match = CODE.search(str(exc))
        if match:
            return int(match.group(1)) in TRANSIENT_CODES
        return super().is_transient(exc)

    def close(self) -> None:
        self.client.close()
