"""Writers of predictions and embeddings: Parquet / CSV / TSV files and warehouse tables.

    writer = open_writer(cfg, "predictions", scenario, as_of, destination=None)
    try:
        for chunk in chunks:
            writer.write(chunk)          # pyarrow.Table, streamed: memory bounded by one chunk
        info = writer.close()            # {"rows", "destination", "format", ...}
    except BaseException:
        writer.abort()                   # nothing partial becomes visible
        raise

Files are written to a staging directory published atomically at close; warehouse rows go to a staging
table and replace the (scenario, as_of) slice of the target table in one step, so a re-run gives the same
table and an aborted run changes nothing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.config.outputs import FileOutput
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.outputs.base import DATASETS, Writer

__all__ = ["DATASETS", "Writer", "open_writer", "write_parquet_parts", "write_table"]

WAREHOUSE_WRITERS = {
    "snowflake": "basemodel_pipeline.outputs.snowflake:SnowflakeWriter",
    "bigquery": "basemodel_pipeline.outputs.bigquery:BigQueryWriter",
    "databricks": "basemodel_pipeline.outputs.databricks:DatabricksWriter",
    "clickhouse": "basemodel_pipeline.outputs.clickhouse:ClickHouseWriter",
}


def open_writer(
    cfg: PipelineConfig,
    dataset: str,
    scenario: str | None,
    as_of: dt.date,
    destination: str | None = None,
    subset: str | None = None,
) -> Writer:
    """A writer of `dataset` ("predictions" or "embeddings") for one (scenario, as_of) to a named destination
    of the config's `outputs` section (default: outputs.default, else Parquet in the workspace). With
    `subset` (file destinations only) it writes the named subset beside the full table instead."""
    if dataset not in DATASETS:
        raise UserError(f"dataset must be one of {', '.join(DATASETS)}, not {dataset!r}")
    if dataset == "predictions" and not scenario:
        raise UserError("writing predictions needs a scenario name")
    name, dest = cfg.outputs.destination(destination)
    if isinstance(dest, FileOutput):
        from basemodel_pipeline.outputs.files import FileWriter

        return FileWriter(cfg, name, dest, dataset, scenario, as_of, subset)
    if subset is not None:
        raise UserError(f"output '{name}' ({dest.kind}) takes whole tables; write subset '{subset}' to files")
    import importlib

    module, _, cls_name = WAREHOUSE_WRITERS[dest.kind].partition(":")
    try:
        cls = getattr(importlib.import_module(module), cls_name)
    except ImportError as exc:
        raise UserError(
            f"output destination '{name}' (kind {dest.kind}) needs the connectors extra: pip install "
            f"'basemodel_pipeline[connectors]' ({exc.name} is missing)"
        ) from None
    return cls(cfg, name, dest, dataset, scenario, as_of)


def write_table(writer: Writer, chunks: Iterable[pa.Table | pa.RecordBatch]) -> dict[str, Any]:
    """Write every chunk and close; abort on any error (helper for callers without their own loop)."""
    try:
        for chunk in chunks:
            writer.write(chunk)
        return writer.close()
    except BaseException:
        writer.abort()
        raise


def write_parquet_parts(writer: Writer, parts: Iterable[Path], batch_rows: int = 65_536) -> dict[str, Any]:
    """Stream Parquet files (e.g. one per scoring shard) through one writer: one slice, replaced once."""

    def batches() -> Iterator[pa.RecordBatch]:
        for part in parts:
            yield from pq.ParquetFile(part).iter_batches(batch_size=batch_rows)

    return write_table(writer, batches())
