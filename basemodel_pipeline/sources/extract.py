"""Extract a source into the workspace: events as one Parquet file per day, attribute tables as one file.

Rows come from the source's backend as Arrow record batches (sources.read_source's query: column
selection, where_condition, sql_lambdas, the date column as TIMESTAMP, events from data_start_date on).
DuckDB partitions them by day into a staging directory; each day is then sorted into its file and renamed
into place, so a killed run leaves either the old file or the new one. With a day range only the days in
[start, end) are rewritten. Transient source failures retry the whole range.

Extracts are deterministic: rows have a total order (the timestamp, then the entity id, then every other
column, NULLs last) and files are written by one ordered COPY, so re-extracting an unchanged day gives a
byte-identical file whatever order the source returned its rows in, and the cache sees nothing changed.

One writer per source: an extract holds an flock on extracts/<source>/.extract.lock for its whole run (the
kernel releases it if the process dies). A second extract of the same source (a full one and a day range,
two Dagster runs) logs "another extract of source X is running (pid N); waiting ..." and waits up to
LOCK_TIMEOUT_S, then fails with that line. Staging and spill directories are per run (owned temporaries,
files.claim_tmp); leftovers of killed runs are removed by the next extract. The files it wrote, with
their sizes and sha256, are recorded in extracts/<source>/.files.json (sources/extract_record.py).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from basemodel_pipeline import files as fs
from basemodel_pipeline import locks
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.config.models import DataSource, PipelineConfig
from basemodel_pipeline.dates import END_DAY
from basemodel_pipeline.errors import DataError, UserError
from basemodel_pipeline.progress import Progress
from basemodel_pipeline.sources import (
    DayRange,
    damaged,
    day_bound,
    event_day,
    events_from,
    query_for,
    run_with_backend,
    source_files,
    watermark,
    what,
)
from basemodel_pipeline.sources.base import Backend
from basemodel_pipeline.sources.extract_record import (
    begin_record,
    finish_record,
    in_range,
    own_files,
    read_record,
)
from basemodel_pipeline.sources.parquet import is_local
from basemodel_pipeline.sources.repeats import Repeats
from basemodel_pipeline.sources.sql import quote_ident, quote_literal

DAY_COLUMN = "__day"
CHUNK_DAYS = 31
STREAM_VIEW = "__batches"
LOCK_FILE = ".extract.lock"
LOCK_TIMEOUT_S = 3600.0  # how long an extract waits for another extract of the same source


def extract_source(
    cfg: PipelineConfig,
    src: DataSource,
    progress: Progress,
    days: DayRange | None = None,
    lock_timeout_s: float | None = LOCK_TIMEOUT_S,
) -> dict[str, Any]:
    """Extract one source. With `days` = (start, end), only event days in [start, end) are rewritten.
    Holds the source's writer lock throughout, waiting up to `lock_timeout_s` (None: for ever) for another
    extract of the same source to finish."""
    out = ws.extracts_dir(cfg, src.name)
    out.mkdir(parents=True, exist_ok=True)
    with locks.exclusive_lock(out / LOCK_FILE, f"extract of source {src.name}", lock_timeout_s, progress.log):
        fs.clean_stale_tmp(out)  # nobody else writes here now: any temporary is a killed run's
        record = read_record(out)
        refuse_foreign(out, src, own_files(out, record))
        missing = begin_record(out, record, days)
        try:
            result = _extract(cfg, src, progress, days, out)
        except Exception:
            with contextlib.suppress(OSError):  # a failed run's files are whole (each was renamed in)
                finish_record(out, missing)
            raise
        finish_record(out, missing)
        return result


def refuse_foreign(out: Path, src: DataSource, own: set[str] | None) -> None:
    """Refuse a directory holding *.parquet files the extract did not write (the cache reads every one as
    data, and the extract would delete a day file it finds stale): a name it never writes, or, once it keeps
    a record, a day file not in the record. Nothing of them is touched; one line names them."""
    event = src.type == "event"
    foreign = sorted(
        f.name
        for f in out.glob("*.parquet")
        if (day_of_file(f) is None if event else f.name != "table.parquet")
        or (own is not None and f.name not in own)
    )
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise UserError(
            f"{out / foreign[0]}{more}: not written by the extract of source {src.name}; move them out of {out} "
            "(the cache would read them as data), then extract again"
        )


def _extract(
    cfg: PipelineConfig, src: DataSource, progress: Progress, days: DayRange | None, out: Path
) -> dict[str, Any]:
    """extract_source's work, under the source's writer lock."""
    progress.start(f"extract {src.name}", None)

    # Local Parquet is all or nothing: its chunks' day files are staged and published together, so a damaged
    # page met in a later chunk leaves no day written. Remote chunks are published one by one (a failure
    # repeats one chunk, not the history).
    staged = fs.staging_dir(out / "chunks") if src.date_column is not None and is_local(src) else None
    target = staged or out

    def attempt(chunk: DayRange | None) -> Callable[[Backend], list[str]]:
        def run(backend: Backend) -> list[str]:
            reader = backend.execute(query_for(cfg, src, backend, chunk))
            if src.date_column is not None:
                return write_days(
                    reader,
                    target,
                    src.date_column.name,
                    cfg.cache.duckdb_memory_limit,
                    entity=src.main_entity_column,
                    threads=cfg.cache.threads,
                    repeats=repeats,
                )
            return write_table(reader, out, entity=src.main_entity_column, threads=cfg.cache.threads)

        return run

    future = 0
    repeats = Repeats()  # rows equal in every column to another, per day written
    source_files.check_files(src)  # the same file twice, mixed column types: one line before any read
    try:
        damaged.check_source(src, deep=False)  # footers: a truncated file fails before any day is written
        if src.type != "event":
            written = run_with_backend(cfg, src, attempt(None))
        else:
            future = beyond_bound(cfg, src, days, progress)  # before any day is written: `error` fails here
            written = []
            parts = chunks(cfg, src, days)
            i = 0
            while i < len(parts):  # one query and one retry unit per chunk of days
                got = run_with_backend(cfg, src, attempt(parts[i]))
                written += got
                i += 1
                if not got and i < len(parts):  # an empty chunk: skip the chunks before the next event day
                    i = next_chunk(cfg, src, parts, i)
            for name in written if staged is not None else []:  # every chunk written: publish them all
                os.replace(staged / name, out / name)
    except DataError:
        damaged.check_source(src)  # corrupt pages behind an intact footer: name the file
        raise
    finally:
        if staged is not None:
            fs.discard_dir(staged)
    if src.type == "event":
        for stale in out.glob("*.parquet"):  # days of the range that vanished from the source
            if stale.name not in written and in_range(stale.name, days):
                stale.unlink()
        future += future_events(cfg, src, out, progress)
        fs.fsync_dir(out)
    files = sorted(out.glob("*.parquet"))
    rows = sum(pq.read_metadata(f).num_rows for f in files)
    if rows == 0 and src.type == "event":
        raise DataError(f"{what(src)}: no events left after where_condition and data_start_date; check both")
    progress.advance(f"extract {src.name}", 1, rows=rows)
    return {
        "rows": rows,
        "files": len(files),
        "days_written": len(written) if src.type == "event" else 0,
        "path": str(out),
        "bytes": sum(f.stat().st_size for f in files),
        **({_left_out_key(cfg): future} if future else {}),
        **({"duplicate_rows": repeats.report(what(src), progress.log)} if src.type == "event" else {}),
    }


def _left_out_key(cfg: PipelineConfig) -> str:
    """The metadata key of the events an extract left out past its bound: after a historical data set's end
    when that end is the bound, future events otherwise (as beyond_bound and future_events decide)."""
    return "events_after_data_end_date" if _closed_at(cfg, day_bound(cfg)) else "future_events_dropped"


def beyond_bound(cfg: PipelineConfig, src: DataSource, days: DayRange | None, progress: Progress) -> int:
    """Count the events an extract leaves out, those from day_bound on, and apply data_params.future_events
    to them before anything is written: a handful of events stamped 2100-01-01 must neither move every default
    "as of" date to 2100 nor make the extract walk there in 31-day chunks (the watermark stops before them);
    events from END_DAY (2262-04-11) on are dropped whatever the policy. One query for the source's latest
    day (from statistics); the count only when that lies beyond the bound. Returns the number dropped."""
    bound = day_bound(cfg)
    if (days is not None and days[1] <= bound) or (last := event_day(cfg, src)) is None or last < bound:
        return 0
    rows, first, last = events_from(cfg, src, bound, days)
    if not rows:
        return 0
    if _closed_at(cfg, bound):
        return _past_end(cfg, src, rows, progress)
    if bound == END_DAY:
        progress.log(
            f"warning: {what(src)}: {rows} events are stamped on or after {END_DAY} ({first}..{last}), where the "
            "timestamps the pipeline stores end; they were dropped: fix the source's timestamps or exclude "
            "them with where_condition"
        )
        return rows
    return _future(cfg, src, rows, first, last, progress)


def _closed_at(cfg: PipelineConfig, bound: dt.date) -> bool:
    """Whether `bound` is the end of a historical data set (the day after data_params.data_end_date)."""
    closed = cfg.data_params.data_end_date
    return closed is not None and bound == closed + dt.timedelta(days=1)


def _past_end(cfg: PipelineConfig, src: DataSource, rows: int, progress: Progress) -> int:
    """Events after a historical data set's data_end_date: left out, counted, whatever future_events says."""
    progress.log(
        f"{what(src)}: {rows} events after data_params.data_end_date ({cfg.data_params.data_end_date}) are left out"
    )
    return rows


