"""s3:// Parquet against moto's S3 server on 127.0.0.1: DuckDB httpfs (installed offline) and pyarrow."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_sources_support import local_extract, read_extract, relocate, s3_server  # noqa: F401

from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.pipeline import run_extract
from basemodel_pipeline.sources import open_backend, watermark


def upload_split(s3: dict[str, Any], table: pa.Table, bucket: str, prefix: str, parts: int = 2) -> None:
    client = s3["client"]
    size = -(-table.num_rows // parts)
    for i in range(parts):
        sink = pa.BufferOutputStream()
        pq.write_table(table.slice(i * size, size), sink)
        client.put_object(Bucket=bucket, Key=f"{prefix}/part-{i}.parquet", Body=sink.getvalue().to_pybytes())


@pytest.fixture
def s3_config(tiny_config: Path, s3_server: dict[str, Any], monkeypatch: pytest.MonkeyPatch):  # noqa: F811
    """tiny_config with transactions in a fresh bucket; the secret comes from ${TEST_S3_SECRET}."""
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    s3_server["client"].create_bucket(Bucket=bucket)
    table = pq.read_table(tiny_config.parent / "data" / "transactions.parquet")
    upload_split(s3_server, table, bucket, "events/transactions")
    monkeypatch.setenv("TEST_S3_SECRET", s3_server["aws_secret_access_key"])

    def make(engine: str, path: str = "events/transactions/", **extra: Any) -> Path:
        location = {
            "database_type": "parquet",
            "path": f"s3://{bucket}/{path}",
            "engine": engine,
            "s3": {
                "endpoint": s3_server["endpoint"],
                "access_key_id": s3_server["aws_access_key_id"],
                "secret_access_key": "${TEST_S3_SECRET}",
                "use_ssl": False,
                "url_style": "path",
            },
            **extra,
        }
        config = tiny_config.with_name(f"config-{engine}.yaml")
        config.write_text(tiny_config.read_text())
        return relocate(config, {"transactions": location})

    make.bucket = bucket  # type: ignore[attr-defined]
    return make


@pytest.mark.parametrize(("engine", "reader"), [("duckdb", "duckdb-httpfs"), ("pyarrow", "pyarrow-s3")])
def test_s3_extract_matches_local(tiny_config: Path, s3_config, engine: str, reader: str) -> None:
    expected = local_extract(tiny_config, "transactions")
    cfg = load_config(s3_config(engine))
    src = cfg.source("transactions")
    with open_backend(cfg, src) as backend:
        assert backend.engine == reader
    meta = run_extract(cfg, "transactions")["transactions"]
    assert read_extract(meta["path"]).equals(expected)
    assert (
        watermark(cfg, src)
        == max(
            pq.read_table(tiny_config.parent / "data" / "transactions.parquet")[
                "transaction_timestamp"
            ].to_pylist()
        ).date()
    )
    if engine == "duckdb":  # httpfs came from the wheel into the workspace, not ~/.duckdb
        assert list((Path(cfg.workspace) / ".duckdb" / "extensions").rglob("httpfs.duckdb_extension"))


def test_s3_cache_path_copies_only_new_files(tiny_config: Path, s3_config, s3_server) -> None:  # noqa: F811
    cache = tiny_config.parent / "s3cache"
    cfg = load_config(s3_config("auto", cache_path=str(cache)))
    run_extract(cfg, "transactions")
    copied = {p: p.stat().st_mtime_ns for p in cache.rglob("*.parquet")}
    assert len(copied) == 2
    table = pq.read_table(tiny_config.parent / "data" / "transactions.parquet").slice(0, 5)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    s3_server["client"].put_object(
        Bucket=s3_config.bucket, Key="events/transactions/part-9.parquet", Body=sink.getvalue().to_pybytes()
    )
    meta = run_extract(cfg, "transactions")["transactions"]
    now = {p: p.stat().st_mtime_ns for p in cache.rglob("*.parquet")}
    assert len(now) == 3
    assert all(now[p] == t for p, t in copied.items())  # unchanged objects were not copied again
    assert meta["rows"] > 0


@pytest.mark.parametrize("engine", ["duckdb", "pyarrow"])
def test_s3_missing_prefix_fails_fast_without_secret(s3_config, engine: str) -> None:
    cfg = load_config(s3_config(engine, path="nothing/here/"))
    with pytest.raises(DataError) as info:
        run_extract(cfg, "transactions")
    message = str(info.value)
    assert "source 'transactions'" in message and "nothing/here" in message
    assert "testing-secret-123" not in message
    assert "attempts" not in message  # permanent: no retries
