"""A refused or reset connection to a warehouse or an object store is retried with growing waits, then reported
in one line naming the source (or output, or upload URL) and host:port, never a secret.

Real clients against 127.0.0.1: a port that was bound and closed (the connection is refused) or a server that
accepts and closes at once (the connection is reset). The waits are made small through
BASEMODEL_SOURCE_RETRY_BASE_S.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import patient
from test_sources_support import edit_config, relocate, resetting_server

from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.pipeline import run_extract
from basemodel_pipeline.retry import Unavailable, with_retry
from basemodel_pipeline.sources import backend_class, source_schema

TABLES = ("transactions", "products", "demographics")
PASSWORD = "pw-Refused-7731"
AWS_SECRET = "aws-Secret-Refused-5517"
ATTEMPTS = 3
RETRY_LINE = re.compile(r"attempt (\d) of (\d) failed \((.*)\); retrying in ([0-9.]+) s")


def closed_port() -> int:
    """A port nothing listens on: bound, then closed, so that connecting to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def resetting_port() -> Iterator[tuple[int, list[int]]]:
    with resetting_server() as served:
        yield served


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASEMODEL_SOURCE_ATTEMPTS", str(ATTEMPTS))
    monkeypatch.setenv("BASEMODEL_SOURCE_RETRY_BASE_S", "0.02")
    monkeypatch.setenv("TEST_REFUSED_PASSWORD", PASSWORD)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "refused-key-id")
    monkeypatch.setenv("BASEMODEL_BIGQUERY_CALL_RETRY_S", "1")  # the Google client's own retries, per call


def pointed_at(tiny_config: Path, location: dict[str, Any]) -> Path:
    """A copy of the tiny config whose sources all live at `location` (table_name / path per source)."""

    def place(name: str) -> dict[str, Any]:
        if location["database_type"] == "parquet":
            return {**location, "path": f"{location['path']}/{name}/"}
        return {**location, "table_name": name}

    config = tiny_config.with_name("refused.yaml")
    config.write_text(tiny_config.read_text())
    return relocate(config, {name: place(name) for name in TABLES})


def snowflake_at(port: int) -> dict[str, Any]:
    params = {
        "account": "acme",
        "user": "etl",
        "password": "${TEST_REFUSED_PASSWORD}",
        "database": "ANALYTICS",
        "schema": "EVENTS",
        "host": "127.0.0.1",
        "port": port,
        "protocol": "http",
    }
    return {"database_type": "snowflake", "connection_params": params}


def s3_at(port: int, engine: str) -> dict[str, Any]:
    s3 = {"endpoint": f"127.0.0.1:{port}", "use_ssl": False, "url_style": "path", "region": "us-east-1"}
    return {"database_type": "parquet", "path": "s3://lake/events", "s3": s3, "engine": engine}


def clickhouse_at(port: int) -> dict[str, Any]:
    params = {"host": "127.0.0.1", **server_login(port)}
    return {"database_type": "clickhouse", "connection_params": params}


def hive_at(port: int) -> dict[str, Any]:
    return {"database_type": "hive", "connection_params": {"host": "127.0.0.1", "port": port}}


def synapse_at(port: int) -> dict[str, Any]:
    params = {
        "server": "127.0.0.1",
        **server_login(port),
        "username": "etl",
        "encrypt": False,
        "login_timeout_s": 1,
    }
    return {"database_type": "synapse", "connection_params": params}


def bigquery_at(port: int) -> dict[str, Any]:
    params = {"project_id": "acme", "dataset_id": "events", "api_endpoint": f"http://127.0.0.1:{port}"}
    return {"database_type": "bigquery", "connection_params": params}


def server_login(port: int) -> dict[str, Any]:
    return {"port": port, "password": "${TEST_REFUSED_PASSWORD}", "database": "analytics"}


