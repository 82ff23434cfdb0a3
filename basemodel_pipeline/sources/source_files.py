"""Checks across the files of a local Parquet source, before any of its rows is read.

Two files with the same content (a second download `events (1).parquet` beside `events.parquet`, both matched
by the source's directory or glob) would count every event in them twice, and nothing downstream could tell.
They are found by size first, then by the sha256 of the files whose sizes are equal (so a source of files of
distinct sizes, the usual case, costs one stat per file), and refused in one line naming both files.

Files that disagree on a column's type (`price` int64 in one file, text in another; a timestamp written as
text by one writer) are read by DuckDB's union_by_name as one column of a type that holds both, text for
those: numbers would become categories and times strings, without a word. A column the config selects whose
types across the files (from the footers) are not of one kind is refused in one line naming the column, both
types and a file of each. Kinds that widen without changing a value pass: integers and floating numbers of
any width (and decimals), text of any encoding, dates and timestamps of any unit or zone, and a column that
is all nulls in some file.

`extract` runs these checks before it writes anything, `validate` among its first."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from basemodel_pipeline.config.models import DataSource
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.sources.damaged import source_files

HASH_BLOCK = 1 << 22


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def identical_files(files: Iterable[Path]) -> tuple[Path, Path] | None:
    """The first two of `files` (in their order) with the same bytes, or None: sizes first, then the sha256
    of the files whose size another file shares."""
    by_size: dict[int, list[Path]] = defaultdict(list)
    for path in files:
        by_size[path.stat().st_size].append(path)
    for same_size in by_size.values():
        if len(same_size) < 2:
            continue
        seen: dict[str, Path] = {}
        for path in same_size:
            first = seen.setdefault(_sha256(path), path)
            if first is not path:
                return first, path
    return None


def kind(dtype: pa.DataType) -> str:
    """The kind of a column type: types of one kind are read together without changing a value."""
    if pa.types.is_dictionary(dtype):
        return kind(dtype.value_type)
    if pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_decimal(dtype):
        return "number"
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or pa.types.is_string_view(dtype):
        return "text"
    if pa.types.is_timestamp(dtype) or pa.types.is_date(dtype):
        return "time"
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype):
        return f"list of {kind(dtype.value_type)}"
    return str(dtype)


def mixed_column(
    src: DataSource, files: Iterable[Path]
) -> tuple[str, Path, pa.DataType, Path, pa.DataType] | None:
    """The first column `src` selects whose type is of another kind in some file than in the first file that
    has it: (column, that file, its type, the other file, its type), or None. Nulls-only columns go with
    anything; an unreadable footer is left to the damaged-file check."""
    first: dict[str, tuple[Path, pa.DataType]] = {}
    for path in files:
        try:
            schema = pq.read_schema(path)
        except (pa.ArrowException, OSError):
            continue
        for field in schema:
            if pa.types.is_null(field.type) or not src.keeps(field.name):
                continue
            seen = first.setdefault(field.name.lower(), (path, field.type))
            if kind(seen[1]) != kind(field.type):
                return field.name, seen[0], seen[1], path, field.type
    return None


def check_files(src: DataSource) -> None:
    """Refuse a local Parquet source whose files hold the same content twice, or disagree on the kind of a
    column's type (one line naming the files)."""
    files = source_files(src)
    mixed = mixed_column(src, files)
    if mixed is not None:
        column, a, type_a, b, type_b = mixed
        raise DataError(
            f"data source '{src.name}': column {column} is {type_a} in {a} but {type_b} in {b}; read together, "
            "its values would change type: write it with one type in every file (cast it where the files are "
            f"made), or move the odd files out of data_location.path ({src.data_location.path})"
        )
    pair = identical_files(files)
    if pair is not None:
        first, copy = pair
        raise DataError(
            f"data source '{src.name}': {first} and {copy} have the same content, so every event in them would "
            f"count twice: remove one of them, or narrow data_location.path ({src.data_location.path}) to the "
            "files you mean"
        )
