"""What every backend provides, and the retry policy around it.

A backend knows how to connect, where it connects to (host:port, for messages), how to name the source table
in its SQL dialect, and how to run a query to Arrow record batches. The query text itself comes from
sources.sql, written once. Failures are sorted into transient (a refused, reset or timed-out connection,
throttling, 5xx: retried with growing, jittered waits, a bounded number of times; see basemodel_pipeline.retry)
and permanent (credentials, missing table, bad SQL: fail at once with the source, the table and the driver's
first line).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import duckdb
import pyarrow as pa
from sqlglot import exp

from basemodel_pipeline import retry
from basemodel_pipeline.config.models import DataSource
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.retry import secret_values
from basemodel_pipeline.sources.sql import schema_query

__all__ = ["Backend", "arrow_to_duckdb_types"]


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
        return isinstance(exc, cls.transient_types) or retry.is_transient(exc)

    @classmethod
    def endpoint(cls, location: Any) -> str | None:
        """host:port the backend connects to (for messages; never credentials). None: nothing remote."""
        return None

    @classmethod
    def secrets(cls, location: Any) -> list[str]:
        """Secret values of a location, masked in every message (secret config fields by default)."""
        return secret_values(location)

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
