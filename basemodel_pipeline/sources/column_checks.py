"""The data checks of one source at a time: the columns the config names exist, dates parse, where_condition
and sql_lambdas run, entity ids and dates are not NULL, floating values are finite.

ColumnChecks is mixed into the checker of sources/data_checks.py, which calls each check per data source.
"""

from __future__ import annotations

import duckdb
from sqlglot import exp

from basemodel_pipeline.config.models import DataSource
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.sources.check_context import CheckContext, one_line
from basemodel_pipeline.sources.parquet import is_local, quote_ident
from basemodel_pipeline.sources.sql import SqlError, parse_expression, resolve, shown_sql

FLOAT32_MAX = 3.4e38

DATE_TYPES = ("DATE", "TIMESTAMP")  # prefixes: TIMESTAMP_NS, TIMESTAMP WITH TIME ZONE, ...
TEXT_TYPES = ("VARCHAR",)


class ColumnChecks(CheckContext):
    """Checks of one data source against its own data."""

    def check_columns(self, where: str, src: DataSource) -> None:
        if src.main_entity_column:
            self.require(f"{where}.main_entity_column", src, src.main_entity_column)
        if src.date_column is not None:
            self.require(f"{where}.date_column.name", src, src.date_column.name)
        for key in ("allowed_columns", "disallowed_columns"):
            for n, col in enumerate(getattr(src, key) or []):
                self.require(f"{where}.{key}[{n}]", src, col)
        for col in src.column_types:
            self.require(f"{where}.column_types.{col}", src, col, self.joined_columns(src))

    def check_nulls(self, where: str, src: DataSource) -> None:
        """Every row (that where_condition keeps) has an entity id: a row without one belongs to no entity and
        would be dropped without a word. A missing date is a missing value (the row is left out), but an event
        source whose rows all lack one has no events."""
        fields = {"main_entity_column": src.main_entity_column}
        if src.type == "event" and src.date_column is not None:
            fields["date_column.name"] = src.date_column.name
        named = {f: resolve(c, self.columns[src.name]) for f, c in fields.items() if c}
        named = {f: c for f, c in named.items() if c}
        if not named:
            return
        *counts, total = self.con.execute(
            "SELECT "
            + ", ".join(f"count(*) FILTER (WHERE {quote_ident(c)} IS NULL)" for c in named.values())
            + f", count(*) FROM {self.rel(src)}{self.kept(src)}"
        ).fetchone() or (0,)
        for (field, column), n in zip(named.items(), counts, strict=False):
            if n and (field == "main_entity_column" or n == total):
                self.fail(
                    f"{where}.{field}",
                    f"{n} rows of data source '{src.name}' ({self.where_is(src)}) have no {column} (NULL); "
                    f"fill them in the source, or exclude them with where_condition: {column} IS NOT NULL",
                )

    def check_finite(self, where: str, src: DataSource) -> None:
        """Floating columns hold finite values that fit the cache's float32: NaN, +-inf or 1e308 would pass
        into the cache and end training in a non-finite loss. NULL is a missing value and is fine, and so are
        rows that where_condition excludes."""
        floats = [c for c, t in self.columns[src.name].items() if t.upper() in ("DOUBLE", "FLOAT", "REAL")]
        if not floats:
            return
        bad = {c: f"NOT isfinite({quote_ident(c)}) OR abs({quote_ident(c)}) > {FLOAT32_MAX}" for c in floats}
        counts = self.con.execute(
            "SELECT "
            + ", ".join(f"count(*) FILTER (WHERE {cond})" for cond in bad.values())
            + f" FROM {self.rel(src)}{self.kept(src)}"
        ).fetchone()
        for (column, cond), n in zip(bad.items(), counts or (), strict=False):
            if n:
                self.fail(
                    f"{where}.{column}",
                    f"{n} values of column '{column}' in data source '{src.name}' ({self.where_is(src)}) are NaN, "
                    f"infinite or beyond float32 (e.g. {self.bad_example(src, column, cond)}); clean them in the "
                    "source, or exclude those rows with where_condition",
                )

    def bad_example(self, src: DataSource, column: str, cond: str) -> str:
        row = self.con.execute(
            f"SELECT {quote_ident(column)} FROM {self.rel(src)}{self.kept(src, cond)} LIMIT 1"
        ).fetchone()
        return f"{column} = {row[0]}" if row else "?"

    def check_dates(self, where: str, src: DataSource) -> None:
        assert src.date_column is not None
        fmt = src.date_column.format
        name = resolve(src.date_column.name, self.columns[src.name]) or src.date_column.name
        dtype = self.columns[src.name][name]
        if dtype.startswith(DATE_TYPES):
            if fmt is not None:
                self.fail(
                    f"{where}.format",
                    f"column '{name}' of data source '{src.name}' is already {dtype}; remove format "
                    "(it is only for dates stored as text)",
                )
            return
        if not dtype.startswith(TEXT_TYPES):
            self.fail(
                f"{where}.name",
                f"column '{name}' of data source '{src.name}' has type {dtype}; a date column must be "
                "DATE/TIMESTAMP, or text with date_column.format set",
            )
        if fmt is None:
            self.fail(
                f"{where}.format",
                f"column '{name}' of data source '{src.name}' is text ({dtype}); set date_column.format "
                "to its strptime format, e.g. '%Y-%m-%d %H:%M:%S'",
            )
        col = quote_ident(name)
        rel = self.rel(src, filename=True, file_row_number=True)
        sql = (
            f"SELECT {col}, filename, file_row_number FROM {rel} "
            f"WHERE {col} IS NOT NULL AND try_strptime({col}, ?) IS NULL LIMIT 1"
        )
        try:
            bad = self.con.execute(sql, [fmt]).fetchone()
        except duckdb.Error as err:
            self.fail_if_damaged(src)
            self.fail(f"{where}.format", f"{fmt!r} is not a valid strptime format: {one_line(err)}")
        if bad is not None:
            value, file, row = bad
            self.fail(
                f"{where}.format",
                f"value {value!r} of column '{name}' at row {row + 1} (counting from 1) of {file} does not "
                f"parse with format {fmt!r}; fix the format or the data",
            )

    def check_query(self, where: str, src: DataSource) -> None:
        """Run the source query (where_condition, sql_lambdas) for one row in the source's own dialect."""
        from basemodel_pipeline.sources import read_source

        try:
            with read_source(self.cfg, src, limit=1) as reader:
                kept = reader.read_all().num_rows
        except UserError as err:
            self.fail(where, str(err))
        if kept == 0 and src.where_condition:
            self.fail(
                f"{where}.where_condition",
                f"{shown_sql(src.where_condition)} keeps no rows of '{src.name}'; loosen it",
            )

    def check_where(self, where: str, src: DataSource) -> None:
        assert src.where_condition is not None
        if not is_local(src):
            return  # written in the source's dialect: checked by check_query
        shown = shown_sql(src.where_condition)
        try:
            expr = parse_expression(src.where_condition, "duckdb")
        except SqlError as err:
            if not err.parsed:
                col = f" (column {err.col})" if err.col else ""
                self.fail(where, f"{shown} is not valid SQL{col}: {err.detail}")
            expr = None
        if not isinstance(expr, exp.Condition):
            self.fail(
                where,
                f"{shown} must be one boolean expression on the source's columns, "
                'e.g. "quantity > 0" (no statements or subqueries)',
            )
        sql = f"SELECT 1 FROM {self.rel(src)} WHERE {expr.sql(dialect='duckdb')} LIMIT 1"
        try:
            kept = self.con.execute(sql).fetchone()
        except duckdb.Error as err:
            self.fail_if_damaged(src)
            self.fail(where, f"DuckDB cannot run {shown} on '{src.name}': {one_line(err)}")
        if kept is None:
            self.fail(where, f"{shown} keeps no rows of data source '{src.name}'; loosen it")
