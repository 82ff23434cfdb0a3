"""Arrow record batches from a DB-API cursor, for drivers that return Python rows (Hive, Synapse)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

BATCH_ROWS = 50_000


def column_array(values: list[Any], dtype: pa.DataType) -> pa.Array:
    try:
        return pa.array(values, type=dtype)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # e.g. Decimal or text into float64: convert, then cast
        return pa.array(values).cast(dtype)


def cursor_reader(cursor: Any, schema: pa.Schema, batch_rows: int = BATCH_ROWS) -> pa.RecordBatchReader:
    """Stream the cursor's remaining rows as record batches of `schema` (fetchmany, column by column)."""

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            while rows := cursor.fetchmany(batch_rows):
                columns = list(zip(*rows, strict=True)) if rows else []
                arrays = [column_array(list(col), f.type) for col, f in zip(columns, schema, strict=True)]
                yield pa.RecordBatch.from_arrays(arrays, schema=schema)
        finally:
            cursor.close()

    return pa.RecordBatchReader.from_batches(schema, batches())
