"""Check a parsed config against the data it points at, before anything expensive runs.

Every problem raises one ConfigError naming the YAML path (``data_sources[0].date_column.name``), the data
file and what to do. DuckDB reads local Parquet sources whole; other sources (s3://, warehouses) are checked
through their backend: column types from the table's schema, where_condition and sql_lambdas by running the
source query for one row in the source's own SQL dialect, join keys on a sample of rows loaded into DuckDB.
Identifiers and literals are quoted here, and user SQL is parsed by sqlglot and re-rendered, never pasted.
"""

from __future__ import annotations

import datetime as dt
import difflib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

import duckdb
import sqlglot
import yaml
from sqlglot import exp

from basemodel_pipeline.config.loader import _line_of
from basemodel_pipeline.config.models import DataSource, PipelineConfig
from basemodel_pipeline.errors import ConfigError, DataError, UserError
from basemodel_pipeline.sources import damaged
from basemodel_pipeline.sources.parquet import is_local, parquet_glob, quote_ident, read_parquet_sql
from basemodel_pipeline.sources.sql import resolve

SAMPLE_ROWS = 100_000  # rows of a non-local source loaded for the date-format and join checks
FLOAT32_MAX = 3.4e38
KEY_ROWS = 10_000_000  # join keys of a non-local attribute source are loaded whole (one column)

DATE_TYPES = ("DATE", "TIMESTAMP")  # prefixes: TIMESTAMP_NS, TIMESTAMP WITH TIME ZONE, ...
TEXT_TYPES = ("VARCHAR",)


def _text(alias: str, column: str) -> str:
    return f"CAST({alias}.{quote_ident(column)} AS VARCHAR)"


def _one_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0]


def source_columns(src: DataSource, con: duckdb.DuckDBPyConnection | None = None) -> dict[str, str]:
    """Column name -> DuckDB type string of a Parquet source. ConfigError when the path matches nothing."""
    con = con or duckdb.connect()
    path = src.data_location.path
    try:
        rows = con.execute(f"DESCRIBE SELECT * FROM {read_parquet_sql(path)}").fetchall()
    except duckdb.Error as err:
        hint = (
            "check data_location.path (relative paths are relative to the config file)"
            if "No files found" in str(err)
            else "check that the path holds readable Parquet files"
        )
        raise ConfigError(
            f"data source '{src.name}': cannot read Parquet at {parquet_glob(path)}: {_one_line(err)}; {hint}"
        ) from None
    return {str(name): str(dtype) for name, dtype, *_ in rows}


