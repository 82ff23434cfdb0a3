"""Check a parsed config against the data it points at, before anything expensive runs.

Every problem raises one ConfigError naming the YAML path (``data_sources[0].date_column.name``), the data
file and what to do. DuckDB reads local Parquet sources whole; other sources (s3://, warehouses) are checked
through their backend: column types from the table's schema, where_condition and sql_lambdas by running the
source query for one row in the source's own SQL dialect, join keys on a sample of rows loaded into DuckDB.
Identifiers and literals are quoted here, and user SQL is parsed by sqlglot and re-rendered, never pasted.

The checks are split by what they look at: sources/column_checks.py checks one source at a time,
sources/cross_checks.py joins, entity ids and scenarios across sources; both use the shared state and helpers
of sources/check_context.py. This module runs them in order (`check_config_against_data`).
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from basemodel_pipeline.config.models import DataSource, PipelineConfig
from basemodel_pipeline.errors import ConfigError, UserError
from basemodel_pipeline.sources.check_context import one_line
from basemodel_pipeline.sources.column_checks import ColumnChecks
from basemodel_pipeline.sources.cross_checks import CrossChecks
from basemodel_pipeline.sources.parquet import is_local, parquet_glob, read_parquet_sql
from basemodel_pipeline.sources.source_files import check_files


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
            f"data source '{src.name}': cannot read Parquet at {parquet_glob(path)}: {one_line(err)}; {hint}"
        ) from None
    return {str(name): str(dtype) for name, dtype, *_ in rows}


class _Checker(ColumnChecks, CrossChecks):
    """Every check, run in order: columns of each source first, then joins, entity ids and scenarios."""

    def run(self) -> None:
        for i, src in enumerate(self.cfg.data_sources):
            try:
                check_files(src)  # the same file twice, mixed column types
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
