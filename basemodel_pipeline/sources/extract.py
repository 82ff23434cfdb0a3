"""Extract a source into the workspace: events as one Parquet file per day, attribute tables as one file.

Event extracts normalise the date column to TIMESTAMP, apply the column selection and where_condition,
and drop events before data_start_date. Every file is written to a temporary name and renamed, so a killed
run leaves either the old file or the new one; re-running rewrites the same content.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path
from typing import Any

import duckdb

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.config.models import DataSource, PipelineConfig
from basemodel_pipeline.progress import Progress
from basemodel_pipeline.sources.parquet import (
    describe,
    parsed_where,
    quote_ident,
    quote_literal,
    read_parquet_sql,
    selected_columns,
    timestamp_expr,
)

DAY_COLUMN = "__day"


DayRange = tuple[dt.date, dt.date]


def source_select_sql(
    cfg: PipelineConfig, src: DataSource, available: dict[str, str], days: DayRange | None = None
) -> str:
    cols = selected_columns(src, available)
    items = []
    for c in cols:
        if src.date_column is not None and c == src.date_column.name:
            items.append(f"{timestamp_expr(src, available)} AS {quote_ident(c)}")
        else:
            items.append(quote_ident(c))
    conditions = []
    where = parsed_where(src)
    if where:
        conditions.append(f"({where})")
    if src.date_column is not None:
        start = quote_literal(cfg.data_params.data_start_date.isoformat())
        conditions.append(f"{timestamp_expr(src, available)} >= CAST({start} AS TIMESTAMP)")
        if days is not None:
            lo, hi = (quote_literal(d.isoformat()) for d in days)
            conditions.append(f"{timestamp_expr(src, available)} >= CAST({lo} AS TIMESTAMP)")
            conditions.append(f"{timestamp_expr(src, available)} < CAST({hi} AS TIMESTAMP)")
    sql = f"SELECT {', '.join(items)} FROM {read_parquet_sql(src.data_location.path)}"
    if conditions:
        sql += " WHERE " + " AND ".join(conditions)
    return sql


def extract_source(
    cfg: PipelineConfig, src: DataSource, progress: Progress, days: DayRange | None = None
) -> dict[str, Any]:
    """Extract one source. With `days` = (start, end), only event days in [start, end) are rewritten."""
    out = ws.extracts_dir(cfg, src.name)
    out.mkdir(parents=True, exist_ok=True)
    ws.clean_stale_tmp(out)
    progress.start(f"extract {src.name}", None)
    con = duckdb.connect()
    try:
        available = describe(con, src)
        select = source_select_sql(cfg, src, available, days if src.type == "event" else None)
        if src.type == "event":
            files, rows = _extract_days(con, src, select, out, days)
        else:
            files, rows = _extract_table(con, select, out)
    except duckdb.Error as exc:
        from basemodel_pipeline.errors import DataError

        msg = str(exc).splitlines()[0]
        raise DataError(
            f"source '{src.name}' ({src.data_location.path}): DuckDB could not read it: {msg}"
        ) from None
    finally:
        con.close()
    progress.advance(f"extract {src.name}", 1, rows=rows)
    return {
        "rows": rows,
        "files": files,
        "path": str(out),
        "bytes": sum(f.stat().st_size for f in out.glob("*.parquet")),
    }


def _extract_table(con: duckdb.DuckDBPyConnection, select: str, out: Path) -> tuple[int, int]:
    target = out / "table.parquet"
    tmp = out / ".table.parquet.tmp"
    con.execute(f"COPY ({select}) TO {quote_literal(str(tmp))} (FORMAT parquet, COMPRESSION zstd)")
    rows = con.execute(f"SELECT count(*) FROM read_parquet({quote_literal(str(tmp))})").fetchone()[0]
    os.replace(tmp, target)
    ws.fsync_dir(out)
    return 1, int(rows)


def _in_range(name: str, days: DayRange | None) -> bool:
    """Whether the day file `yyyy-mm-dd.parquet` belongs to the extracted range (all days when None)."""
    if days is None:
        return True
    try:
        day = dt.date.fromisoformat(name.removesuffix(".parquet"))
    except ValueError:
        return False
    return days[0] <= day < days[1]


def _extract_days(
    con: duckdb.DuckDBPyConnection, src: DataSource, select: str, out: Path, days_range: DayRange | None
) -> tuple[int, int]:
    assert src.date_column is not None
    ts = quote_ident(src.date_column.name)
    staging = out / ".staging.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    con.execute(
        f"COPY (SELECT *, strftime({ts}, '%Y-%m-%d') AS {DAY_COLUMN} FROM ({select}) ORDER BY {ts}) "
        f"TO {quote_literal(str(staging))} (FORMAT parquet, PARTITION_BY ({DAY_COLUMN}), COMPRESSION zstd)"
    )
    rows = 0
    days = set()
    for part in sorted(staging.glob(f"{DAY_COLUMN}=*")):
        day = part.name.split("=", 1)[1]
        files = sorted(part.glob("*.parquet"))
        target = out / f"{day}.parquet"
        if len(files) == 1:
            os.replace(files[0], target)
        else:  # DuckDB split the day into several files: merge them into one
            merged = part / "merged.parquet"
            con.execute(
                f"COPY (SELECT * FROM read_parquet({quote_literal(str(part / '*.parquet'))})) "
                f"TO {quote_literal(str(merged))} (FORMAT parquet, COMPRESSION zstd)"
            )
            os.replace(merged, target)
        days.add(target.name)
    for stale in out.glob("*.parquet"):  # days of the range that vanished from the source
        if stale.name not in days and _in_range(stale.name, days_range):
            stale.unlink()
    shutil.rmtree(staging, ignore_errors=True)
    ws.fsync_dir(out)
    if any(out.glob("*.parquet")):
        rows = con.execute(
            f"SELECT count(*) FROM read_parquet({quote_literal(str(out / '*.parquet'))})"
        ).fetchone()[0]
    if rows == 0:
        from basemodel_pipeline.errors import DataError

        raise DataError(
            f"source '{src.name}' ({src.data_location.path}): no events left after where_condition and "
            f"data_start_date; check both"
        )
    return len(list(out.glob("*.parquet"))), int(rows)