def databricks_at(port: int) -> dict[str, Any]:
    params = {
        "server_hostname": "127.0.0.1",
        "http_path": "/sql/1.0/warehouses/x",
        "access_token": "${TEST_REFUSED_PASSWORD}",
        "connection_uri": f"http://127.0.0.1:{port}/sql/1.0/warehouses/x",
    }
    return {"database_type": "databricks", "connection_params": params}


LOCATIONS: dict[str, tuple[str, Callable[[int], dict[str, Any]]]] = {
    "snowflake": ("snowflake.connector", snowflake_at),
    "bigquery": ("google.cloud.bigquery", bigquery_at),
    "s3-duckdb-httpfs": ("duckdb_extension_httpfs", lambda port: s3_at(port, "duckdb")),
    "s3-pyarrow": ("pyarrow.fs", lambda port: s3_at(port, "pyarrow")),
    "clickhouse": ("clickhouse_connect", clickhouse_at),
    "hive": ("pyhive", hive_at),
    "synapse": ("pytds", synapse_at),
    "databricks": ("databricks.sql", databricks_at),
}


def retry_lines(caplog: pytest.LogCaptureFixture, what: str) -> list[re.Match[str]]:
    return [
        m
        for r in caplog.records
        if r.getMessage().startswith(what) and (m := RETRY_LINE.search(r.getMessage()))
    ]


def assert_one_line_naming(message: str, what: str, where: str) -> None:
    assert "\n" not in message
    assert message.startswith(f"{what}: still failing after {ATTEMPTS} attempts at {where}: "), message
    assert "check that" in message and "then retry" in message
    assert PASSWORD not in message and AWS_SECRET not in message


@pytest.mark.parametrize("kind", sorted(LOCATIONS))
def test_a_refused_connection_is_retried_then_reported_in_one_line(
    kind: str, tiny_config: Path, fast_retries: None, caplog: pytest.LogCaptureFixture
) -> None:
    module, location = LOCATIONS[kind]
    pytest.importorskip(module)
    port = closed_port()
    cfg = load_config(pointed_at(tiny_config, location(port)))
    src = cfg.source("transactions")
    what = f"source 'transactions' ({src.data_location.display()})"
    with caplog.at_level(logging.WARNING), pytest.raises(Unavailable) as info:
        source_schema(cfg, src)
    assert_one_line_naming(str(info.value), what, f"127.0.0.1:{port}")
    retries = retry_lines(caplog, what)
    assert [int(m.group(1)) for m in retries] == list(range(1, ATTEMPTS))
    assert all(PASSWORD not in r.getMessage() for r in caplog.records)


def test_snowflake_says_the_connection_was_refused(tiny_config: Path, fast_retries: None) -> None:
    """The connector's own words ('250001: Could not connect to Snowflake backend') carry the refusal."""
    pytest.importorskip("snowflake.connector")
    cfg = load_config(pointed_at(tiny_config, snowflake_at(closed_port())))
    with pytest.raises(Unavailable) as info:
        run_extract(cfg, "transactions")
    assert "250001" in str(info.value) and "Connection refused" in str(info.value)


@pytest.mark.parametrize("kind", ["clickhouse", "hive", "s3-duckdb-httpfs"])
def test_a_server_that_resets_every_connection_is_retried_then_reported(
    kind: str, tiny_config: Path, fast_retries: None, resetting_port: tuple[int, list[int]]
) -> None:
    module, location = LOCATIONS[kind]
    pytest.importorskip(module)
    port, accepted = resetting_port
    cfg = load_config(pointed_at(tiny_config, location(port)))
    src = cfg.source("products")
    with pytest.raises(Unavailable) as info:
        source_schema(cfg, src)
    assert_one_line_naming(
        str(info.value), f"source 'products' ({src.data_location.display()})", f"127.0.0.1:{port}"
    )
    assert len(accepted) >= ATTEMPTS  # every attempt reached the server (drivers may add their own retries)


