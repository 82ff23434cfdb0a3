"""Data sources: read a configured source (Parquet, warehouses) and extract it into the workspace."""

from __future__ import annotations

import datetime as dt

import duckdb

from basemodel_pipeline.config.models import DataSource, PipelineConfig
from basemodel_pipeline.errors import DataError


def watermark(cfg: PipelineConfig, src: DataSource) -> dt.date | None:
    """The latest event day available in an event source (None when it has no events).

    One cheap aggregate (`max` of the date column; Parquet answers it from row-group statistics). A
    sensor compares it with the newest extracted day to decide which days to extract.
    """
    from basemodel_pipeline.sources.parquet import describe, read_parquet_sql, timestamp_expr

    if src.date_column is None:
        raise DataError(f"source '{src.name}' is of type '{src.type}'; only event sources have a watermark")
    con = duckdb.connect()
    try:
        available = describe(con, src)
        sql = f"SELECT max({timestamp_expr(src, available)}) FROM {read_parquet_sql(src.data_location.path)}"
        value = con.execute(sql).fetchone()[0]
    finally:
        con.close()
    return None if value is None else value.date()
