"""Name the damaged Parquet file behind a reader's failure.

DuckDB and pyarrow report a truncated file or corrupt pages in many ways, and some of them ("TProtocolException:
Invalid data", "don't know what type") name no file at all. When a read fails, the files it read are probed
one by one with pyarrow (footer, then every row group) and the first one that cannot be read is reported
in one line with what to do. The probe runs only after a failure, so a healthy read pays nothing for it."""

from __future__ import annotations

import glob
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from basemodel_pipeline.config.models import DataSource
from basemodel_pipeline.errors import DataError


def problem(path: Path, deep: bool = True) -> str | None:
    """Why pyarrow cannot read `path` as Parquet (its first line), or None when it can: the footer always,
    every row group (all pages decompressed and decoded) when `deep`."""
    try:
        file = pq.ParquetFile(path)
        if deep:
            for group in range(file.num_row_groups):
                file.read_row_group(group)
    except (pa.ArrowException, OSError, ValueError) as exc:
        text = str(exc).strip().splitlines()
        return text[0] if text else type(exc).__name__
    return None


def first_damaged(files: Iterable[Path], deep: bool = True) -> tuple[Path, str] | None:
    """The first file of `files` that is not readable Parquet, with the reason."""
    for path in files:
        reason = problem(path, deep)
        if reason is not None:
            return path, reason
    return None


def source_files(src: DataSource) -> list[Path]:
    """The local Parquet files a source's data_location.path names (none for s3:// and warehouses)."""
    from basemodel_pipeline.sources.parquet import parquet_glob

    loc = src.data_location
    if loc.database_type != "parquet" or "://" in loc.path:
        return []
    return [Path(p) for p in sorted(glob.glob(parquet_glob(loc.path), recursive=True))]


def message(path: Path, reason: str, fix: str) -> str:
    return f"{path} is not readable Parquet ({reason}): the file is truncated or corrupt; {fix}"


def source_fix(src: DataSource) -> str:
    return (
        f"replace it with a good copy (export it again) or move it out of data source '{src.name}' "
        f"({src.data_location.path})"
    )


def check_source(src: DataSource, deep: bool = True) -> None:
    """Raise a one-line DataError naming the first damaged file of a local Parquet source."""
    found = first_damaged(source_files(src), deep)
    if found is not None:
        raise DataError(f"data source '{src.name}': {message(*found, source_fix(src))}")


def check_extracts(files_by_source: dict[str, list[Path]], config_hint: str = "CONFIG") -> None:
    """Raise a one-line DataError naming the first damaged extract file and the command that rewrites it."""
    for source, files in files_by_source.items():
        found = first_damaged(files)
        if found is not None:
            fix = f"extract the source again: `basemodel extract {config_hint} --source {source}`"
            raise DataError(f"extract of source '{source}': {message(*found, fix)}")
