"""Data sources: one interface over Parquet (local, s3://) and the warehouses.

    read_source(cfg, src, days)   Arrow record batches of a source (selection, where_condition,
                                  sql_lambdas, date column as TIMESTAMP, optional attribute joins)
    watermark(cfg, src)           the latest event day in a source before day_bound (one cheap MAX query)
    events_from(cfg, src, day)    how many events lie from a day on (those an extract leaves out)
    source_schema(cfg, src)       column name -> DuckDB type name

The SQL is built once (sources.sql) and rendered in each backend's dialect by sqlglot.
"""

from __future__ import annotations

import datetime as dt
import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pyarrow as pa

from basemodel_pipeline.config.models import DataSource, PipelineConfig
from basemodel_pipeline.dates import END_DAY
from basemodel_pipeline.errors import ConfigError, DataError
from basemodel_pipeline.retry import with_retry
from basemodel_pipeline.sources.base import Backend
from basemodel_pipeline.sources.sql import (
    Join,
    count_from_query,
    resolve,
    source_query,
    source_select,
    timestamp_query,
)

T = TypeVar("T")
DayRange = tuple[dt.date, dt.date]

BACKENDS = {
    "parquet": "basemodel_pipeline.sources.parquet:ParquetBackend",
    "snowflake": "basemodel_pipeline.sources.snowflake:SnowflakeBackend",
    "bigquery": "basemodel_pipeline.sources.bigquery:BigQueryBackend",
    "clickhouse": "basemodel_pipeline.sources.clickhouse:ClickHouseBackend",
    "databricks": "basemodel_pipeline.sources.databricks:DatabricksBackend",
    "synapse": "basemodel_pipeline.sources.synapse:SynapseBackend",
    "hive": "basemodel_pipeline.sources.hive:HiveBackend",
}


def backend_class(database_type: str) -> type[Backend]:
    module, _, name = BACKENDS[database_type].partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise ConfigError(
            f"database_type '{database_type}' needs the connectors extra: pip install "
            f"'basemodel_pipeline[connectors]' ({exc.name} is missing)"
        ) from None


def what(src: DataSource) -> str:
    return f"source '{src.name}' ({src.data_location.display()})"


def open_backend(cfg: PipelineConfig, src: DataSource) -> Backend:
    return backend_class(src.data_location.database_type)(src, Path(cfg.workspace))


def retrying(src: DataSource, cls: type[Backend], fn: Callable[[], T], label: str | None = None) -> T:
    """fn retried on the backend's transient failures; a failure names the source (or `label`) and, when the
    connection failed, the backend's host:port; the location's secrets are masked."""
    loc = src.data_location
    return with_retry(
        fn,
        what=label or what(src),
        is_transient=cls.is_transient,
        where=cls.endpoint(loc),
        secrets=cls.secrets(loc),
    )


def run_with_backend(cfg: PipelineConfig, src: DataSource, fn: Callable[[Backend], T]) -> T:
    """Open the source, call fn, close; the whole attempt is retried on transient failures."""
    cls = backend_class(src.data_location.database_type)

    def attempt() -> T:
        with cls(src, Path(cfg.workspace)) as backend:
            return fn(backend)

    return retrying(src, cls, attempt)


def same_database(a: DataSource, b: DataSource) -> bool:
    """Whether two sources can be joined in one query (same backend and connection)."""
    la, lb = a.data_location, b.data_location
    if la.database_type == lb.database_type == "parquet":  # one DuckDB reads both: local files only
        return "://" not in la.path and "://" not in lb.path
    return la.database_type == lb.database_type and getattr(la, "connection_params", None) == getattr(
        lb, "connection_params", None
    )


def _joins(cfg: PipelineConfig, src: DataSource, backend: Backend, available: dict[str, str]) -> list[Join]:
    joins = []
    for j in src.joined_data_sources:
        attr = cfg.source(j.name)
        if not same_database(src, attr):
            raise ConfigError(
                f"source '{src.name}': joined source '{attr.name}' lives in another database; joins in the "
                "source need both tables in one database (the cache joins extracts of any two sources)"
            )
        other = type(backend)(attr, backend.workspace)
        try:
            attr_cols = other.schema()
            table = other.table()
        finally:
            other.close()
        own = {c.lower() for c in available}
        keys = {c.lower() for c in j.join_on.values()}
        cols = [c for c in attr_cols if c.lower() not in own and c.lower() not in keys]
        on = {a: resolve(b, attr_cols) or b for a, b in j.join_on.items()}
        joins.append(Join(attr, table, on, cols))
    return joins


def query_for(
    cfg: PipelineConfig,
    src: DataSource,
    backend: Backend,
    days: DayRange | None = None,
    *,
    join_attributes: bool = False,
    limit: int | None = None,
) -> str:
    available = backend.schema()
    joins = _joins(cfg, src, backend, available) if join_attributes else []
    start = cfg.data_params.data_start_date if src.date_column is not None else None
    return source_query(
        src,
        backend.table(),
        available,
        backend.dialect,
        location=src.data_location.display(),
        start=start,
        days=days if src.date_column is not None else None,
        joins=joins,
        limit=limit,
    )


