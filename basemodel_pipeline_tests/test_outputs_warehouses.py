"""Write-back to warehouse tables against the engines the connectors are tested on: Snowflake on fakesnow's
server (the real connector over HTTP), BigQuery on bqemulator (REST), ClickHouse on chdb behind ClickHouse's
HTTP interface (the real clickhouse-connect client, Arrow inserts), Databricks through the real
databricks-sql-connector against a TCLIService server that runs the Databricks SQL on DuckDB after sqlglot
transpiles it. Each: two writes of the same (scenario, as_of) leave one copy, another as_of appends, an
aborted write changes nothing, and the connection's secret never shows in an error."""

from __future__ import annotations

import datetime as dt
import http.server
import re
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from test_outputs import chunks, predictions
from test_sources_bigquery import PROJECT, bigquery_server  # noqa: F401
from test_sources_support import edit_config

from basemodel_pipeline.config import DataSource, load_config
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.outputs import open_writer, write_table
from basemodel_pipeline.sources import backend_class

DAY1, DAY2 = dt.date(2024, 3, 1), dt.date(2024, 3, 2)


def with_output(tiny_config: Path, kind: str, params: dict[str, Any], **extra: Any) -> Any:
    def mutate(raw: dict[str, Any]) -> None:
        raw["outputs"] = {
            "default": "warehouse",
            "destinations": {"warehouse": {"kind": kind, "connection_params": params, **extra}},
        }

    return load_config(edit_config(tiny_config, mutate))


def with_table(cfg: Any, table: str) -> Any:
    """The config with the warehouse destination writing to one fixed table."""
    out = cfg.model_copy(deep=True)
    dest = out.outputs.destinations["warehouse"]
    out.outputs.destinations["warehouse"] = dest.model_copy(update={"table": table})
    return out


def read_table(cfg: Any, table: str) -> list[dict[str, Any]]:
    """Every row of a written table, read back through the connector of the same warehouse."""
    dest = cfg.outputs.destinations["warehouse"]
    location = {"database_type": dest.kind, "table_name": table, "connection_params": dest.connection_params}
    src = DataSource(type="attribute", name="check", data_location=location)
    with backend_class(dest.kind)(src, Path(cfg.workspace)) as backend:
        sql = f"SELECT * FROM {backend.table().sql(dialect=backend.dialect, identify=True)}"
        rows = backend.execute(sql).read_all().to_pylist()
    rows = [{k.lower(): v for k, v in r.items()} for r in rows]
    return sorted(rows, key=lambda r: (str(r["scenario"]), str(r["as_of"]), r["entity_id"]))


def as_date(value: Any) -> dt.date:
    return value.date() if isinstance(value, dt.datetime) else value


