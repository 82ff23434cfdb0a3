"""What every writer provides: write(chunk) many times, then close() (publish) or abort() (discard)."""

from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from typing import Any

import pyarrow as pa

from basemodel_pipeline.errors import UserError

DATASETS = ("predictions", "embeddings")


class Writer(ABC):
    """One (dataset, scenario, as_of) being written to one destination."""

    format: str

    def __init__(self, name: str, dataset: str, scenario: str | None, as_of: dt.date) -> None:
        self.name = name
        self.dataset = dataset
        self.scenario = scenario
        self.as_of = as_of
        self.rows = 0
        self.schema: pa.Schema | None = None
        self.state = "open"

    def write(self, batch: pa.Table | pa.RecordBatch) -> None:
        """Append one chunk. Every chunk must have the first chunk's columns."""
        if self.state != "open":
            raise UserError(f"output '{self.name}': write() after the writer was {self.state}")
        table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
        if "as_of" not in table.column_names:
            table = table.append_column("as_of", pa.array([self.as_of] * table.num_rows, pa.date32()))
        if self.schema is None:
            self.schema = table.schema
        elif table.schema.names != self.schema.names:
            raise UserError(
                f"output '{self.name}': a chunk has columns {table.schema.names}, the first had "
                f"{self.schema.names}"
            )
        else:
            table = table.cast(self.schema)
        if table.num_rows:
            self._write(table)
            self.rows += table.num_rows

    def close(self) -> dict[str, Any]:
        """Publish everything written; returns {"rows", "destination", "format", ...}."""
        if self.state != "open":
            raise UserError(f"output '{self.name}': close() after the writer was {self.state}")
        try:
            info = self._close()
        except BaseException:
            self.abort()
            raise
        self.state = "closed"
        return {"rows": self.rows, "format": self.format, "output": self.name, **info}

    def abort(self) -> None:
        """Discard everything written; the destination stays as it was. Safe to call more than once."""
        if self.state == "open":
            self.state = "aborted"
            self._abort()

    @abstractmethod
    def _write(self, table: pa.Table) -> None: ...

    @abstractmethod
    def _close(self) -> dict[str, Any]: ...

    @abstractmethod
    def _abort(self) -> None: ...

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is not None:
            self.abort()