def _future(
    cfg: PipelineConfig, src: DataSource, rows: int, first: object, last: object, progress: Progress
) -> int:
    """data_params.future_events applied to `rows` events stamped after tomorrow: fail, or warn (dropped)."""
    cutoff = dt.datetime.now(dt.UTC).date() + dt.timedelta(days=1)  # a day of slack for time zones
    message = (
        f"{what(src)}: {rows} events are stamped after {cutoff} ({first}..{last}); fix the source's "
        "timestamps, or set data_params.future_events: keep if they are meant to be ahead"
    )
    if cfg.data_params.future_events == "error":
        raise DataError(message)
    progress.log(f"warning: {message}. They were dropped")
    return rows


def future_events(cfg: PipelineConfig, src: DataSource, out: Path, progress: Progress) -> int:
    """Apply data_params.future_events to day files after tomorrow (UTC) that an extract keeps from an earlier
    run (written under future_events: keep): the extract itself stops before them (beyond_bound). Returns the
    number of events dropped."""
    bound = day_bound(cfg)
    cutoff = bound - dt.timedelta(days=1)
    ahead = [f for f in sorted(out.glob("*.parquet")) if (d := day_of_file(f)) is not None and d > cutoff]
    closed = _closed_at(cfg, bound)
    if not ahead or (cfg.data_params.future_events == "keep" and not closed):
        return 0
    rows = sum(pq.read_metadata(f).num_rows for f in ahead)
    for f in ahead:
        f.unlink()
    if closed:
        return _past_end(cfg, src, rows, progress)
    return _future(cfg, src, rows, ahead[0].stem, ahead[-1].stem, progress)


