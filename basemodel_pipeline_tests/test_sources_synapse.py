"""Synapse backend. No SQL Server engine runs here, so: (1) the T-SQL it generates runs on DuckDB (sqlglot
reads it back as T-SQL) through a DB-API connection standing in for the driver, which exercises the
backend's query, cursor-to-Arrow and extract code; (2) the real pytds driver meets a TCP server on
127.0.0.1 that drops every connection: a transient network failure, retried with backoff, then reported."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
import sqlglot
from test_sources_support import edit_config, local_extract, read_extract, relocate, resetting_server

from basemodel_pipeline import sources
from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.pipeline import run_extract
from basemodel_pipeline.retry import Unavailable
from basemodel_pipeline.sources import read_source, watermark
from basemodel_pipeline.sources.synapse import SynapseBackend

TABLES = ["transactions", "products", "demographics"]
PASSWORD = "syn-Secret-3"
EXECUTED: list[str] = []


class TsqlOnDuckDB:
    """A DB-API connection that runs T-SQL on DuckDB (read as T-SQL, written as DuckDB by sqlglot)."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con

    def cursor(self) -> Any:
        con = self.con.cursor()

        class Cursor:
            description = None

            def execute(self, sql: str) -> None:
                EXECUTED.append(sql)
                con.execute(sqlglot.transpile(sql, read="tsql", write="duckdb")[0])
                self.description = con.description

            def fetchmany(self, n: int) -> list[Any]:
                return con.fetchmany(n)

            def close(self) -> None:
                con.close()

        return Cursor()

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def tsql_engine(tiny_dataset: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect()
    con.execute("CREATE SCHEMA dbo")
    for name in TABLES:
        con.execute(
            f"CREATE TABLE dbo.{name} AS SELECT * FROM read_parquet('{tiny_dataset.parent / 'data' / name}.parquet')"
        )
    yield con
    con.close()


@pytest.fixture
def duck_synapse(tsql_engine, monkeypatch: pytest.MonkeyPatch) -> None:
    class DuckSynapse(SynapseBackend):
        def connect(self) -> Any:
            return TsqlOnDuckDB(tsql_engine)

    monkeypatch.setitem(sources.BACKENDS, "synapse", f"{__name__}:DuckSynapse")
    globals()["DuckSynapse"] = DuckSynapse


def synapse_config(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch, port: int = 1433, **tables: str
) -> Path:
    monkeypatch.setenv("TEST_SYNAPSE_PASSWORD", PASSWORD)
    params = {
        "server": "127.0.0.1",
        "port": port,
        "database": "analytics",
        "username": "etl",
        "password": "${TEST_SYNAPSE_PASSWORD}",
        "encrypt": False,
        "login_timeout_s": 2,
    }
    locations = {
        name: {"database_type": "synapse", "connection_params": params, "table_name": tables.get(name, name)}
        for name in TABLES
    }
    config = tiny_config.with_name("synapse.yaml")
    config.write_text(tiny_config.read_text())
    return relocate(config, locations)


def test_synapse_tsql_extract_matches_local_parquet(tiny_config: Path, duck_synapse, monkeypatch) -> None:
    expected = {name: local_extract(tiny_config, name) for name in ("transactions", "products")}
    cfg = load_config(synapse_config(tiny_config, monkeypatch))
    EXECUTED.clear()
    for name, table in expected.items():
        got = read_extract(run_extract(cfg, name)[name]["path"])
        assert got.column_names == table.column_names
        assert got.cast(table.schema).equals(table), name
    assert any("FROM [dbo].[transactions] AS [t]" in sql and "DATETIME2" in sql for sql in EXECUTED)
    assert watermark(cfg, cfg.source("transactions")) is not None


def test_synapse_text_dates_lambdas_and_joins(tiny_config: Path, duck_synapse, monkeypatch) -> None:
    config = synapse_config(tiny_config, monkeypatch)

    def mutate(raw: dict[str, Any]) -> None:
        ev = raw["data_sources"][0]
        ev["sql_lambdas"] = [{"alias": "is_multi", "expression": "IIF(quantity > 1, 1, 0)"}]
        ev["where_condition"] = "quantity > 0 AND LEN(CAST(store_id AS VARCHAR(20))) > 0"

    cfg = load_config(edit_config(config, mutate))
    with read_source(cfg, cfg.source("transactions"), join_attributes=True) as reader:
        table = reader.read_all()
    rows = table.to_pylist()
    assert rows and {"is_multi", "department"} <= set(table.column_names)
    assert all(r["is_multi"] == (1 if r["quantity"] > 1 else 0) for r in rows)


def test_synapse_unsupported_text_date_format_is_a_config_error(
    tiny_config: Path, duck_synapse, monkeypatch
) -> None:
    config = synapse_config(tiny_config, monkeypatch)
    edit_config(config, lambda raw: raw["data_sources"][0]["date_column"].update(format="%d/%m/%Y"))
    cfg = load_config(config)
    with pytest.raises(DataError, match="cannot be parsed in T-SQL"):
        run_extract(cfg, "transactions")


def test_synapse_dropped_connections_are_retried_then_reported(tiny_config: Path, monkeypatch) -> None:
    pytest.importorskip("pytds")
    monkeypatch.setenv("BASEMODEL_SOURCE_ATTEMPTS", "3")
    monkeypatch.setenv("BASEMODEL_SOURCE_RETRY_BASE_S", "0.01")
    with resetting_server() as (port, accepted):
        cfg = load_config(synapse_config(tiny_config, monkeypatch, port=port))
        with pytest.raises(Unavailable) as info:
            run_extract(cfg, "transactions")
    message = str(info.value)
    assert message.startswith("source 'transactions' (synapse:transactions): still failing after 3 attempts")
    assert len(accepted) == 3 and PASSWORD not in message