def check_contract(cfg: Any, secret: str | None = None) -> None:
    """Create, re-run (no duplicates), append another day, abort (no change), empty write, embeddings."""
    first = predictions(300, seed=0)
    info = write_table(open_writer(cfg, "predictions", "churn", DAY1), chunks(first, 120))
    assert info["rows"] == 300 and info["format"] == cfg.outputs.destinations["warehouse"].kind
    table = info["table"]
    rows = read_table(cfg, table)
    assert len(rows) == 300
    assert {"entity_id", "as_of", "score", "scenario", "written_at"} <= set(rows[0])
    assert {r["scenario"] for r in rows} == {"churn"} and {as_date(r["as_of"]) for r in rows} == {DAY1}
    assert np.allclose([r["score"] for r in rows], first.column("score").to_numpy(), atol=1e-6)

    rerun = predictions(250, seed=1)
    write_table(open_writer(cfg, "predictions", "churn", DAY1), chunks(rerun, 100))
    rows = read_table(cfg, table)
    assert len(rows) == 250, "a re-run of the same (scenario, as_of) must replace its rows"
    assert np.allclose([r["score"] for r in rows], rerun.column("score").to_numpy(), atol=1e-6)

    day2 = predictions(40, seed=2).set_column(1, "as_of", pa.array([DAY2] * 40, pa.date32()))
    write_table(open_writer(cfg, "predictions", "churn", DAY2), [day2])
    rows = read_table(cfg, table)
    assert len(rows) == 290 and sum(as_date(r["as_of"]) == DAY2 for r in rows) == 40

    writer = open_writer(cfg, "predictions", "churn", DAY1)
    writer.write(predictions(7, seed=3))
    writer.abort()
    assert len(read_table(cfg, table)) == 290, "an aborted write must not change the table"

    # a shared table (no {scenario} in its name): scenarios are slices of it
    shared = with_table(cfg, "shared_scores")
    write_table(open_writer(shared, "predictions", "churn", DAY1), [predictions(5)])
    write_table(open_writer(shared, "predictions", "upsell", DAY1), [predictions(6)])
    write_table(open_writer(shared, "predictions", "churn", DAY1), [])  # no rows: the slice becomes empty
    rows = read_table(shared, "shared_scores")
    assert [r["scenario"] for r in rows] == ["upsell"] * 6

    # recommendations (rank, item) and embeddings (a float vector per entity, scenario NULL)
    recs = pa.table(
        {
            "entity_id": pa.array([1, 1, 2, 2], pa.int64()),
            "as_of": pa.array([DAY1] * 4, pa.date32()),
            "rank": pa.array([1, 2, 1, 2], pa.int32()),
            "item": ["milk", "it's 'quoted'", "bread", "milk"],
            "score": pa.array([0.9, 0.5, 0.8, 0.1], pa.float32()),
        }
    )
    info = write_table(open_writer(cfg, "predictions", "next_basket", DAY1), [recs])
    rows = read_table(cfg, info["table"])
    assert [(r["entity_id"], r["rank"], r["item"]) for r in rows] == [
        (1, 1, "milk"),
        (1, 2, "it's 'quoted'"),
        (2, 1, "bread"),
        (2, 2, "milk"),
    ] or sorted((r["entity_id"], r["rank"], r["item"]) for r in rows) == [
        (1, 1, "milk"),
        (1, 2, "it's 'quoted'"),
        (2, 1, "bread"),
        (2, 2, "milk"),
    ]
    emb = np.arange(12, dtype=np.float32).reshape(3, 4) / 8
    embeddings = pa.table(
        {
            "entity_id": pa.array([10, 11, 12], pa.int64()),
            "as_of": pa.array([DAY1] * 3, pa.date32()),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), 4),
        }
    )
    for _ in range(2):
        info = write_table(open_writer(cfg, "embeddings", None, DAY1), [embeddings])
    rows = read_table(cfg, info["table"])
    assert len(rows) == 3 and all(r["scenario"] is None for r in rows)
    got = [r["embedding"] for r in rows]
    got = [np.array(v if not isinstance(v, str) else __import__("json").loads(v), float) for v in got]
    assert np.allclose(np.stack(got), emb)


# ---- ClickHouse ---------------------------------------------------------------------------------------
CH_PASSWORD = "ch-Out-Secret-3"
INSERT = re.compile(r"^\s*INSERT INTO (.+?)(\s*\([^)]*\))?\s+FORMAT (Arrow\w*)\s*$", re.S | re.I)


def clickhouse_http(session: Any, spool: Path) -> http.server.ThreadingHTTPServer:
    """ClickHouse's HTTP interface in front of chdb, with INSERT ... FORMAT Arrow bodies (binary) read
    from a spooled file, as clickhouse-connect's insert_arrow sends them."""
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def handle_one(self) -> None:
            params = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            query = params.get("query", [""])[0]
            if CH_PASSWORD not in (self.headers.get("X-ClickHouse-Key") or "") + self.basic_password():
                return self.reply(
                    403, b"Code: 516. DB::Exception: Authentication failed. (AUTHENTICATION_FAILED)"
                )
            try:
                with lock:
                    if (m := INSERT.match(query)) and body:
                        data = spool / "insert.arrow"
                        data.write_bytes(body)
                        sql = f"INSERT INTO {m.group(1)}{m.group(2) or ''} SELECT * FROM file('{data}', {m.group(3)})"
                        out = session.query(sql).bytes()
                    else:
                        sql = (query + " " + body.decode()).strip()
                        out = session.query(sql, params.get("default_format", ["TabSeparated"])[0]).bytes()
            except Exception as exc:  # noqa: BLE001 - the server reports every error to the client
                return self.reply(500, str(exc).encode())
            self.reply(200, out)

        def basic_password(self) -> str:
            import base64

            auth = self.headers.get("Authorization") or "Basic Og=="
            return base64.b64decode(auth.split()[1]).decode().partition(":")[2]

        def reply(self, status: int, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = handle_one

        def log_message(self, *args: Any) -> None:
            pass

    return http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)


