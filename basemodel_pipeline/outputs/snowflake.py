"""Snowflake: rows go to a staging table by array binding (qmark parameters: one request per chunk; the
connector moves large bindings through a stage on its own), then one transaction (autocommit off) deletes the
(scenario, as_of) slice and inserts the staged rows. Column names are upper case, as unquoted Snowflake
names are; vectors (embeddings) are ARRAY columns, staged as JSON text and parsed on insert."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pyarrow as pa
from sqlglot import exp

from basemodel_pipeline.outputs.warehouse import TableWriter, sql_type
from basemodel_pipeline.sources.snowflake import SnowflakeBackend

MAX_BOUND_VALUES = 60_000  # per request: below the connector's CLIENT_STAGE_ARRAY_BINDING_THRESHOLD


class SnowflakeWriter(TableWriter):
    dialect = "snowflake"
    upper_case_columns = True
    backend: SnowflakeBackend

    def qualify(self, table: exp.Table) -> exp.Table:
        p = self.dest.connection_params  # type: ignore[attr-defined]
        if not table.args.get("db"):
            table.set("db", exp.to_identifier(p.schema_name.upper(), quoted=True))
        if not table.args.get("catalog"):
            table.set("catalog", exp.to_identifier(p.database.upper(), quoted=True))
        return table

    def stage_name(self, target: exp.Table, name: str) -> exp.Table:
        return exp.Table(this=exp.to_identifier(name, quoted=True))

    def execute(self, sql: str) -> None:
        cur = self.backend.con.cursor()
        try:
            cur.execute(sql)
        finally:
            cur.close()

    def stage_type(self, kind: str) -> str:
        return "VARCHAR" if kind.startswith("list:") else sql_type(kind, self.dialect)

    def create_stage(self) -> None:
        cols = ", ".join(f"{self.q(n)} {self.stage_type(k)}" for n, k in self.kinds.items())
        # a temporary table lives in the session's schema and disappears with the session
        self.execute(f"CREATE TEMPORARY TABLE {self.sql(self.stage_table)} ({cols})")

    def append(self, table: pa.Table) -> None:
        columns = [self.python_values(table.column(i), k) for i, k in enumerate(self.kinds.values())]
        marks = ", ".join("?" * len(columns))
        names = ", ".join(self.q(c) for c in self.columns)
        sql = f"INSERT INTO {self.sql(self.stage_table)} ({names}) VALUES ({marks})"
        step = max(1, MAX_BOUND_VALUES // len(columns))
        cur = self.backend.con.cursor()
        try:
            for a in range(0, table.num_rows, step):
                # a list per placeholder = an array binding: the statement runs once for every row
                cur.execute(sql, params=[c[a : a + step] for c in columns], _force_qmark_paramstyle=True)
        finally:
            cur.close()

    @staticmethod
    def python_values(column: pa.ChunkedArray, kind: str) -> list[Any]:
        values = column.to_pylist()
        if kind.startswith("list:"):
            return [None if v is None else json.dumps(v) for v in values]
        if kind == "timestamp":  # TIMESTAMP_NTZ holding UTC
            return [None if v is None else v.astimezone(dt.UTC).replace(tzinfo=None) for v in values]
        return values

    def publish(self) -> None:
        selected = ", ".join(
            f"PARSE_JSON({self.q(n)})" if k.startswith("list:") else self.q(n) for n, k in self.kinds.items()
        )
        names = ", ".join(self.q(c) for c in self.columns)
        con = self.backend.con
        con.autocommit(False)  # the DELETE and the INSERT commit together, or not at all
        try:
            self.execute(self.sql(exp.delete(self.target, where=self.slice_condition())))
            self.execute(
                f"INSERT INTO {self.sql(self.target)} ({names}) SELECT {selected} FROM {self.sql(self.stage_table)}"
            )
            con.commit()
        except BaseException:
            con.rollback()
            raise
        finally:
            con.autocommit(True)
