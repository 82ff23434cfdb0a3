"""Arrow record batches from a DB-API cursor, for drivers that return Python rows (Hive, Synapse)."""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

BATCH_ROWS = 50_000


def column_array(values: list[Any], dtype: pa.DataType) -> pa.Array:
    try:
        return pa.array(values, type=dtype)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # e.g. Decimal or text into float64: convert, then cast
        return pa.array(values).cast(dtype)


def value_type(value: Any) -> pa.DataType:
    """Arrow type of one Python value as a DB-API driver returns it."""
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        return pa.int64()
    if isinstance(value, float | decimal.Decimal):
        return pa.float64()
    if isinstance(value, dt.datetime):
        return pa.timestamp("us", tz="UTC" if value.tzinfo else None)
    if isinstance(value, dt.date):
        return pa.date32()
    if isinstance(value, bytes | bytearray):
        return pa.binary()
    return pa.string()


def infer_schema(description: Sequence[Any], rows: list[Sequence[Any]]) -> pa.Schema:
    """Column types from the first non-null value of each column (a driver returns one Python type per SQL
    type); columns that are all null in the first batch become text."""
    fields = []
    for i, col in enumerate(description):
        value = next((row[i] for row in rows if row[i] is not None), None)
        fields.append(pa.field(col[0], pa.string() if value is None else value_type(value)))
    return pa.schema(fields)


def _batch(rows: list[Sequence[Any]], schema: pa.Schema) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True))
    arrays = [column_array(list(col), f.type) for col, f in zip(columns, schema, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def cursor_reader(
    cursor: Any, schema: pa.Schema | None = None, batch_rows: int = BATCH_ROWS
) -> pa.RecordBatchReader:
    """Stream the cursor's remaining rows as record batches (fetchmany, column by column). Without a
    schema it is inferred from the first batch."""
    first = cursor.fetchmany(batch_rows)
    if schema is None:
        schema = infer_schema(cursor.description, first)

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            rows = first
            while rows:
                yield _batch(rows, schema)
                rows = cursor.fetchmany(batch_rows)
        finally:
            cursor.close()

    return pa.RecordBatchReader.from_batches(schema, batches())