@pytest.fixture(scope="module")
def clickhouse_out(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    chdb_session = pytest.importorskip("chdb.session")
    session = chdb_session.Session(str(tmp_path_factory.mktemp("chdb_out")))
    session.query("CREATE DATABASE analytics")
    server = clickhouse_http(session, tmp_path_factory.mktemp("spool"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield {"host": "127.0.0.1", "port": server.server_address[1], "session": session}
    finally:
        server.shutdown()
        server.server_close()
        session.close()


def clickhouse_output(tiny_config: Path, server: dict[str, Any]) -> Any:
    params = {"host": "127.0.0.1", "port": server["port"], "password": "${TEST_CH_OUT_PASSWORD}"}
    return with_output(tiny_config, "clickhouse", {**params, "database": "analytics"})


def test_clickhouse_write_back(tiny_config: Path, clickhouse_out, monkeypatch) -> None:
    monkeypatch.setenv("TEST_CH_OUT_PASSWORD", CH_PASSWORD)
    cfg = clickhouse_output(tiny_config, clickhouse_out)
    check_contract(cfg)
    ddl = clickhouse_out["session"].query("SHOW CREATE TABLE analytics.basemodel_predictions_churn").bytes()
    assert b"PARTITION BY (ifNull(scenario, ''), as_of)" in ddl.replace(b"\\'", b"'")
    # no staging table is left behind
    tables = clickhouse_out["session"].query("SHOW TABLES FROM analytics").bytes().decode().split()
    assert not [t for t in tables if "__stage_" in t]

    # a failing replace (a table partitioned otherwise) reports the step and leaves the table unchanged
    session = clickhouse_out["session"]
    session.query(
        "CREATE TABLE analytics.custom (entity_id Int64, as_of Date32, score Nullable(Float32), "
        "scenario Nullable(String), written_at DateTime64(6, 'UTC')) ENGINE = MergeTree ORDER BY entity_id"
    )
    session.query("INSERT INTO analytics.custom VALUES (1, '2024-03-01', 0.5, 'churn', now64())")
    with pytest.raises(DataError, match=r"^output 'warehouse' \(clickhouse:custom\): replace the slice: "):
        write_table(open_writer(with_table(cfg, "custom"), "predictions", "churn", DAY1), [predictions(4)])
    assert session.query("SELECT count() FROM analytics.custom", "CSV").bytes().strip() == b"1"
    tables = session.query("SHOW TABLES FROM analytics").bytes().decode().split()
    assert not [t for t in tables if "__stage_" in t]

    # an existing table without the output's columns: stopped at the first chunk, named, nothing written
    recs = pa.table({"entity_id": [1], "rank": pa.array([1], pa.int32()), "item": ["milk"]})
    with pytest.raises(
        DataError, match=r"has no column\(s\) rank, item .*outputs.destinations.warehouse.table"
    ):
        write_table(open_writer(with_table(cfg, "shared_scores"), "predictions", "recs", DAY1), [recs])


def test_clickhouse_bad_password_names_output_not_secret(
    tiny_config: Path, clickhouse_out, monkeypatch
) -> None:
    monkeypatch.setenv("TEST_CH_OUT_PASSWORD", "wrong-Out-pw-1")
    cfg = clickhouse_output(tiny_config, clickhouse_out)
    with pytest.raises(DataError) as info:
        write_table(open_writer(cfg, "predictions", "churn", DAY1), [predictions(3)])
    message = str(info.value)
    assert message.startswith("output 'warehouse' (clickhouse:basemodel_predictions_churn):")
    assert "AUTHENTICATION_FAILED" in message and "wrong-Out-pw-1" not in message


# ---- Snowflake ----------------------------------------------------------------------------------------
SF_PASSWORD = "sf-Out-Secret-8"


@pytest.fixture(scope="module")
def snowflake_out(fakesnow_start) -> Iterator[dict[str, Any]]:
    start = fakesnow_start
    import logging

    import snowflake.connector

    logging.getLogger("uvicorn").setLevel(logging.WARNING)
    with start() as kwargs:
        con = snowflake.connector.connect(**kwargs)
        con.cursor().execute("CREATE DATABASE OUTDB")
        con.cursor().execute("CREATE SCHEMA OUTDB.SCORES")
        con.close()
        yield kwargs


def test_snowflake_write_back(tiny_config: Path, snowflake_out, monkeypatch) -> None:
    monkeypatch.setenv("TEST_SF_OUT_PASSWORD", SF_PASSWORD)
    params = {
        "account": snowflake_out["account"],
        "user": snowflake_out["user"],
        "password": "${TEST_SF_OUT_PASSWORD}",
        "database": "OUTDB",
        "schema": "SCORES",
        "host": snowflake_out["host"],
        "port": snowflake_out["port"],
        "protocol": "http",
    }
    cfg = with_output(tiny_config, "snowflake", params)
    check_contract(cfg)
    info = write_table(open_writer(cfg, "predictions", "churn", DAY2), [predictions(2)])
    assert info["destination"] == "OUTDB.SCORES.BASEMODEL_PREDICTIONS_CHURN"


# ---- Databricks ---------------------------------------------------------------------------------------
DBX_TOKEN = "dapi-Out-Secret-6"


@pytest.fixture(scope="module")
def databricks_out() -> Iterator[dict[str, Any]]:
    """The real databricks-sql-connector against a TCLIService server on 127.0.0.1 that runs every
    statement it receives on DuckDB after sqlglot transpiles it from Databricks SQL (statements recorded)."""
    import duckdb
    import sqlglot
    from databricks.sql.thrift_api.TCLIService import TCLIService, ttypes
    from test_sources_support import HiveServer2, free_port
    from thrift.protocol import TBinaryProtocol
    from thrift.server import THttpServer

    class DatabricksSQL(HiveServer2):
        statements: list[str] = []

        def ExecuteStatement(self, req: Any) -> Any:  # noqa: N802 - Thrift method name
            self.statements.append(req.statement)
            if not req.statement.upper().startswith("USE "):
                # Databricks SQL -> the same statement in Hive SQL, which the parent transpiles to DuckDB
                req.statement = sqlglot.transpile(req.statement, read="databricks", write="hive")[0]
            return super().ExecuteStatement(req)

    con = duckdb.connect()
    con.execute("ATTACH ':memory:' AS main_catalog")
    con.execute("CREATE SCHEMA main_catalog.scores")
    handler = DatabricksSQL(con, ttypes)
    port = free_port()
    server = THttpServer.THttpServer(
        TCLIService.Processor(handler), ("127.0.0.1", port), TBinaryProtocol.TBinaryProtocolFactory()
    )
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    yield {
        "connection_uri": f"http://127.0.0.1:{port}/sql/1.0/warehouses/test",
        "handler": handler,
        "con": con,
    }
    server.httpd.shutdown()
    server.httpd.server_close()
    con.close()


def test_databricks_write_back(tiny_config: Path, databricks_out, monkeypatch) -> None:
    monkeypatch.setenv("TEST_DBX_OUT_TOKEN", DBX_TOKEN)
    params = {
        "server_hostname": "127.0.0.1",
        "http_path": "/sql/1.0/warehouses/test",
        "access_token": "${TEST_DBX_OUT_TOKEN}",
        "catalog": "main_catalog",
        "schema": "scores",
        "connection_uri": databricks_out["connection_uri"],
    }
    cfg = with_output(tiny_config, "databricks", params)
    check_contract(cfg)
    sent = databricks_out["handler"].statements
    merges = [s for s in sent if s.startswith("MERGE INTO")]
    assert merges and all("WHEN NOT MATCHED BY SOURCE AND" in s for s in merges)
    tables = databricks_out["con"].execute("SELECT table_name FROM duckdb_tables()").fetchall()
    assert not [t for (t,) in tables if "__stage_" in t]


# ---- BigQuery -----------------------------------------------------------------------------------------
def test_bigquery_write_back(tiny_config: Path, bigquery_server) -> None:  # noqa: F811
    params = {"project_id": PROJECT, "dataset_id": "analytics", "storage_api": False, **bigquery_server}
    cfg = with_output(tiny_config, "bigquery", params)
    check_contract(cfg)
    info = write_table(open_writer(cfg, "predictions", "churn", DAY2), [predictions(2)])
    assert info["destination"] == f"{PROJECT}.analytics.basemodel_predictions_churn"
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import bigquery

    client = bigquery.Client(
        project=PROJECT,
        credentials=AnonymousCredentials(),
        client_options=ClientOptions(api_endpoint=bigquery_server["api_endpoint"]),
    )
    names = [t.table_id for t in client.list_tables("analytics")]
    client.close()
    assert "basemodel_embeddings" in names and not [n for n in names if "__stage_" in n]
