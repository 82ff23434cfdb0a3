"""Databricks backend: the real databricks-sql-connector speaking its Thrift-over-HTTP protocol to a minimal
TCLIService server on 127.0.0.1 (the connector's own Thrift definitions, server side) that runs each
Databricks SQL statement on DuckDB after transpiling it with sqlglot. No Databricks engine runs here."""

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
TOKEN = "dapi-Secret-5"


@pytest.fixture(scope="session")
def databricks_server(tiny_dataset: Path) -> Iterator[dict[str, Any]]:
    from databricks.sql.thrift_api.TCLIService import TCLIService, ttypes
    from thrift.protocol import TBinaryProtocol
    from thrift.server import THttpServer

    con = duckdb.connect()
    con.execute("ATTACH ':memory:' AS main_catalog")
    con.execute("CREATE SCHEMA main_catalog.sales")
    for name in TABLES:
        path = tiny_dataset.parent / "data" / f"{name}.parquet"
        con.execute(f"CREATE TABLE main_catalog.sales.{name} AS SELECT * FROM read_parquet('{path}')")
    port = free_port()
    server = THttpServer.THttpServer(
        TCLIService.Processor(HiveServer2(con, ttypes)),
        ("127.0.0.1", port),
        TBinaryProtocol.TBinaryProtocolFactory(),
    )
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    yield {"connection_uri": f"http://127.0.0.1:{port}/sql/1.0/warehouses/test"}
    server.httpd.shutdown()
    server.httpd.server_close()
    con.close()


def databricks_config(
    tiny_config: Path, server: dict[str, Any], monkeypatch: pytest.MonkeyPatch, **tables: str
) -> Path:
    monkeypatch.setenv("TEST_DATABRICKS_TOKEN", TOKEN)
    params = {
        "server_hostname": "127.0.0.1",
        "http_path": "/sql/1.0/warehouses/test",
        "access_token": "${TEST_DATABRICKS_TOKEN}",
        "catalog": "main_catalog",
        "schema": "sales",
        **server,
    }
    locations = {
        name: {
            "database_type": "databricks",
            "connection_params": params,
            "table_name": tables.get(name, name),
        }
        for name in TABLES
    }
    config = tiny_config.with_name("databricks.yaml")
    config.write_text(tiny_config.read_text())
    return relocate(config, locations)


def test_databricks_extract_matches_local_parquet(tiny_config: Path, databricks_server, monkeypatch) -> None:
    expected = {name: local_extract(tiny_config, name) for name in ("transactions", "products")}
    cfg = load_config(databricks_config(tiny_config, databricks_server, monkeypatch))
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


def test_databricks_lambdas_where_and_joins(tiny_config: Path, databricks_server, monkeypatch) -> None:
    config = databricks_config(tiny_config, databricks_server, monkeypatch)

    def mutate(raw: dict[str, Any]) -> None:
        ev = raw["data_sources"][0]
        ev["sql_lambdas"] = [{"alias": "kind", "expression": "IF(quantity > 1, 'multi', 'single')"}]
        ev["where_condition"] = "quantity > 0 AND store_id IS NOT NULL"

    cfg = load_config(edit_config(config, mutate))
    with read_source(cfg, cfg.source("transactions"), join_attributes=True) as reader:
        table = reader.read_all()
    rows = table.to_pylist()
    assert rows and {"kind", "department"} <= set(table.column_names)
    assert all(r["kind"] == ("multi" if r["quantity"] > 1 else "single") for r in rows)


def test_databricks_missing_table_fails_fast(tiny_config: Path, databricks_server, monkeypatch) -> None:
    cfg = load_config(
        databricks_config(tiny_config, databricks_server, monkeypatch, transactions="no_such_table")
    )
    with pytest.raises(DataError) as info:
        run_extract(cfg, "transactions")
    message = str(info.value)
    assert message.startswith("source 'transactions' (databricks:no_such_table):")
    assert "not retried" in message and TOKEN not in message
