"""Hive backend against a real HiveServer2: Spark's Thrift server from the pyspark wheel (Java 17), started
on a free port for this test (~30 s). One test function, so pytest-xdist starts one server, not one per
worker. Skipped when pyspark or Java is missing."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from test_sources_support import edit_config, free_port, local_extract, read_extract, relocate

from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.pipeline import run_extract
from basemodel_pipeline.sources import read_source, watermark

TABLES = ["transactions", "products", "demographics"]
START_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def spark_thrift(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    pyspark = pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("no Java runtime for Spark's Thrift server")
    from pyhive import hive

    home = Path(pyspark.__file__).parent
    work = tmp_path_factory.mktemp("spark")
    port = free_port()
    cmd = [
        str(home / "bin" / "spark-submit"),
        "--class", "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2",
        "--master", "local[1]",
        "--driver-memory", "1g",
        "--conf", "spark.ui.enabled=false",
        "--conf", f"spark.sql.warehouse.dir={work / 'warehouse'}",
        "--conf", f"spark.driver.extraJavaOptions=-Dderby.system.home={work}",
        "--hiveconf", f"hive.server2.thrift.port={port}",
        "--hiveconf", "hive.server2.thrift.bind.host=127.0.0.1",
        "--hiveconf", "hive.server2.authentication=NOSASL",
        "spark-internal",
    ]  # fmt: skip
    log = open(work / "thriftserver.log", "wb")  # noqa: SIM115 - closed at teardown
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"Spark Thrift server did not start: {(work / 'thriftserver.log').read_text()[-3000:]}"
                )
            time.sleep(0.5)
        con = hive.connect(host="127.0.0.1", port=port, auth="NOSASL")
        cur = con.cursor()
        cur.execute("CREATE DATABASE analytics")
        for name in TABLES:
            path = tiny_dataset.parent / "data" / f"{name}.parquet"
            cur.execute(f"CREATE TABLE analytics.{name} USING parquet LOCATION '{path}'")
        con.close()
        yield {"host": "127.0.0.1", "port": port}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def spark_config(tiny_config: Path, server: dict[str, Any], **tables: str) -> Path:
    params = {**server, "database": "analytics", "auth": "NOSASL"}
    locations = {
        name: {"database_type": "hive", "connection_params": params, "table_name": tables.get(name, name)}
        for name in TABLES
    }
    config = tiny_config.with_name("spark.yaml")
    config.write_text(tiny_config.read_text())
    return relocate(config, locations)


def test_hive_backend_on_spark_thrift_server(tiny_config: Path, spark_thrift) -> None:
    expected = {name: local_extract(tiny_config, name) for name in ("transactions", "products")}
    config = spark_config(tiny_config, spark_thrift)
    cfg = load_config(config)
    for name, table in expected.items():
        got = read_extract(run_extract(cfg, name)[name]["path"])
        assert got.column_names == table.column_names
        assert got.cast(table.schema).equals(table), name
    data = pq.read_table(tiny_config.parent / "data" / "transactions.parquet")
    assert watermark(cfg, cfg.source("transactions")) == max(data["transaction_timestamp"].to_pylist()).date()

    def mutate(raw: dict[str, Any]) -> None:  # Hive SQL computed and filtered by Spark
        ev = raw["data_sources"][0]
        ev["sql_lambdas"] = [{"alias": "kind", "expression": "IF(quantity > 1, 'multi', 'single')"}]
        ev["where_condition"] = "quantity > 0 AND LENGTH(CAST(store_id AS STRING)) > 0"

    cfg = load_config(edit_config(config, mutate))
    with read_source(cfg, cfg.source("transactions"), join_attributes=True) as reader:
        rows = reader.read_all().to_pylist()
    assert rows and all(r["kind"] == ("multi" if r["quantity"] > 1 else "single") for r in rows)
    assert all(r["department"] for r in rows)

    missing = load_config(spark_config(tiny_config, spark_thrift, transactions="no_such_table"))
    with pytest.raises(DataError) as info:
        run_extract(missing, "transactions")
    assert str(info.value).startswith("source 'transactions' (hive:no_such_table):")
    assert "not retried" in str(info.value)
