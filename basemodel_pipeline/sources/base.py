"""What every backend provides, and the retry policy around it.

A backend knows three things: how to connect, how to name the source table in its SQL dialect, and how to
run a query to Arrow record batches. The query text itself comes from sources.sql, written once.
Failures are sorted into transient (network, throttling, 5xx: retried with exponential backoff and full
jitter, a bounded number of times) and permanent (credentials, missing table, bad SQL: fail at once with
the source, the table and the driver's first line).
"""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import duckdb
import pyarrow as pa
from sqlglot import exp

from basemodel_pipeline.config.models import DataSource
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.settings import setting
from basemodel_pipeline.sources.sql import schema_query

T = TypeVar("T")

ATTEMPTS = 5
BASE_DELAY_S = 0.5
MAX_DELAY_S = 30.0
TRANSIENT_WORDS = (
    "timed out",
    "timeout",
    "connection reset",
    "connection refused",
    "connection aborted",
    "temporarily unavailable",
    "service unavailable",
    "too many requests",
    "throttl",
    "rate limit",
    "503",
    "502",
    "504",
    "429",
)


class SourceUnavailable(DataError):
    """A source kept failing with transient errors after every retry."""


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


class Backend(ABC):
    """One open connection to one data source."""

    dialect: ClassVar[str]
    transient_types: ClassVar[tuple[type[BaseException], ...]] = (ConnectionError, TimeoutError)

    def __init__(self, src: DataSource, workspace: Path) -> None:
        self.src = src
        self.location: Any = src.data_location
        self.workspace = workspace

    @abstractmethod
    def table(self) -> exp.Expression:
        """The source table in this backend's SQL (a table name or a table function)."""

    @abstractmethod
    def execute(self, sql: str) -> pa.RecordBatchReader:
        """Run one SELECT and stream its result."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the connection."""

    @classmethod
    def is_transient(cls, exc: BaseException) -> bool:
        """Whether retrying can help. Subclasses add their driver's error codes."""
        if isinstance(exc, DataError):
            return False
        if isinstance(exc, cls.transient_types):
            return True
        text = str(exc).lower()
        return any(word in text for word in TRANSIENT_WORDS)

    def schema(self) -> dict[str, str]:
        """Column name -> DuckDB type name of the source table."""
        reader = self.execute(schema_query(self.table(), self.dialect))
        return arrow_to_duckdb_types(reader.schema)

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def arrow_to_duckdb_types(schema: pa.Schema) -> dict[str, str]:
    con = duckdb.connect()
    try:
        rel = con.from_arrow(schema.empty_table())
        return {name: str(dtype) for name, dtype in zip(rel.columns, rel.types, strict=True)}
    finally:
        con.close()


def with_retry(
    fn: Callable[[], T],
    *,
    what: str,
    is_transient: Callable[[BaseException], bool],
    attempts: int | None = None,
    base_delay: float | None = None,
    max_delay: float = MAX_DELAY_S,
    sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
) -> T:
    """Call fn; retry transient failures with exponential backoff and full jitter; fail fast otherwise.

    Every failure ends in a DataError whose message starts with `what` (source and table), so the user
    sees which source failed and why, on one line; secrets never appear because drivers' messages do not
    carry them and connection parameters are not formatted into it.
    """
    attempts = attempts or int(setting("BASEMODEL_SOURCE_ATTEMPTS", str(ATTEMPTS)))
    if base_delay is None:
        base_delay = float(setting("BASEMODEL_SOURCE_RETRY_BASE_S", str(BASE_DELAY_S)))
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classified below
            if isinstance(exc, DataError) and not isinstance(exc, SourceUnavailable):
                raise
            if not is_transient(exc):
                raise DataError(f"{what}: {first_line(exc)} (permanent error: not retried)") from exc
            if attempt == attempts:
                raise SourceUnavailable(
                    f"{what}: still failing after {attempts} attempts: {first_line(exc)}; check that the "
                    "source is reachable and retry later"
                ) from exc
            delay = random.uniform(0, min(max_delay, base_delay * 2 ** (attempt - 1)))
            if on_retry is not None:
                on_retry(attempt, exc, delay)
            sleep(delay)
    raise AssertionError("unreachable")