class _Checker:
    def __init__(self, cfg: PipelineConfig, config_file: str | Path | None) -> None:
        self.cfg = cfg
        self.file = Path(config_file) if config_file else None
        self.con = duckdb.connect()
        self.columns: dict[str, dict[str, str]] = {}
        self.loaded: set[str] = set()

    def fail(self, where: str, message: str) -> NoReturn:
        """Raise '<file>:<line>: <yaml path>: <message>' (file and line when the config file is known)."""
        prefix = ""
        if self.file is not None:
            loc = tuple(int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", where))
            try:
                line = _line_of(yaml.compose(self.file.read_text()), loc)
            except (OSError, yaml.YAMLError):
                line = None
            prefix = f"{self.file}:{line}: " if line else f"{self.file}: "
        raise ConfigError(f"{prefix}{where}: {message}")

    def fail_if_damaged(self, src: DataSource, deep: bool = True) -> None:
        """After a failed read: fail naming the damaged Parquet file of `src` if there is one."""
        try:
            damaged.check_source(src, deep)
        except DataError as err:
            self.fail(f"data_sources[{self.cfg.data_sources.index(src)}].data_location.path", str(err))

    @staticmethod
    def where_is(src: DataSource) -> str:
        return parquet_glob(src.data_location.path) if is_local(src) else src.data_location.display()

    def rel(self, src: DataSource, **options: bool) -> str:
        if is_local(src):
            return read_parquet_sql(src.data_location.path, **options)
        return quote_ident(f"sample_{src.name}")

    def keys_rel(self, src: DataSource, columns: list[str]) -> str:
        """Every key of a non-local source (one column query, up to KEY_ROWS rows), as a DuckDB table."""
        if is_local(src):
            return self.rel(src)
        from basemodel_pipeline.sources import sample_rows

        name = f"keys_{src.name}_{'_'.join(columns)}"
        if name not in self.loaded:
            actual = [resolve(c, self.columns[src.name]) or c for c in columns]
            table = sample_rows(self.cfg, src, KEY_ROWS, columns=actual).rename_columns(columns)
            self.con.register(name, table)
            self.loaded.add(name)
        return quote_ident(name)

    def load_sample(self, src: DataSource) -> dict[str, str]:
        """Column types from the source's schema; a sample of its rows as DuckDB table sample_<name>."""
        from basemodel_pipeline.sources import sample_rows, source_schema

        types = source_schema(self.cfg, src)
        table = sample_rows(self.cfg, src, SAMPLE_ROWS)
        name = f"sample_{src.name}"
        self.con.register(f"{name}_arrow", table)
        label = src.data_location.display().replace("'", "''")
        self.con.execute(
            f"CREATE TEMP TABLE {quote_ident(name)} AS SELECT *, '{label}' AS filename, "
            f"row_number() OVER () - 1 AS file_row_number FROM {quote_ident(name + '_arrow')}"
        )
        return types

    def require(self, where: str, src: DataSource, column: str, extra: Iterable[str] = ()) -> None:
        available = [*self.columns[src.name], *extra]
        if column in available:
            return
        if not is_local(src) and resolve(column, dict.fromkeys(available, "")) is not None:
            return  # warehouses fold unquoted names (Snowflake: upper case); extraction resolves them
        close = difflib.get_close_matches(column, available, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        self.fail(
            where,
            f"column '{column}' is not in data source '{src.name}' ({self.where_is(src)}); "
            f"{hint}available columns: {', '.join(available)}. Fix the name in the config.",
        )

    def run(self) -> None:
        for i, src in enumerate(self.cfg.data_sources):
            try:
                self.columns[src.name] = (
                    source_columns(src, self.con) if is_local(src) else self.load_sample(src)
                )
            except UserError as err:
                self.fail_if_damaged(src, deep=False)
                where = "path" if src.data_location.database_type == "parquet" else "table_name"
                self.fail(f"data_sources[{i}].data_location.{where}", str(err))
        for i, src in enumerate(self.cfg.data_sources):
            self.check_columns(f"data_sources[{i}]", src)
            if src.date_column is not None:
                self.check_dates(f"data_sources[{i}].date_column", src)
            if src.where_condition is not None:
                self.check_where(f"data_sources[{i}].where_condition", src)
            if src.sql_lambdas or (src.where_condition is not None and not is_local(src)):
                self.check_query(f"data_sources[{i}]", src)  # first: the checks below apply where_condition
            self.check_nulls(f"data_sources[{i}]", src)
            self.check_finite(f"data_sources[{i}]", src)
        for i, src in enumerate(self.cfg.data_sources):
            for j, join in enumerate(src.joined_data_sources):
                where = f"data_sources[{i}].joined_data_sources[{j}].join_on"
                for a, b in join.join_on.items():
                    self.require(f"{where}.{a}", src, a)
                    self.require(f"{where}.{a}", self.cfg.source(join.name), b)
                self.check_join(where, src, join.name, join.join_on)
        for k, attrs in enumerate(self.cfg.data_sources):
            if attrs.type == "main_entity_attribute":
                for ev in self.cfg.sources("event"):
                    assert attrs.main_entity_column and ev.main_entity_column
                    self.check_join(
                        f"data_sources[{k}].main_entity_column",
                        ev,
                        attrs.name,
                        {ev.main_entity_column: attrs.main_entity_column},
                    )
        self.check_entity_ids()  # after the join checks: ids that never match get their message first
        for i, sc in enumerate(self.cfg.scenarios):
            src = self.cfg.source(sc.target.source)
            for field, column in sc.target.columns():
                self.require(f"scenarios[{i}].target.{field}", src, column, self.joined_columns(src))
                self.check_list_use(f"scenarios[{i}].target.{field}", sc, src, field, column)
        self.check_test_windows()

    def check_entity_ids(self) -> None:
        """Entity ids are compared by value across sources: integers when every entity column is an integer,
        else text, an integer written as plain decimal text ('42'). When the types differ, every id of a
        non-integer column must be such plain integer text: '000042', '42.0' or 'H42' would match by
        accident of a cast, or not at all, and silently split or lose entities."""
        from basemodel_pipeline.sources.types import INTEGER_PREFIXES

        typed = []
        for i, src in enumerate(self.cfg.data_sources):
            if src.type in ("event", "main_entity_attribute") and src.main_entity_column:
                name = resolve(src.main_entity_column, self.columns[src.name]) or src.main_entity_column
                typed.append((i, src, name, self.columns[src.name].get(name, "")))
        integers = [t for t in typed if t[3].upper().startswith(INTEGER_PREFIXES)]
        if not integers or len(integers) == len(typed):
            return
        _, isrc, icol, itype = integers[0]
        for i, src, col, dtype in typed:
            if dtype.upper().startswith(INTEGER_PREFIXES):
                continue
            text = f"CAST({quote_ident(col)} AS VARCHAR)"
            plain = f"regexp_full_match({text}, '-?(0|[1-9][0-9]{{0,17}})')"
            n, example = self.con.execute(
                f"SELECT count(*), any_value({text}) FROM {self.rel(src)} "
                f"WHERE {quote_ident(col)} IS NOT NULL AND NOT {plain}"
            ).fetchone() or (0, None)
            if n:
                self.fail(
                    f"data_sources[{i}].main_entity_column",
                    f"entity ids differ in type: '{isrc.name}'.{icol} is {itype} but '{src.name}'.{col} is "
                    f"{dtype}, and {n} of its ids are not plain integers (e.g. {example!r}), so they cannot "
                    f"be matched with '{isrc.name}' by value; write the ids the same way in both sources "
                    "(integers everywhere, or the same text everywhere)",
                )

    def column_type(self, src: DataSource, column: str) -> str:
        """The data type of an event source's own or joined column ('' when unknown)."""
        for name in (src.name, *(j.name for j in src.joined_data_sources)):
            types = self.columns.get(name, {})
            found = resolve(column, types) if types else None
            if found is not None:
                return types[found]
        return ""

    def check_list_use(self, where: str, sc: Any, src: DataSource, field: str, column: str) -> None:
        """A list-valued column (a movie's genres) can be a multilabel target or a feature, nothing else."""
        from basemodel_pipeline.sources.types import is_list_type

        if not is_list_type(self.column_type(src, column)):
            return
        if sc.task == "multilabel" and field == "column":
            return
        use = "a filter" if field.startswith("filter") else f"the column of a {sc.task} target"
        self.fail(
            where,
            f"column '{column}' of data source '{src.name}' holds lists of values; it can be a multilabel "
            f"target (one label per value) or a feature, not {use}. Use a column with one value per event",
        )

    def last_day(self, src: DataSource) -> dt.date | None:
        """The last event day of a local event source (None elsewhere: warehouses are not scanned here)."""
        if not is_local(src) or src.date_column is None:
            return None
        name = resolve(src.date_column.name, self.columns[src.name]) or src.date_column.name
        col = quote_ident(name)
        fmt = src.date_column.format
        expr = f"try_strptime({col}, ?)" if fmt else col
        value = self.con.execute(f"SELECT max({expr}) FROM {self.rel(src)}", [fmt] if fmt else []).fetchone()
        if value is None or value[0] is None:
            return None
        v = value[0]
        return v.date() if isinstance(v, dt.datetime) else v

    def check_test_windows(self) -> None:
        """Every scenario's test window [training_end_date, + horizon) must end inside the data: otherwise
        fine-tuning fails after a whole pretraining, on an empty or one-class test window. Rolling windows are
        resolved against the newest event day of the sources, as a run would against the cache."""
        dp = self.cfg.data_params
        if dp.rolling:
            events = [s for s in self.cfg.data_sources if s.type == "event"]
            days = [d for s in events if (d := self.last_day(s)) is not None]
            if not days:
                return
            try:
                dp = dp.resolved(max(days), self.cfg.longest_horizon_days)
            except ConfigError as err:
                self.fail("data_params", str(err).removeprefix("data_params: "))
        test = dp.test_date
        for i, sc in enumerate(self.cfg.scenarios):
            last = self.last_day(self.cfg.source(sc.target.source))
            if last is None:
                continue
            end = test + dt.timedelta(days=sc.target.horizon_days)
            if end > last + dt.timedelta(days=1):
                latest = last + dt.timedelta(days=1) - dt.timedelta(days=sc.target.horizon_days)
                self.fail(
                    "data_params.training_end_date",
                    f"scenario '{sc.name}' (scenarios[{i}]) is tested on [{test}, {end}), but data source "
                    f"'{sc.target.source}' ends on {last}; set training_end_date to {latest} or earlier. "
                    "Scoring as of the end of the data does not need it: `basemodel predict` scores as of the "
                    "day after the last event",
                )

    def joined_columns(self, src: DataSource) -> list[str]:
        own = self.columns[src.name]
        return [c for j in src.joined_data_sources for c in self.columns[j.name] if c not in own]

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
        keep = f" WHERE ({src.where_condition})" if src.where_condition else ""
        *counts, total = self.con.execute(
            "SELECT "
            + ", ".join(f"count(*) FILTER (WHERE {quote_ident(c)} IS NULL)" for c in named.values())
            + f", count(*) FROM {self.rel(src)}{keep}"
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
        into the cache and end training in a non-finite loss. NULL is a missing value and is fine."""
        floats = [c for c, t in self.columns[src.name].items() if t.upper() in ("DOUBLE", "FLOAT", "REAL")]
        if not floats:
            return
        bad = {c: f"NOT isfinite({quote_ident(c)}) OR abs({quote_ident(c)}) > {FLOAT32_MAX}" for c in floats}
        counts = self.con.execute(
            "SELECT "
            + ", ".join(f"count(*) FILTER (WHERE {cond})" for cond in bad.values())
            + f" FROM {self.rel(src)}"
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
            f"SELECT {quote_ident(column)} FROM {self.rel(src)} WHERE {cond} LIMIT 1"
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
            self.fail(f"{where}.format", f"{fmt!r} is not a valid strptime format: {_one_line(err)}")
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
                f"{src.where_condition!r} keeps no rows of '{src.name}'; loosen it",
            )

    def check_where(self, where: str, src: DataSource) -> None:
        assert src.where_condition is not None
        if not is_local(src):
            return  # written in the source's dialect: checked by check_query
        try:
            statements = sqlglot.parse(src.where_condition, read="duckdb")
        except sqlglot.errors.ParseError as err:
            first = err.errors[0] if err.errors else {}
            detail = first.get("description") or _one_line(err)
            col = f" (column {first['col']})" if first.get("col") else ""
            self.fail(where, f"{src.where_condition!r} is not valid SQL{col}: {detail}")
        expr = statements[0] if len(statements) == 1 else None
        if not isinstance(expr, exp.Condition) or expr.find(exp.Query) is not None:
            self.fail(
                where,
                f"{src.where_condition!r} must be one boolean expression on the source's columns, "
                'e.g. "quantity > 0" (no statements or subqueries)',
            )
        sql = f"SELECT 1 FROM {self.rel(src)} WHERE {expr.sql(dialect='duckdb')} LIMIT 1"
        try:
            kept = self.con.execute(sql).fetchone()
        except duckdb.Error as err:
            self.fail_if_damaged(src)
            self.fail(where, f"DuckDB cannot run {src.where_condition!r} on '{src.name}': {_one_line(err)}")
        if kept is None:
            self.fail(where, f"{src.where_condition!r} keeps no rows of data source '{src.name}'; loosen it")

    def check_join(self, where: str, left: DataSource, right_name: str, keys: dict[str, str]) -> None:
        right = self.cfg.source(right_name)
        # compare as text: IDs stored as 1001 in one source and '1001' in the other still match
        on = " AND ".join(f"{_text('l', a)} = {_text('r', b)}" for a, b in keys.items())
        matches = f"SELECT 1 FROM {self.keys_rel(right, list(keys.values()))} r WHERE {on}"
        sql = f"SELECT 1 FROM {self.rel(left)} l WHERE EXISTS ({matches}) LIMIT 1"
        if self.con.execute(sql).fetchone() is not None:
            return
        self.fail(
            where,
            f"no row of '{left.name}' matches a row of '{right.name}' on {self.describe_keys(keys)}; "
            f"e.g. {left.name} has {self.examples(left, list(keys))} but {right.name} has "
            f"{self.examples(right, list(keys.values()))}. Make the IDs use the same format in both sources.",
        )

    @staticmethod
    def describe_keys(keys: dict[str, str]) -> str:
        return ", ".join(f"{a} = {b}" for a, b in keys.items())

    def examples(self, src: DataSource, cols: list[str]) -> str:
        select = ", ".join(quote_ident(c) for c in cols)
        sample = f"SELECT {select} FROM {self.rel(src)} LIMIT 1000"
        rows = self.con.execute(f"SELECT DISTINCT * FROM ({sample}) LIMIT 3").fetchall()
        return ", ".join(repr(r[0]) if len(r) == 1 else repr(r) for r in rows) or "no rows"


def check_config_against_data(cfg: PipelineConfig, config_file: str | Path | None = None) -> None:
    """Raise ConfigError naming the YAML path when the config does not fit its Parquet data."""
    checker = _Checker(cfg, config_file)
    try:
        checker.run()
    except duckdb.Error:  # a read failed where no check expected it: a damaged file is the usual cause
        for src in cfg.data_sources:
            checker.fail_if_damaged(src)
        raise
    finally:
        checker.con.close()
