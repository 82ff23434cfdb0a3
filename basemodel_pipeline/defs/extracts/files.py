"""What the extract area holds, read from Parquet footers only (row counts, schemas): cheap for checks."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path

import pyarrow.parquet as pq


def parquet_files(directory: Path) -> list[Path]:
    """The finished Parquet files of one extract (day files or table.parquet), sorted by name; none when the
    directory is missing (cache/writer.extract_files, which the cache build uses, raises instead)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("*.parquet") if not p.name.startswith("."))


def day_of(path: Path) -> dt.date | None:
    try:
        return dt.date.fromisoformat(path.name.removesuffix(".parquet"))
    except ValueError:
        return None


def day_files(directory: Path, start: dt.date, end: dt.date) -> list[Path]:
    """Day files in [start, end)."""
    return [p for p in parquet_files(directory) if (d := day_of(p)) is not None and start <= d < end]


def content_version(files: list[Path]) -> str:
    """Dagster data version of extract files: a hash of their names and bytes (extracts are written in a total
    row order, so re-extracting unchanged days gives the same version and triggers nothing downstream)."""
    digest = hashlib.sha256()
    for file in sorted(files, key=lambda f: f.name):
        digest.update(file.name.encode() + b"\0")
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def day_version(directory: Path, day: str) -> str:
    """Data version of one day partition: the content version of its own day file, whatever range extracted
    it. A day without events has no file and always the same version (that of no file)."""
    file = directory / f"{day}.parquet"
    return content_version([file] if file.is_file() else [])


def rows_of(path: Path) -> int:
    return pq.read_metadata(path).num_rows


def schema_of(path: Path) -> dict[str, str]:
    """{column: arrow type} of one Parquet file."""
    return {field.name: str(field.type) for field in pq.read_schema(path)}


def describe_change(before: dict[str, str], after: dict[str, str]) -> str:
    """One line naming added, removed and retyped columns."""
    parts = []
    added = [c for c in after if c not in before]
    removed = [c for c in before if c not in after]
    retyped = [f"{c} {before[c]} -> {after[c]}" for c in after if c in before and before[c] != after[c]]
    if added:
        parts.append("added " + ", ".join(added))
    if removed:
        parts.append("removed " + ", ".join(removed))
    if retyped:
        parts.append("retyped " + ", ".join(retyped))
    return "; ".join(parts) or "column order changed"