def day_of_file(path: Path) -> dt.date | None:
    """The day of a day file `yyyy-mm-dd.parquet` (None for other files)."""
    try:
        return dt.date.fromisoformat(path.stem)
    except ValueError:
        return None


def chunks(cfg: PipelineConfig, src: DataSource, days: DayRange | None) -> list[DayRange]:
    """Day ranges to extract one by one, for every backend: chunks of CHUNK_DAYS from data_start_date to the
    watermark (or of the range asked for, up to day_bound), so a transient failure repeats one chunk, not the
    history, and no single query sorts, nor DuckDB's partitioned day write buffers, years of events. The
    buffers of that write sit outside DuckDB's memory limit: one scan of 50M local events peaked at 2,270 MB,
    31-day chunks at 593 MB in 0.93x the time (docs/benchmarks.md, "Memory")."""
    if days is None:
        last = watermark(cfg, src)  # before day_bound
        if last is None:
            return []
        days = (cfg.data_params.data_start_date, last + dt.timedelta(days=1))
    start, end = days[0], min(days[1], day_bound(cfg))
    out: list[DayRange] = []
    while start < end:
        stop = min(end, start + dt.timedelta(days=CHUNK_DAYS))
        out.append((start, stop))
        start = stop
    return out


def next_chunk(cfg: PipelineConfig, src: DataSource, parts: list[DayRange], i: int) -> int:
    """After an empty chunk: the index of the first chunk from parts[i] on that holds the source's next event
    day (len(parts) when none does). One MIN query, so a gap of years (events kept far ahead, a day range
    asked up to 2262) costs one query instead of one per 31 days."""
    following = event_day(cfg, src, latest=False, days=(parts[i][0], parts[-1][1]))
    while i < len(parts) and (following is None or parts[i][1] <= following):
        i += 1
    return i


