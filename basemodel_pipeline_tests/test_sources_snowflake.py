"""Snowflake backend against fakesnow's server (the real snowflake-connector-python over HTTP)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from test_sources_support import edit_config, local_extract, read_extract, relocate

from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import ConfigError, DataError
from basemodel_pipeline.pipeline import run_extract
from basemodel_pipeline.sources import read_source, watermark
from basemodel_pipeline.sources.data_checks import check_config_against_data

TABLES = ["transactions", "products", "demographics"]
PASSWORD = "pw-Secret-42"


@pytest.fixture(scope="session")
def snowflake_server(tiny_dataset: Path, fakesnow_start) -> Iterator[dict[str, Any]]:
    start = fakesnow_start
    import snowflake.connector

    logging.getLogger("uvicorn").setLevel(logging.WARNING)
    with start() as kwargs:
        import fakesnow.server as fakesnow_server

        con = snowflake.connector.connect(**kwargs)
        cur = con.cursor()
        cur.execute("CREATE DATABASE ANALYTICS")
        cur.execute("CREATE SCHEMA ANALYTICS.EVENTS")
        con.close()
        # bulk load straight into the server's DuckDB (6k rows of INSERTs over HTTP take a minute); every
        # read in the tests goes through the connector. Unquoted Snowflake names are upper case.
        duck = fakesnow_server.shared_fs.duck_conn
        for name in TABLES:
            path = tiny_dataset.parent / "data" / f"{name}.parquet"
            cols = ", ".join(f'"{c}" AS "{c.upper()}"' for c in pq.read_schema(path).names)
            duck.execute(
                f"CREATE TABLE ANALYTICS.EVENTS.{name.upper()} AS SELECT {cols} FROM read_parquet('{path}')"
            )
        products = tiny_dataset.parent / "data" / "products.parquet"
        duck.execute(  # product ids formatted differently from the events' ids: a join that never matches
            "CREATE TABLE ANALYTICS.EVENTS.PRODUCTS_TEXT_IDS AS SELECT 'P-' || product_id AS PRODUCT_ID, "
            f"department AS DEPARTMENT FROM read_parquet('{products}')"
        )
        yield kwargs


def snowflake_config(
    tiny_config: Path, server: dict[str, Any], monkeypatch: pytest.MonkeyPatch, **tables: str
) -> Path:
    monkeypatch.setenv("TEST_SNOWFLAKE_PASSWORD", PASSWORD)
    params = {
        "account": server["account"],
        "user": server["user"],
        "password": "${TEST_SNOWFLAKE_PASSWORD}",
        "database": "ANALYTICS",
        "schema": "EVENTS",
        "host": server["host"],
        "port": server["port"],
        "protocol": "http",
    }
    locations = {
        name: {
            "database_type": "snowflake",
            "connection_params": params,
            "table_name": tables.get(name, name),
        }
        for name in TABLES
    }
    config = tiny_config.with_name("snowflake.yaml")
    config.write_text(tiny_config.read_text())
    return relocate(config, locations)


def test_snowflake_extract_matches_local_parquet(tiny_config: Path, snowflake_server, monkeypatch) -> None:
    expected = {name: local_extract(tiny_config, name) for name in ("transactions", "products")}
    cfg = load_config(snowflake_config(tiny_config, snowflake_server, monkeypatch))
    for name, table in expected.items():
        got = read_extract(run_extract(cfg, name)[name]["path"])
        assert got.column_names == table.column_names
        assert got.cast(table.schema).equals(table), name
    src = cfg.source("transactions")
    latest = max(
        pq.read_table(tiny_config.parent / "data" / "transactions.parquet")[
            "transaction_timestamp"
        ].to_pylist()
    )
    assert watermark(cfg, src) == latest.date()


def test_snowflake_lambdas_where_and_joins_run_in_snowflake_sql(
    tiny_config: Path, snowflake_server, monkeypatch
) -> None:
    config = snowflake_config(tiny_config, snowflake_server, monkeypatch)
    lambdas = [
        {"alias": "qty_kind", "expression": "IFF(quantity > 1, 'multi', 'single')"},
        {"alias": "net", "expression": "sales_value - ZEROIFNULL(coupon_disc)"},
    ]
    edit_config(config, lambda raw: raw["data_sources"][0].update(sql_lambdas=lambdas))
    cfg = load_config(config)
    with read_source(cfg, cfg.source("transactions"), join_attributes=True) as reader:
        table = reader.read_all()
    assert {"qty_kind", "net", "DEPARTMENT"} <= set(table.column_names)
    rows = table.to_pylist()
    assert rows and all(r["qty_kind"] == ("multi" if r["quantity"] > 1 else "single") for r in rows)
    assert all(abs(r["net"] - (r["sales_value"] - (r["coupon_disc"] or 0))) < 1e-9 for r in rows)
    assert all(r["DEPARTMENT"] is not None for r in rows)


def test_snowflake_missing_table_fails_fast_naming_source_and_table(
    tiny_config: Path, snowflake_server, monkeypatch
) -> None:
    cfg = load_config(
        snowflake_config(tiny_config, snowflake_server, monkeypatch, transactions="NO_SUCH_TABLE")
    )
    with pytest.raises(DataError) as info:
        run_extract(cfg, "transactions")
    message = str(info.value)
    assert message.startswith("source 'transactions' (snowflake:NO_SUCH_TABLE):")
    assert "not retried" in message and PASSWORD not in message


def test_snowflake_config_checks_run_in_the_warehouse(
    tiny_config: Path, snowflake_server, monkeypatch
) -> None:
    config = snowflake_config(tiny_config, snowflake_server, monkeypatch)
    check_config_against_data(load_config(config), config)  # upper-case Snowflake columns match the config

    edit_config(config, lambda raw: raw["data_sources"][0].update(where_condition="no_such_column > 0"))
    with pytest.raises(ConfigError) as info:
        check_config_against_data(load_config(config), config)
    assert "data_sources[0]" in str(info.value) and "NO_SUCH_COLUMN" in str(info.value).upper()


def test_snowflake_join_that_never_matches_shows_both_sides(
    tiny_config: Path, snowflake_server, monkeypatch
) -> None:
    config = snowflake_config(tiny_config, snowflake_server, monkeypatch, products="PRODUCTS_TEXT_IDS")
    edit_config(
        config, lambda raw: raw["data_sources"][1].update(allowed_columns=["product_id", "department"])
    )
    with pytest.raises(ConfigError) as info:
        check_config_against_data(load_config(config), config)
    message = str(info.value)
    assert (
        "data_sources[0].joined_data_sources[0].join_on" in message and "no row of 'transactions'" in message
    )
    assert "'P-" in message  # examples of the attribute side's ids next to the events' ids
