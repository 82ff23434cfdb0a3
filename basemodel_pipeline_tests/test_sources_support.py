"""Helpers for the source tests: config edits, servers started once per test session on free ports, and a
minimal HiveServer2 (TCLIService) handler that runs each statement on DuckDB after transpiling it with sqlglot
(the Hive and Databricks tests serve it over a socket and over HTTP)."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlglot
import yaml

from basemodel_pipeline.config import load_config


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def resetting_server() -> Iterator[tuple[int, list[int]]]:
    """A server on 127.0.0.1 that accepts each connection and closes it at once (the client sees a reset);
    yields (port, one item per accepted connection)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[int] = []

    def drop_all() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            conn.close()

    threading.Thread(target=drop_all, daemon=True).start()
    try:
        yield listener.getsockname()[1], accepted
    finally:
        listener.close()


def edit_config(config: Path, mutate: Callable[[dict[str, Any]], None]) -> Path:
    raw = yaml.safe_load(config.read_text())
    mutate(raw)
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


def relocate(config: Path, locations: dict[str, dict[str, Any]], **source_fields: Any) -> Path:
    """Point the named sources of a config at new data_locations (and set extra fields on them)."""

    def mutate(raw: dict[str, Any]) -> None:
        for src in raw["data_sources"]:
            if src["name"] in locations:
                src["data_location"] = locations[src["name"]]
                src.update(source_fields.get(src["name"], {}))

    return edit_config(config, mutate)


def local_extract(config: Path, source: str) -> Any:
    """The extract of `source` from the local Parquet config, as one Arrow table sorted for comparison."""
    from basemodel_pipeline.pipeline import run_extract

    cfg = load_config(config)
    meta = run_extract(cfg, source)[source]
    return read_extract(meta["path"])


def read_extract(path: str | Path) -> Any:
    files = sorted(Path(path).glob("*.parquet"))
    table = pq.ParquetDataset(files).read() if files else None
    assert table is not None
    return table.sort_by([(c, "ascending") for c in table.column_names])