def _duckdb(
    memory_limit: str | None = None, spill: Path | None = None, threads: int | None = None
) -> duckdb.DuckDBPyConnection:
    """DuckDB for writing extracts; with a memory limit, the day sort spills to `spill` instead of growing."""
    config: dict[str, Any] = (
        {"memory_limit": memory_limit, "temp_directory": str(spill)} if memory_limit and spill else {}
    )
    if threads:
        config["threads"] = threads
    con = duckdb.connect(config=config)
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET preserve_insertion_order = false")
    return con


def _normalised(reader: pa.RecordBatchReader, ts: str | None) -> str:
    """SELECT over the registered stream with the date column as a plain TIMESTAMP (UTC wall time)."""
    if ts is None:
        return f"SELECT * FROM {STREAM_VIEW}"
    col = quote_ident(ts)
    return f"SELECT * REPLACE (CAST({col} AS TIMESTAMP) AS {col}) FROM {STREAM_VIEW}"


def row_order(columns: list[str], first: list[str | None]) -> str:
    """ORDER BY list of a total row order: the `first` columns present (matched case-insensitively), then
    every other column in schema order; ascending, NULLs last whatever DuckDB's default null order."""
    lower = {c.lower(): c for c in columns}
    lead = [lower[f.lower()] for f in first if f is not None and f.lower() in lower]
    keys = list(dict.fromkeys([*lead, *columns]))
    return ", ".join(f"{quote_ident(c)} ASC NULLS LAST" for c in keys)


def check_entity_type(schema: pa.Schema, entity: str | None, label: str) -> str | None:
    """The entity column's name in `schema` (matched case-insensitively); an id that is a float, a list or a
    struct cannot key entities (1.0 and 1 would split or merge them): one line, before anything is written."""
    if entity is None:
        return None
    found = next((n for n in schema.names if n.lower() == entity.lower()), None)
    if found is None:
        return None  # the query's own error names a missing column
    dtype = schema.field(found).type
    if not (pa.types.is_integer(dtype) or pa.types.is_string(dtype) or pa.types.is_large_string(dtype)):
        raise DataError(
            f"{label}: entity column {found} is {dtype}; entity ids must be integers or text: cast them in "
            "the source (or write ids the same way in every source); `basemodel validate CONFIG` lists such problems"
        )
    return found


def check_entity_nulls(con: duckdb.DuckDBPyConnection, relation: str, column: str | None, label: str) -> None:
    """Rows without an entity id belong to nobody: refuse them before any file is put in place."""
    if column is None:
        return
    row = con.execute(f"SELECT count(*) FROM {relation} WHERE {quote_ident(column)} IS NULL").fetchone()
    if row and row[0]:
        raise DataError(
            f"{label}: {row[0]} rows have no {column} (a null entity id); drop them in the source or with "
            "where_condition, then extract again"
        )


