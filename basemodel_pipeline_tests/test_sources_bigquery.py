"""BigQuery backend against bqemulator (BigQuery's REST and Storage Read APIs, DuckDB inside), started once
per test session on free ports. The emulator needs DuckDB's spatial extension, installed here offline from
the duckdb-extension-spatial wheel into the emulator's own HOME."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_sources_support import edit_config, free_port, local_extract, read_extract, relocate

from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.pipeline import run_extract
from basemodel_pipeline.sources import read_source, watermark

TABLES = ["transactions", "products", "demographics"]
PROJECT = "test-project"


def bq_type(t: pa.DataType) -> str:
    if pa.types.is_integer(t):
        return "INT64"
    if pa.types.is_floating(t):
        return "FLOAT64"
    return "TIMESTAMP" if pa.types.is_timestamp(t) else "STRING"


def install_spatial(home: Path) -> None:
    wheel_dir = pytest.importorskip("duckdb_extension_spatial").__file__
    import duckdb

    ext = Path(wheel_dir).parent / "extensions" / f"v{duckdb.__version__}" / "spatial.duckdb_extension"
    con = duckdb.connect()
    con.execute(f"SET extension_directory = '{home / '.duckdb' / 'extensions'}'")
    con.execute(f"INSTALL '{ext}'")
    con.close()


@pytest.fixture(scope="session")
def bigquery_server(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    exe = Path(sys.executable).with_name("bqemulator")
    if not exe.exists():
        pytest.skip("bqemulator is not installed")
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import bigquery

    home = tmp_path_factory.mktemp("bqhome")
    install_spatial(home)
    rest, grpc_port = free_port(), free_port()
    cmd = [str(exe), "start", "--rest-port", str(rest), "--grpc-port", str(grpc_port), "--project", PROJECT]
    log = open(home / "bqemulator.log", "wb")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(
        [*cmd, "--log-level", "warning"], env={**os.environ, "HOME": str(home)}, stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{rest}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/bigquery/v2/projects/{PROJECT}/datasets", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"bqemulator did not start: {(home / 'bqemulator.log').read_text()[-2000:]}")
                time.sleep(0.3)
        client = bigquery.Client(
            project=PROJECT,
            credentials=AnonymousCredentials(),
            client_options=ClientOptions(api_endpoint=url),
        )
        client.create_dataset("analytics")
        for name in TABLES:
            table = pq.read_table(tiny_dataset.parent / "data" / f"{name}.parquet")
            schema = [bigquery.SchemaField(f.name, bq_type(f.type)) for f in table.schema]
            client.create_table(bigquery.Table(f"{PROJECT}.analytics.{name}", schema=schema))
            buf = io.BytesIO()
            pq.write_table(table, buf)
            buf.seek(0)
            config = bigquery.LoadJobConfig(source_format="PARQUET")
            client.load_table_from_file(buf, f"{PROJECT}.analytics.{name}", job_config=config).result()
        client.close()
        yield {"api_endpoint": url, "storage_api_endpoint": f"127.0.0.1:{grpc_port}"}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(home, ignore_errors=True)


def bigquery_config(
    tiny_config: Path, server: dict[str, Any], storage_api: bool = True, **tables: str
) -> Path:
    params = {"project_id": PROJECT, "dataset_id": "analytics", "storage_api": storage_api, **server}
    locations = {
        name: {"database_type": "bigquery", "connection_params": params, "table_name": tables.get(name, name)}
        for name in TABLES
    }
    config = tiny_config.with_name("bigquery.yaml")
    config.write_text(tiny_config.read_text())
    return relocate(config, locations)


@pytest.mark.parametrize("storage_api", [True, False])
def test_bigquery_extract_matches_local_parquet(
    tiny_config: Path, bigquery_server, storage_api: bool
) -> None:
    expected = {name: local_extract(tiny_config, name) for name in ("transactions", "products")}
    cfg = load_config(bigquery_config(tiny_config, bigquery_server, storage_api))
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


def test_bigquery_lambdas_and_joins_in_bigquery_sql(tiny_config: Path, bigquery_server) -> None:
    config = bigquery_config(tiny_config, bigquery_server)

    def mutate(raw: dict[str, Any]) -> None:
        ev = raw["data_sources"][0]
        ev["sql_lambdas"] = [{"alias": "hour", "expression": "EXTRACT(HOUR FROM transaction_timestamp)"}]
        ev["where_condition"] = "quantity > 0 AND SAFE_DIVIDE(sales_value, quantity) >= 0"

    cfg = load_config(edit_config(config, mutate))
    with read_source(cfg, cfg.source("transactions"), join_attributes=True) as reader:
        table = reader.read_all()
    rows = table.to_pylist()
    assert rows and {"hour", "department"} <= set(table.column_names)
    assert all(r["hour"] == r["transaction_timestamp"].hour for r in rows)
    assert all(r["department"] for r in rows)


def test_bigquery_missing_table_fails_fast(tiny_config: Path, bigquery_server) -> None:
    cfg = load_config(bigquery_config(tiny_config, bigquery_server, transactions="no_such_table"))
    with pytest.raises(DataError) as info:
        run_extract(cfg, "transactions")
    message = str(info.value)
    assert message.startswith("source 'transactions' (bigquery:no_such_table): 404")
    assert "not retried" in message