def test_the_waits_between_attempts_grow(tiny_config: Path, fast_retries: None) -> None:
    pytest.importorskip("clickhouse_connect")
    cfg = load_config(pointed_at(tiny_config, clickhouse_at(closed_port())))
    src = cfg.source("transactions")
    cls = backend_class("clickhouse")
    waits: list[float] = []
    with pytest.raises(Unavailable):
        with_retry(
            lambda: cls(src, Path(cfg.workspace)),
            what="source 'transactions'",
            is_transient=cls.is_transient,
            attempts=5,
            base_delay=0.01,
            on_retry=lambda _attempt, _exc, delay: waits.append(delay),
        )
    assert len(waits) == 4
    assert all(0.01 * 2 ** (i - 1) <= w <= 0.01 * 2**i for i, w in enumerate(waits))  # half to all of the cap
    assert waits == sorted(waits)


def test_a_warehouse_output_at_a_refused_port_is_one_line(tiny_config: Path, fast_retries: None) -> None:
    pytest.importorskip("clickhouse_connect")
    import datetime as dt

    from basemodel_pipeline.outputs import open_writer

    port = closed_port()
    params = clickhouse_at(port)["connection_params"]

    def mutate(raw: dict[str, Any]) -> None:
        raw["outputs"] = {
            "default": "warehouse",
            "destinations": {"warehouse": {"kind": "clickhouse", "connection_params": params}},
        }

    cfg = load_config(edit_config(tiny_config, mutate))
    with pytest.raises(Unavailable) as info:
        open_writer(cfg, "predictions", "churn", dt.date(2024, 1, 1))
    assert_one_line_naming(
        str(info.value),
        "output 'warehouse' (clickhouse:basemodel_predictions_churn): connect",
        f"127.0.0.1:{port}",
    )


def test_uploading_to_a_refused_s3_endpoint_is_retried_then_one_line(
    tmp_path: Path, fast_retries: None, caplog: pytest.LogCaptureFixture
) -> None:
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config

    from basemodel_pipeline.ops.upload import upload_dir

    port = closed_port()
    client = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1, "mode": "standard"}),
    )
    workspace = tmp_path / "ws"
    (workspace / "reports" / "r1").mkdir(parents=True)
    (workspace / "reports" / "r1" / "report.html").write_text("<html></html>")
    with caplog.at_level(logging.WARNING), pytest.raises(DataError) as info:
        upload_dir(client, workspace / "reports" / "r1", workspace, "s3://artifacts/prod")
    message = str(info.value)
    assert message.startswith(
        f"upload to s3://artifacts/prod: still failing after {ATTEMPTS} attempts at 127.0.0.1:{port}: "
    ), message
    assert AWS_SECRET not in message and "\n" not in message
    assert len(retry_lines(caplog, "upload to s3://artifacts/prod")) == ATTEMPTS - 1


@pytest.mark.parametrize("kind", ["snowflake", "s3-duckdb-httpfs"])
def test_the_cli_reports_a_refused_source_in_one_line_without_secrets(
    kind: str, tiny_config: Path, tmp_path: Path
) -> None:
    module, location = LOCATIONS[kind]
    pytest.importorskip(module)
    port = closed_port()
    config = pointed_at(tiny_config, location(port))
    env = {
        **os.environ,
        "BASEMODEL_SOURCE_ATTEMPTS": "2",
        "BASEMODEL_SOURCE_RETRY_BASE_S": "0.02",
        "TEST_REFUSED_PASSWORD": PASSWORD,
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
        "AWS_ACCESS_KEY_ID": "refused-key-id",
        "COLUMNS": "400",
    }
    for command in ("validate", "extract"):
        done = subprocess.run(
            [sys.executable, "-m", "basemodel_pipeline.cli", command, str(config)],
            capture_output=True,
            text=True,
            env=env,
            timeout=patient(60),
        )
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert done.returncode == 2, done.stderr
        assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
        assert "source 'transactions'" in errors[0] and f"127.0.0.1:{port}" in errors[0], errors[0]
        assert "still failing after 2 attempts" in errors[0]
        assert PASSWORD not in done.stderr + done.stdout and AWS_SECRET not in done.stderr + done.stdout