@pytest.fixture(scope="session")
def s3_server() -> Iterator[dict[str, Any]]:
    """moto's S3 server on 127.0.0.1 and a boto3 client for it."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing-secret-123"}
    client = boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1", **creds)
    try:
        yield {"endpoint": f"{host}:{port}", "client": client, **creds}
    finally:
        server.stop()


def sql_value(value: Any) -> Any:
    return value.isoformat(sep=" ") if hasattr(value, "isoformat") and not isinstance(value, str) else value


def load_tables(
    cursor: Any, data_dir: Path, names: list[str], types: dict[str, str], placeholder: str = "%s"
) -> None:
    """CREATE TABLE + INSERT every tiny-dataset Parquet table through a DB-API cursor (unquoted names)."""
    import pyarrow as pa

    for name in names:
        table = pq.read_table(data_dir / f"{name}.parquet")
        cols = []
        for field in table.schema:
            kind = (
                "TIMESTAMP"
                if pa.types.is_timestamp(field.type)
                else types["float"]
                if pa.types.is_floating(field.type)
                else types["int"]
                if pa.types.is_integer(field.type)
                else types["text"]
            )
            cols.append(f"{field.name} {kind}")
        cursor.execute(f"CREATE TABLE {name} ({', '.join(cols)})")
        rows = [tuple(sql_value(v) for v in row.values()) for row in table.to_pylist()]
        marks = ", ".join([placeholder] * table.num_columns)
        cursor.executemany(f"INSERT INTO {name} VALUES ({marks})", rows)


def hive_type(ttypes: Any, t: pa.DataType) -> int:
    if pa.types.is_integer(t):
        return ttypes.TTypeId.BIGINT_TYPE
    if pa.types.is_floating(t):
        return ttypes.TTypeId.DOUBLE_TYPE
    if pa.types.is_timestamp(t):
        return ttypes.TTypeId.TIMESTAMP_TYPE
    if pa.types.is_boolean(t):
        return ttypes.TTypeId.BOOLEAN_TYPE
    return ttypes.TTypeId.STRING_TYPE


def thrift_column(ttypes: Any, array: pa.ChunkedArray) -> Any:
    """A TColumn as HiveServer2 sends it: values plus a little-endian null bitmap."""
    values = array.to_pylist()
    nulls = bytearray((len(values) + 7) // 8)
    for i, v in enumerate(values):
        if v is None:
            nulls[i // 8] |= 1 << (i % 8)
    t = array.type
    if pa.types.is_integer(t):
        return ttypes.TColumn(i64Val=ttypes.TI64Column([v or 0 for v in values], bytes(nulls)))
    if pa.types.is_floating(t):
        return ttypes.TColumn(doubleVal=ttypes.TDoubleColumn([v or 0.0 for v in values], bytes(nulls)))
    if pa.types.is_boolean(t):
        return ttypes.TColumn(boolVal=ttypes.TBoolColumn([bool(v) for v in values], bytes(nulls)))
    text = [
        ("" if v is None else v.isoformat(sep=" ") if hasattr(v, "isoformat") else str(v)) for v in values
    ]
    return ttypes.TColumn(stringVal=ttypes.TStringColumn(text, bytes(nulls)))


def arrow_schema_bytes(table: pa.Table) -> bytes:
    """The schema message that starts an Arrow IPC stream."""
    return table.schema.serialize().to_pybytes()


class HiveServer2:
    """TCLIService handler: sessions, statements (Hive SQL run on DuckDB), result metadata, fetches."""

    def __init__(self, con: duckdb.DuckDBPyConnection, ttypes: Any) -> None:
        self.con = con
        self.ttypes = ttypes
        self.results: dict[bytes, tuple[pa.Table, int]] = {}
        self.lock = threading.Lock()
        self.ok = ttypes.TStatus(statusCode=ttypes.TStatusCode.SUCCESS_STATUS)

    def handle(self) -> Any:
        return self.ttypes.THandleIdentifier(guid=uuid.uuid4().bytes, secret=uuid.uuid4().bytes)

    def OpenSession(self, req: Any) -> Any:  # noqa: N802 - Thrift method names
        ttypes = self.ttypes
        return ttypes.TOpenSessionResp(
            status=self.ok,
            serverProtocolVersion=getattr(
                ttypes.TProtocolVersion, "SPARK_CLI_SERVICE_PROTOCOL_V8", req.client_protocol
            ),
            sessionHandle=ttypes.TSessionHandle(sessionId=self.handle()),
            **({"canUseMultipleCatalogs": True} if hasattr(ttypes, "TSparkRowSetType") else {}),
        )

    def CloseSession(self, req: Any) -> Any:  # noqa: N802
        ttypes = self.ttypes
        return ttypes.TCloseSessionResp(status=self.ok)

    def ExecuteStatement(self, req: Any) -> Any:  # noqa: N802
        ttypes = self.ttypes
        sql = req.statement
        op = self.handle()
        if sql.upper().startswith("USE "):
            return ttypes.TExecuteStatementResp(
                status=self.ok,
                operationHandle=ttypes.TOperationHandle(op, ttypes.TOperationType.EXECUTE_STATEMENT, False),
            )
        try:
            duck_sql = sqlglot.transpile(sql, read="hive", write="duckdb")[0]
            with self.lock:
                table = self.con.execute(duck_sql).to_arrow_table()
        except (duckdb.Error, sqlglot.errors.SqlglotError) as exc:
            message = f"Error while compiling statement: FAILED: SemanticException {str(exc).splitlines()[0]}"
            status = ttypes.TStatus(ttypes.TStatusCode.ERROR_STATUS, errorMessage=message, sqlState="42000")
            return ttypes.TExecuteStatementResp(status=status)
        self.results[op.guid] = (table, 0)
        return ttypes.TExecuteStatementResp(
            status=self.ok,
            operationHandle=ttypes.TOperationHandle(op, ttypes.TOperationType.EXECUTE_STATEMENT, True),
        )

    def GetOperationStatus(self, req: Any) -> Any:  # noqa: N802
        ttypes = self.ttypes
        return ttypes.TGetOperationStatusResp(
            status=self.ok, operationState=ttypes.TOperationState.FINISHED_STATE
        )

    def GetResultSetMetadata(self, req: Any) -> Any:  # noqa: N802
        ttypes = self.ttypes
        table, _ = self.results[req.operationHandle.operationId.guid]
        columns = [
            ttypes.TColumnDesc(
                columnName=f.name,
                typeDesc=ttypes.TTypeDesc(
                    [ttypes.TTypeEntry(primitiveEntry=ttypes.TPrimitiveTypeEntry(hive_type(ttypes, f.type)))]
                ),
                position=i + 1,
            )
            for i, f in enumerate(table.schema)
        ]
        extra = {}
        if hasattr(ttypes, "TSparkRowSetType"):  # Databricks: results as Arrow IPC batches
            extra = {
                "resultFormat": ttypes.TSparkRowSetType.ARROW_BASED_SET,
                "arrowSchema": arrow_schema_bytes(table),
            }
        return ttypes.TGetResultSetMetadataResp(status=self.ok, schema=ttypes.TTableSchema(columns), **extra)

    def FetchResults(self, req: Any) -> Any:  # noqa: N802
        ttypes = self.ttypes
        key = req.operationHandle.operationId.guid
        table, offset = self.results[key]
        chunk = table.slice(offset, req.maxRows)
        self.results[key] = (table, offset + chunk.num_rows)
        if hasattr(ttypes, "TSparkRowSetType"):
            batches = [
                ttypes.TSparkArrowBatch(batch=b.serialize().to_pybytes(), rowCount=b.num_rows)
                for b in chunk.to_batches()
            ]
            rows = ttypes.TRowSet(startRowOffset=offset, rows=[], arrowBatches=batches)
        else:
            columns = [thrift_column(ttypes, c) for c in chunk.columns]
            rows = ttypes.TRowSet(startRowOffset=offset, rows=[], columns=columns)
        extra = {}
        if getattr(req, "includeResultSetMetadata", None):
            extra["resultSetMetadata"] = self.GetResultSetMetadata(req)
        return ttypes.TFetchResultsResp(status=self.ok, hasMoreRows=chunk.num_rows > 0, results=rows, **extra)

    def CloseOperation(self, req: Any) -> Any:  # noqa: N802
        ttypes = self.ttypes
        self.results.pop(req.operationHandle.operationId.guid, None)
        return ttypes.TCloseOperationResp(status=self.ok)
