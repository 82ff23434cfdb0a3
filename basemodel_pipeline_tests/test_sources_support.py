"""Helpers for the source tests: config edits and servers started once per test session on free ports."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from basemodel_pipeline.config import load_config


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def edit_config(config: Path, mutate: Callable[[dict[str, Any]], None]) -> Path:
    raw = yaml.safe_load(config.read_text())
    mutate(raw)
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


def relocate(config: Path, locations: dict[str, dict[str, Any]], **source_fields: Any) -> Path:
    """Point the named sources of a config at new data_locations (and set extra fields on them)."""

    def mutate(raw: dict[str, Any]) -> None:
        for src in raw["data_sources"]:
            if src["name"] in locations:
                src["data_location"] = locations[src["name"]]
                src.update(source_fields.get(src["name"], {}))

    return edit_config(config, mutate)


def local_extract(config: Path, source: str) -> Any:
    """The extract of `source` from the local Parquet config, as one Arrow table sorted for comparison."""
    from basemodel_pipeline.pipeline import run_extract

    cfg = load_config(config)
    meta = run_extract(cfg, source)[source]
    return read_extract(meta["path"])


def read_extract(path: str | Path) -> Any:
    files = sorted(Path(path).glob("*.parquet"))
    table = pq.ParquetDataset(files).read() if files else None
    assert table is not None
    return table.sort_by([(c, "ascending") for c in table.column_names])


@pytest.fixture(scope="session")
def s3_server() -> Iterator[dict[str, Any]]:
    """moto's S3 server on 127.0.0.1 and a boto3 client for it."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing-secret-123"}
    client = boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1", **creds)
    try:
        yield {"endpoint": f"{host}:{port}", "client": client, **creds}
    finally:
        server.stop()


def sql_value(value: Any) -> Any:
    return value.isoformat(sep=" ") if hasattr(value, "isoformat") and not isinstance(value, str) else value


def load_tables(
    cursor: Any, data_dir: Path, names: list[str], types: dict[str, str], placeholder: str = "%s"
) -> None:
    """CREATE TABLE + INSERT every tiny-dataset Parquet table through a DB-API cursor (unquoted names)."""
    import pyarrow as pa

    for name in names:
        table = pq.read_table(data_dir / f"{name}.parquet")
        cols = []
        for field in table.schema:
            kind = (
                "TIMESTAMP"
                if pa.types.is_timestamp(field.type)
                else types["float"]
                if pa.types.is_floating(field.type)
                else types["int"]
                if pa.types.is_integer(field.type)
                else types["text"]
            )
            cols.append(f"{field.name} {kind}")
        cursor.execute(f"CREATE TABLE {name} ({', '.join(cols)})")
        rows = [tuple(sql_value(v) for v in row.values()) for row in table.to_pylist()]
        marks = ", ".join([placeholder] * table.num_columns)
        cursor.executemany(f"INSERT INTO {name} VALUES ({marks})", rows)