@contextmanager
def read_source(
    cfg: PipelineConfig,
    src: DataSource,
    days: DayRange | None = None,
    *,
    join_attributes: bool = False,
    limit: int | None = None,
) -> Iterator[pa.RecordBatchReader]:
    """Stream a source's rows (events in [days[0], days[1]) when given) as Arrow record batches.

    Opening the query is retried on transient failures; a failure while streaming propagates (callers
    that write files retry the whole range, see sources.extract).
    """

    def start(backend: Backend) -> tuple[Backend, pa.RecordBatchReader]:
        return backend, backend.execute(
            query_for(cfg, src, backend, days, join_attributes=join_attributes, limit=limit)
        )

    cls = backend_class(src.data_location.database_type)

    def attempt() -> tuple[Backend, pa.RecordBatchReader]:
        backend = cls(src, Path(cfg.workspace))
        try:
            return start(backend)
        except BaseException:
            backend.close()
            raise

    backend, reader = retrying(src, cls, attempt)
    try:
        yield reader
    finally:
        backend.close()


def source_schema(cfg: PipelineConfig, src: DataSource) -> dict[str, str]:
    """Column name -> DuckDB type name of a source's table."""
    return run_with_backend(cfg, src, lambda b: b.schema())


def day_bound(cfg: PipelineConfig, today: dt.date | None = None) -> dt.date:
    """The first event day extracts leave out: the day after tomorrow (UTC), so that a handful of events
    stamped 2100 or 9999 neither move the data's end nor make the extract walk to them, unless
    data_params.future_events is keep; END_DAY (2262-04-11, where nanosecond timestamps end) at the latest;
    the day after data_params.data_end_date for a historical data set."""
    closed = cfg.data_params.data_end_date
    end = END_DAY if closed is None else min(END_DAY, closed + dt.timedelta(days=1))
    if cfg.data_params.future_events == "keep":
        return end
    today = today or dt.datetime.now(dt.UTC).date()
    return min(end, today + dt.timedelta(days=2))


def _day(value: pa.Scalar) -> dt.date | None:
    """The day of a timestamp or date scalar; one past Python's dates (DuckDB goes to the year 294247) is
    date.max."""
    try:
        value = value.as_py()
    except (ValueError, OverflowError):
        return dt.date.max
    if value is None:
        return None
    return value.date() if isinstance(value, dt.datetime) else value


def event_day(
    cfg: PipelineConfig,
    src: DataSource,
    latest: bool = True,
    days: tuple[dt.date | None, dt.date | None] = (None, None),
) -> dt.date | None:
    """The latest (or earliest) event day of a source in [days[0], days[1]) (open where None); None when there
    is none. Without `days`, one query that Parquet answers from row-group statistics."""
    if src.date_column is None:
        raise DataError(f"source '{src.name}' is of type '{src.type}'; only event sources have a watermark")

    def query(backend: Backend) -> dt.date | None:
        sql = timestamp_query(
            src, backend.table(), backend.schema(), backend.dialect, latest=latest, days=days
        )
        table = backend.execute(sql).read_all()
        return _day(table.column(0)[0]) if table.num_rows else None

    return run_with_backend(cfg, src, query)


def watermark(cfg: PipelineConfig, src: DataSource) -> dt.date | None:
    """The latest event day available in an event source (None when it has no events), before day_bound:
    events stamped far ahead do not count (the extract drops and counts them).

    One aggregate query (MAX of the date column; Parquet answers it from row-group statistics), and a second
    one, over the days before the bound, only when the first lies beyond it. A Dagster sensor compares it
    with the newest extracted day to decide which days to extract.
    """
    last = event_day(cfg, src)
    bound = day_bound(cfg)
    if last is None or last < bound:
        return last
    return event_day(cfg, src, days=(None, bound))


def events_from(
    cfg: PipelineConfig, src: DataSource, day: dt.date, days: DayRange | None = None
) -> tuple[int, dt.date | None, dt.date | None]:
    """(count, first day, last day) of a source's events from `day` on, as the extract selects them
    (where_condition, from data_start_date, within `days` when given)."""

    def query(backend: Backend) -> tuple[int, dt.date | None, dt.date | None]:
        available = backend.schema()
        rows = source_select(
            src,
            backend.table(),
            available,
            backend.dialect,
            location=src.data_location.display(),
            start=cfg.data_params.data_start_date,
            days=days,
        )
        table = backend.execute(count_from_query(src, rows, day, backend.dialect)).read_all()
        count, first, last = (table.column(i)[0] for i in range(3))
        return int(count.as_py() or 0), _day(first), _day(last)

    return run_with_backend(cfg, src, query)


def sample_rows(
    cfg: PipelineConfig, src: DataSource, rows: int, columns: list[str] | None = None
) -> pa.Table:
    """Up to `rows` raw rows of a source's table (SELECT * or the named columns, no filter): for checks
    and config suggestions. Types follow the source's Arrow output."""
    from sqlglot import exp

    from basemodel_pipeline.sources.sql import SOURCE_ALIAS, column

    def query(backend: Backend) -> pa.Table:
        items = [column(c) for c in columns] if columns else [exp.Star()]
        select = exp.select(*items).from_(exp.alias_(backend.table(), SOURCE_ALIAS, table=True)).limit(rows)
        return backend.execute(select.sql(dialect=backend.dialect, identify=True)).read_all()

    return run_with_backend(cfg, src, query)
