"""Parquet sources read through DuckDB: safe SQL for a source's selection, filter and date parsing."""

from __future__ import annotations

import glob
import os

import duckdb
import sqlglot

from basemodel_pipeline.config.models import DataSource
from basemodel_pipeline.errors import ConfigError, DataError


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def parquet_glob(path: str) -> str:
    """A local directory becomes ``<dir>/**/*.parquet``; files, globs and URLs stay as they are."""
    if "://" not in path and os.path.isdir(path):
        return path.rstrip("/") + "/**/*.parquet"
    return path


def read_parquet_sql(path: str, **options: bool) -> str:
    """Safely quoted ``read_parquet('<path>', union_by_name=true)`` (plus extra boolean options)."""
    opts = "".join(f", {k}={'true' if v else 'false'}" for k, v in {"union_by_name": True, **options}.items())
    return f"read_parquet({quote_literal(parquet_glob(path))}{opts})"


def check_path(src: DataSource, index: int | None = None) -> None:
    path = src.data_location.path
    if "://" not in path and not glob.glob(parquet_glob(path), recursive=True):
        where = f"data_sources[{index}].data_location.path" if index is not None else f"source '{src.name}'"
        raise DataError(
            f"{where}: no Parquet file matches '{path}' (check the path; relative paths are "
            "relative to the config file)"
        )


def describe(con: duckdb.DuckDBPyConnection, src: DataSource) -> dict[str, str]:
    """Column name -> DuckDB type of a source."""
    check_path(src)
    rows = con.execute(f"DESCRIBE SELECT * FROM {read_parquet_sql(src.data_location.path)}").fetchall()
    return {r[0]: r[1] for r in rows}


def parsed_where(src: DataSource) -> str | None:
    """The where_condition parsed by sqlglot and re-rendered for DuckDB (never pasted verbatim)."""
    if not src.where_condition:
        return None
    try:
        expr = sqlglot.parse_one(src.where_condition, read="duckdb")
    except sqlglot.errors.ParseError as exc:
        first = str(exc).splitlines()[0]
        raise ConfigError(
            f"source '{src.name}': where_condition {src.where_condition!r} is not valid SQL: {first}"
        ) from None
    return expr.sql(dialect="duckdb")


def selected_columns(src: DataSource, available: dict[str, str]) -> list[str]:
    """Columns kept from a source: keys plus allowed (or all minus disallowed), minus `ignore` overrides."""
    keys = src.key_columns()
    if src.allowed_columns is not None:
        wanted = list(dict.fromkeys([*keys, *src.allowed_columns]))
    else:
        banned = set(src.disallowed_columns or [])
        wanted = [c for c in available if c not in banned or c in keys]
    missing = [c for c in wanted if c not in available]
    if missing:
        raise DataError(
            f"source '{src.name}' ({src.data_location.path}): column(s) {', '.join(missing)} not found; "
            f"available: {', '.join(available)}"
        )
    return [c for c in wanted if src.column_types.get(c) != "ignore" or c in keys]


def timestamp_expr(src: DataSource, available: dict[str, str]) -> str:
    """SQL expression turning the date column into a TIMESTAMP."""
    assert src.date_column is not None
    col = quote_ident(src.date_column.name)
    kind = available[src.date_column.name].upper()
    if src.date_column.format:
        return f"strptime(CAST({col} AS VARCHAR), {quote_literal(src.date_column.format)})"
    if kind.startswith(("VARCHAR", "TEXT", "STRING")):
        raise ConfigError(
            f"source '{src.name}': date_column '{src.date_column.name}' is text; set date_column.format "
            "(strptime syntax, e.g. '%Y-%m-%d %H:%M:%S')"
        )
    return f"CAST({col} AS TIMESTAMP)"
