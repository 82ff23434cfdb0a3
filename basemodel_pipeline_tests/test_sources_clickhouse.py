"""ClickHouse backend: the real clickhouse-connect client over HTTP, queries executed by chdb (ClickHouse's
engine in-process) behind a minimal implementation of ClickHouse's HTTP interface started on 127.0.0.1."""

from __future__ import annotations

import base64
import http.server
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from test_sources_support import edit_config, local_extract, read_extract, relocate

from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.pipeline import run_extract
from basemodel_pipeline.sources import read_source, watermark

TABLES = ["transactions", "products", "demographics"]
PASSWORD = "ch-Secret-7"
OVERLOADED = b"Code: 202. DB::Exception: Too many simultaneous queries. (TOO_MANY_SIMULTANEOUS_QUERIES)"
FAILURES = {"remaining": 0, "served": 0}  # the next N requests are refused as overloaded
AUTH_FAILED = b"Code: 516. DB::Exception: default: Authentication failed: password is incorrect. (AUTHENTICATION_FAILED)"


def http_interface(session: Any) -> http.server.ThreadingHTTPServer:
    """ClickHouse's HTTP protocol as clickhouse-connect speaks it: SQL in `query` and/or the body, the output
    format named by a FORMAT clause (or default_format), errors as 'Code: N. DB::Exception: ...'."""
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def handle_one(self) -> None:
            params = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
            size = int(self.headers.get("Content-Length") or 0)
            sql = (
                params.get("query", [""])[0] + " " + (self.rfile.read(size).decode() if size else "")
            ).strip()
            user, _, password = (
                base64.b64decode((self.headers.get("Authorization") or "Basic Og==").split()[1])
                .decode()
                .partition(":")
            )
            if FAILURES["remaining"] > 0:
                FAILURES["remaining"] -= 1
                FAILURES["served"] += 1
                return self.reply(500, OVERLOADED)
            if password != PASSWORD:
                return self.reply(403, AUTH_FAILED)
            try:
                with lock:
                    data = session.query(sql, params.get("default_format", ["TabSeparated"])[0]).bytes()
            except Exception as exc:  # noqa: BLE001 - the server reports every error to the client
                return self.reply(500, str(exc).encode())
            self.reply(200, data)

        def reply(self, status: int, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = handle_one

        def log_message(self, *args: Any) -> None:
            pass

    return http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)


@pytest.fixture(scope="session")
def clickhouse_server(
    tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    chdb_session = pytest.importorskip("chdb.session")
    session = chdb_session.Session(str(tmp_path_factory.mktemp("chdb")))
    session.query("CREATE DATABASE analytics")
    for name in TABLES:
        path = tiny_dataset.parent / "data" / f"{name}.parquet"
        session.query(
            f"CREATE TABLE analytics.{name} ENGINE = MergeTree ORDER BY tuple() "
            f"AS SELECT * FROM file('{path}', Parquet)"
        )
    server = http_interface(session)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield {"host": "127.0.0.1", "port": server.server_address[1]}
    finally:
        server.shutdown()
        server.server_close()
        session.close()


def clickhouse_config(
    tiny_config: Path, server: dict[str, Any], monkeypatch: pytest.MonkeyPatch, password: str = PASSWORD
) -> Path:
    monkeypatch.setenv("TEST_CH_PASSWORD", password)
    params = {**server, "username": "default", "password": "${TEST_CH_PASSWORD}", "database": "analytics"}
    locations = {
        name: {"database_type": "clickhouse", "connection_params": params, "table_name": name}
        for name in TABLES
    }
    config = tiny_config.with_name("clickhouse.yaml")
    config.write_text(tiny_config.read_text())
    return relocate(config, locations)


def test_clickhouse_extract_matches_local_parquet(tiny_config: Path, clickhouse_server, monkeypatch) -> None:
    expected = {name: local_extract(tiny_config, name) for name in ("transactions", "products")}
    cfg = load_config(clickhouse_config(tiny_config, clickhouse_server, monkeypatch))
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


def test_clickhouse_text_dates_lambdas_and_joins(tiny_config: Path, clickhouse_server, monkeypatch) -> None:
    config = clickhouse_config(tiny_config, clickhouse_server, monkeypatch)

    def mutate(raw: dict[str, Any]) -> None:
        ev = raw["data_sources"][0]
        ev["sql_lambdas"] = [{"alias": "basket_size", "expression": "if(quantity > 1, 'multi', 'single')"}]
        ev["where_condition"] = "quantity > 0 AND toDayOfWeek(transaction_timestamp) <= 7"

    cfg = load_config(edit_config(config, mutate))
    with read_source(cfg, cfg.source("transactions"), join_attributes=True) as reader:
        table = reader.read_all()
    rows = table.to_pylist()
    assert rows and {"basket_size", "department"} <= set(table.column_names)
    assert all(r["basket_size"] == ("multi" if r["quantity"] > 1 else "single") for r in rows)
    assert all(r["department"] for r in rows)


def test_clickhouse_bad_password_fails_fast(tiny_config: Path, clickhouse_server, monkeypatch) -> None:
    cfg = load_config(clickhouse_config(tiny_config, clickhouse_server, monkeypatch, password="wrong-pw-9"))
    with pytest.raises(DataError) as info:
        run_extract(cfg, "transactions")
    message = str(info.value)
    assert message.startswith("source 'transactions' (clickhouse:transactions):")
    assert "AUTHENTICATION_FAILED" in message and "not retried" in message and "wrong-pw-9" not in message


def test_clickhouse_overload_is_retried_then_succeeds(
    tiny_config: Path, clickhouse_server, monkeypatch
) -> None:
    monkeypatch.setenv("BASEMODEL_SOURCE_RETRY_BASE_S", "0.01")
    cfg = load_config(clickhouse_config(tiny_config, clickhouse_server, monkeypatch))
    FAILURES.update(remaining=2, served=0)
    try:
        meta = run_extract(cfg, "products")["products"]
    finally:
        refused, FAILURES["remaining"] = FAILURES["served"], 0
    assert (
        refused == 2
        and meta["rows"] == pq.read_metadata(tiny_config.parent / "data" / "products.parquet").num_rows
    )
