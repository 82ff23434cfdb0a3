"""Rows of an event source that repeat another row exactly (every column equal), counted as the extract
writes its day files.

A repeat may be real (the same product bought twice in one basket at the same second) or a copy (a batch
loaded twice), and only the user can tell: the extract keeps every row, and reports the count in one warning
line with an example and as `duplicate_rows` in its metadata.

Counting costs little because a day file is written in a total row order (sources/extract.py): equal rows
are adjacent, so a repeat is a row equal to the row before it. The file is read back one column at a time,
and after the first columns only the pairs still equal are compared (usually none: reading stops there)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

EXAMPLE_CHARS = 300  # of the example row in the warning


def _equal(a: pa.Array, b: pa.Array) -> pa.Array:
    """Element-wise equality where two nulls (and two NaNs) are equal, never null."""
    try:
        eq = pc.fill_null(pc.equal(a, b), False)
    except pa.ArrowNotImplementedError:  # nested values (lists, structs): compared as Python values
        return pa.array([x == y for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)], pa.bool_())
    eq = pc.or_(eq, pc.and_(pc.is_null(a), pc.is_null(b)))
    if pa.types.is_floating(a.type):
        eq = pc.or_(eq, pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False))
    return eq


def adjacent_repeats(path: Path) -> tuple[int, int | None]:
    """In a Parquet file whose rows are sorted by every column: the number of rows equal in every column to
    the row before them, and the index of the first such row (None when there is none)."""
    file = pq.ParquetFile(path)
    n = file.metadata.num_rows
    if n < 2:
        return 0, None
    names = file.schema_arrow.names
    nested = [pa.types.is_nested(file.schema_arrow.field(c).type) for c in names]
    pairs: pa.Array | None = None  # i: rows i and i + 1 are equal in every column read so far
    for name in sorted(names, key=lambda c: nested[names.index(c)]):  # nested values, compared slowly, last
        column = file.read(columns=[name]).column(0).combine_chunks()
        if pairs is None:
            pairs = pc.indices_nonzero(_equal(column.slice(1), column.slice(0, n - 1)))
        else:
            pairs = pairs.filter(_equal(column.take(pc.add(pairs, 1)), column.take(pairs)))
        if len(pairs) == 0:
            return 0, None
    assert pairs is not None
    return len(pairs), int(pairs[0].as_py()) + 1


def row_at(path: Path, index: int) -> dict[str, Any]:
    """Row `index` of a Parquet file, reading only its row group."""
    file = pq.ParquetFile(path)
    for group in range(file.num_row_groups):
        rows = file.metadata.row_group(group).num_rows
        if index < rows:
            return file.read_row_group(group).slice(index, 1).to_pylist()[0]
        index -= rows
    raise IndexError(index)


@dataclass
class Repeats:
    """Repeated rows per day file written by one extract (a chunk written again replaces its days' counts)
    and an example row."""

    by_day: dict[str, int] = field(default_factory=dict)
    example: dict[str, Any] | None = None

    def count(self, day: str, path: Path) -> None:
        """Count the repeats of the sorted day file `path` (the file of `day`)."""
        n, first = adjacent_repeats(path)
        self.by_day[day] = n
        if first is not None and self.example is None:
            self.example = row_at(path, first)

    @property
    def total(self) -> int:
        return sum(self.by_day.values())

    def report(self, label: str, log: Callable[[str], None]) -> int:
        """Log one warning line when rows repeat; returns their number."""
        total = self.total
        if total:
            days = sum(1 for n in self.by_day.values() if n)
            shown = ", ".join(f"{k}={v}" for k, v in (self.example or {}).items())
            if len(shown) > EXAMPLE_CHARS:
                shown = shown[: EXAMPLE_CHARS - 3] + "..."
            log(
                f"warning: {label}: {total} rows repeat another row in every column, on {days} days (e.g. {shown}); "
                "they are kept as separate events: if they are copies rather than real repeats, remove them "
                "from the source"
            )
        return total