def write_sorted(con: duckdb.DuckDBPyConnection, select: str, order: str, target: Path) -> None:
    """COPY `select` in the total row `order` into one Parquet file, row order preserved across threads
    (DuckDB then cuts fixed-size row groups), so equal rows give equal bytes."""
    con.execute("SET preserve_insertion_order = true")
    con.execute(
        f"COPY ({select} ORDER BY {order}) TO {quote_literal(str(target))} (FORMAT parquet, COMPRESSION zstd)"
    )


def write_table(
    reader: pa.RecordBatchReader, out: Path, entity: str | None = None, threads: int | None = None
) -> list[str]:
    """Write an attribute table to table.parquet in a total row order (entity column first when given)."""
    target = out / "table.parquet"
    column = check_entity_type(reader.schema, entity, f"source '{out.name}'")
    tmp = fs.claim_tmp(target)
    con = _duckdb(threads=threads)
    try:
        con.register(STREAM_VIEW, reader)
        write_sorted(con, _normalised(reader, None), row_order(reader.schema.names, [entity]), tmp)
        check_entity_nulls(con, f"read_parquet({quote_literal(str(tmp))})", column, f"source '{out.name}'")
        os.replace(tmp, target)
    finally:
        con.close()
        tmp.unlink(missing_ok=True)
        fs.release_tmp(tmp)
    fs.fsync_dir(out)
    return [target.name]


def write_days(
    reader: pa.RecordBatchReader,
    out: Path,
    ts: str,
    memory_limit: str | None = None,
    entity: str | None = None,
    threads: int | None = None,
    repeats: Repeats | None = None,
) -> list[str]:
    """Partition the stream by day of the date column `ts`, then write each day in the total row order
    (`ts`, `entity`, every other column) and rename it into place. Returns the names written.
    With `memory_limit` (cache.duckdb_memory_limit) the sorts spill to disk beside the output; with
    `repeats`, each day's rows equal in every column to another are counted into it."""
    column = check_entity_type(reader.schema, entity, f"source '{out.name}'")
    staging = fs.staging_dir(out / "staging")  # per run: another writer's never shares it
    spill = fs.claim_tmp(out / "spill")
    con = _duckdb(memory_limit, spill, threads)
    col = quote_ident(ts)
    order = row_order(reader.schema.names, [ts, entity])
    written = []
    try:
        con.register(STREAM_VIEW, reader)
        con.execute(
            f"COPY (SELECT *, strftime({col}, '%Y-%m-%d') AS {DAY_COLUMN} FROM ({_normalised(reader, ts)})) "
            f"TO {quote_literal(str(staging / 'days'))} (FORMAT parquet, PARTITION_BY ({DAY_COLUMN}))"
        )
        if any((staging / "days").glob("*/*.parquet")):
            staged = quote_literal(str(staging / "days" / "*" / "*.parquet"))
            check_entity_nulls(
                con, f"read_parquet({staged}, hive_partitioning = false)", column, f"source '{out.name}'"
            )
        for part in sorted((staging / "days").glob(f"{DAY_COLUMN}=*")):
            day = part.name.split("=", 1)[1]
            target = out / f"{day}.parquet"
            tmp = staging / f"{day}.parquet"
            select = f"SELECT * FROM read_parquet({quote_literal(str(part / '*.parquet'))}, hive_partitioning = false)"
            write_sorted(con, select, order, tmp)
            _fsync(tmp)
            if repeats is not None:
                repeats.count(target.name, tmp)
            os.replace(tmp, target)
            written.append(target.name)
    finally:
        con.close()
        fs.discard_dir(staging)
        fs.discard_dir(spill)
    fs.fsync_dir(out)
    return written


def _fsync(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())
