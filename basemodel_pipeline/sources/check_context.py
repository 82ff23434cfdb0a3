"""What every data check shares: the config, one DuckDB connection, the column types of each source, and
failing with the YAML path.

CheckContext holds the state of one check run (sources/data_checks.py) and the helpers the checks use: `fail`
('<file>:<line>: <yaml path>: <message>'), the relation a source is read from in DuckDB (a local Parquet glob,
or a sample of a non-local source loaded as a table), and `require` (a column the config names exists). The
checks themselves are sources/column_checks.py (one source at a time) and sources/cross_checks.py (across
sources and scenarios).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import NoReturn

import duckdb
import yaml

from basemodel_pipeline.config.loader import _line_of
from basemodel_pipeline.config.models import DataSource, PipelineConfig
from basemodel_pipeline.errors import ConfigError, DataError
from basemodel_pipeline.sources import damaged
from basemodel_pipeline.sources.parquet import is_local, parquet_glob, quote_ident, read_parquet_sql
from basemodel_pipeline.sources.sql import one_line, parse_fragment, resolve

SAMPLE_ROWS = 100_000  # rows of a non-local source loaded for the date-format and join checks
KEY_ROWS = 10_000_000  # join keys of a non-local attribute source are loaded whole (one column)


__all__ = ["CheckContext", "one_line"]


class CheckContext:
    """The state of one check run and the helpers every check uses."""

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

    def kept(self, src: DataSource, *conditions: str) -> str:
        """` WHERE (<condition>) AND ... AND (<where_condition>)` in DuckDB SQL for a query over
        `self.rel(src)` ('' with neither): where_condition parsed in the source's dialect and rendered, never
        pasted (a trailing `-- comment` would swallow what follows)."""
        parts = list(conditions)
        if src.where_condition:
            from basemodel_pipeline.sources import backend_class

            dialect = backend_class(src.data_location.database_type).dialect
            node = parse_fragment(src, src.where_condition, dialect, "where_condition", table=None)
            parts.append(node.sql(dialect="duckdb"))
        return " WHERE " + " AND ".join(f"({p})" for p in parts) if parts else ""

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

    def joined_columns(self, src: DataSource) -> list[str]:
        own = self.columns[src.name]
        return [c for j in src.joined_data_sources for c in self.columns[j.name] if c not in own]
