"""Hive backend: the real PyHive client speaking HiveServer2's Thrift protocol over a TCP socket to a minimal
HiveServer2 started on 127.0.0.1 (PyHive's own TCLIService definitions, server side), which runs each Hive
statement by transpiling it to DuckDB with sqlglot. Fast; test_sources_spark.py runs the same backend against
Spark's real Thrift server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest
from test_sources_support import HiveServer2, edit_config, free_port, local_extract, read_extract, relocate

from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.pipeline import run_extract
from basemodel_pipeline.sources import read_source, watermark

TABLES = ["transactions", "products", "demographics"]
ttypes = pytest.importorskip("TCLIService.ttypes")


@pytest.fixture(scope="session")
def hive_server(tiny_dataset: Path) -> Iterator[dict[str, Any]]:
    from TCLIService import TCLIService
    from thrift.protocol import TBinaryProtocol
    from thrift.server import TServer
    from thrift.transport import TSocket, TTransport

    con = duckdb.connect()
    con.execute("CREATE SCHEMA analytics")
    for name in TABLES:
        path = tiny_dataset.parent / "data" / f"{name}.parquet"
        con.execute(f"CREATE TABLE analytics.{name} AS SELECT * FROM read_parquet('{path}')")
    port = free_port()
    server = TServer.TThreadedServer(
        TCLIService.Processor(HiveServer2(con, ttypes)),
        TSocket.TServerSocket(host="127.0.0.1", port=port),
        TTransport.TBufferedTransportFactory(),
        TBinaryProtocol.TBinaryProtocolFactory(),
        daemon=True,
    )
    threading.Thread(target=server.serve, daemon=True).start()
    import socket
    import time

    for _ in range(100):  # wait until it listens
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    yield {"host": "127.0.0.1", "port": port}
    server.serverTransport.close()
    con.close()


def hive_config(tiny_config: Path, server: dict[str, Any], **tables: str) -> Path:
    params = {**server, "database": "analytics", "auth": "NOSASL", "username": "etl"}
    locations = {
        name: {"database_type": "hive", "connection_params": params, "table_name": tables.get(name, name)}
        for name in TABLES
    }
    config = tiny_config.with_name("hive.yaml")
    config.write_text(tiny_config.read_text())
    return relocate(config, locations)


def test_hive_extract_matches_local_parquet(tiny_config: Path, hive_server) -> None:
    expected = {name: local_extract(tiny_config, name) for name in ("transactions", "products")}
    cfg = load_config(hive_config(tiny_config, hive_server))
    for name, table in expected.items():
        got = read_extract(run_extract(cfg, name)[name]["path"])
        assert got.column_names == table.column_names
        assert got.cast(table.schema).equals(table), name
    latest = max(
        pq.read_table(tiny_config.parent / "data" / "transactions.parquet")[
            "transaction_timestamp"
        ].to_pylist()
    )
    assert watermark(cfg, cfg.source("transactions")) == latest.date()


def test_hive_text_dates_lambdas_and_joins(tiny_config: Path, hive_server) -> None:
    config = hive_config(tiny_config, hive_server)

    def mutate(raw: dict[str, Any]) -> None:
        ev = raw["data_sources"][0]
        ev["sql_lambdas"] = [{"alias": "is_multi", "expression": "IF(quantity > 1, 1, 0)"}]
        ev["where_condition"] = "quantity > 0 AND LENGTH(CAST(store_id AS STRING)) > 0"

    cfg = load_config(edit_config(config, mutate))
    with read_source(cfg, cfg.source("transactions"), join_attributes=True) as reader:
        table = reader.read_all()
    rows = table.to_pylist()
    assert rows and {"is_multi", "department"} <= set(table.column_names)
    assert all(r["is_multi"] == (1 if r["quantity"] > 1 else 0) for r in rows)
    assert all(r["department"] for r in rows)


def test_hive_missing_table_fails_fast(tiny_config: Path, hive_server) -> None:
    cfg = load_config(hive_config(tiny_config, hive_server, transactions="no_such_table"))
    with pytest.raises(DataError) as info:
        run_extract(cfg, "transactions")
    message = str(info.value)
    assert message.startswith("source 'transactions' (hive:no_such_table):")
    assert "no_such_table" in message.split(":", 2)[2] and "not retried" in message
