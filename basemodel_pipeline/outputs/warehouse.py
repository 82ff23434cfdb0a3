"""Write-back to warehouse tables: create the table if missing, stage the rows, replace the slice.

Every warehouse writer works the same way:

1. the first chunk fixes the columns: the chunk's own (entity_id, as_of, score / label / value / rank / item /
   embedding ...) plus `scenario` (text; NULL for embeddings) and `written_at` (UTC timestamp of this run);
2. `CREATE TABLE IF NOT EXISTS` the target with types mapped from the Arrow schema; an existing table must
   have every column written (other columns are left NULL);
3. chunks go to a staging table beside the target (named <table>__stage_<random>), never to the target;
4. close() replaces the target's rows of this (scenario, as_of) by the staged rows in one atomic step
   (a transaction, a MERGE, or a partition swap, depending on the warehouse) and drops the staging table;
   abort() only drops the staging table.

A re-run for the same (scenario, as_of) therefore gives the same table; other dates and scenarios are kept.
Connections are opened by the data sources' backends (same connection parameters and drivers); identifiers
are quoted by sqlglot in each warehouse's dialect. Driver messages are reported by their first line; the
connection parameters (secrets included) are never formatted into a message or a log.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import uuid
from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
from sqlglot import exp

from basemodel_pipeline.config import DataSource, PipelineConfig
from basemodel_pipeline.config.outputs import WarehouseOutput
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.outputs.base import Writer
from basemodel_pipeline.retry import first_line, mask
from basemodel_pipeline.sources import backend_class, retrying
from basemodel_pipeline.sources.base import Backend

log = logging.getLogger(__name__)
SCENARIO = "scenario"
WRITTEN_AT = "written_at"
AS_OF = "as_of"
ENTITY_ID = "entity_id"

# logical column kind -> SQL type per dialect ("{}" = element type of an array)
TYPES: dict[str, dict[str, str]] = {
    "snowflake": {
        "int": "BIGINT",
        "float32": "FLOAT",
        "float64": "DOUBLE",
        "string": "VARCHAR",
        "date": "DATE",
        "timestamp": "TIMESTAMP_NTZ",
        "bool": "BOOLEAN",
        "list": "ARRAY",
    },
    "bigquery": {
        "int": "INT64",
        "float32": "FLOAT64",
        "float64": "FLOAT64",
        "string": "STRING",
        "date": "DATE",
        "timestamp": "TIMESTAMP",
        "bool": "BOOL",
        "list": "ARRAY<{}>",
    },
    "databricks": {
        "int": "BIGINT",
        "float32": "FLOAT",
        "float64": "DOUBLE",
        "string": "STRING",
        "date": "DATE",
        "timestamp": "TIMESTAMP",
        "bool": "BOOLEAN",
        "list": "ARRAY<{}>",
    },
    "clickhouse": {
        "int": "Int64",
        "float32": "Float32",
        "float64": "Float64",
        "string": "String",
        "date": "Date32",
        "timestamp": "DateTime64(6, 'UTC')",
        "bool": "Bool",
        "list": "Array({})",
    },
}
ARROW = {
    "int": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "string": pa.string(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "bool": pa.bool_(),
}


def kind_of(name: str, t: pa.DataType) -> str:
    """The logical kind of an Arrow type ('list:<element kind>' for lists)."""
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        inner = kind_of(name, t.value_type)
        if inner.startswith("list"):
            raise DataError(f"column '{name}' ({t}): nested lists cannot be written to a warehouse table")
        return f"list:{inner}"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return "float32"
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "float64"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t):
        return "string"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp"
    raise DataError(f"column '{name}' has Arrow type {t}, which no warehouse writer maps")


def arrow_type(kind: str) -> pa.DataType:
    if kind.startswith("list:"):
        return pa.list_(arrow_type(kind[5:]))
    return ARROW[kind]


def sql_type(kind: str, dialect: str) -> str:
    types = TYPES[dialect]
    if kind.startswith("list:"):
        return types["list"].format(sql_type(kind[5:], dialect))
    return types[kind]


def quote(name: str, dialect: str) -> str:
    return exp.to_identifier(name, quoted=True).sql(dialect=dialect)


class TableWriter(Writer):
    """A warehouse table as the destination; subclasses connect, stage and publish."""

    dialect: ClassVar[str]
    upper_case_columns: ClassVar[bool] = False

    def __init__(
        self,
        cfg: PipelineConfig,
        name: str,
        dest: WarehouseOutput,
        dataset: str,
        scenario: str | None,
        as_of: dt.date,
    ) -> None:
        super().__init__(name, dataset, scenario, as_of)
        self.dest = dest
        self.format = dest.kind  # type: ignore[attr-defined]
        self.table_name = dest.table_name(dataset, scenario)
        self.written_at = dt.datetime.now(dt.UTC).replace(microsecond=0)
        location = {
            "database_type": dest.kind,  # type: ignore[attr-defined]
            "table_name": self.table_name,
            "connection_params": dest.connection_params,  # type: ignore[attr-defined]
        }
        src = DataSource(type="attribute", name=name, data_location=location)
        self.what = f"output '{name}' ({dest.kind}:{self.table_name})"  # type: ignore[attr-defined]
        cls = backend_class(dest.kind)  # type: ignore[attr-defined]
        self.src, self.backend_cls, self.is_transient = src, cls, cls.is_transient
        self.backend: Backend = self.retry(lambda: cls(src, Path(cfg.workspace)), "connect")
        self.target: exp.Table = self.qualify(self.backend.table())  # type: ignore[arg-type]
        suffix = f"__stage_{uuid.uuid4().hex[:12]}"
        name = self.target.name + (suffix.upper() if self.upper_case_columns else suffix)
        self.stage_table = self.stage_name(self.target, name)
        self.kinds: dict[str, str] = {}
        self.staged = False

    # ---- helpers -------------------------------------------------------------------------------------
    def qualify(self, table: exp.Table) -> exp.Table:
        """The target table with every part the warehouse needs (the backend's defaults filled in)."""
        return table

    def stage_name(self, target: exp.Table, name: str) -> exp.Table:
        """The staging table: beside the target unless the warehouse needs otherwise."""
        stage = target.copy()
        stage.set("this", exp.to_identifier(name, quoted=True))
        return stage

    def sql(self, node: exp.Expression) -> str:
        return node.sql(dialect=self.dialect, identify=True)

    def q(self, name: str) -> str:
        return quote(name, self.dialect)

    def retry(self, fn: Callable[[], Any], step: str) -> Any:
        """Run an idempotent step, retrying transient failures; failures name the output and the step."""
        return retrying(self.src, self.backend_cls, fn, f"{self.what}: {step}")

    def once(self, fn: Callable[[], Any], step: str) -> Any:
        """Run a step that must not be repeated (appending rows)."""
        try:
            return fn()
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported with the output's name
            why = mask(first_line(exc), self.backend_cls.secrets(self.src.data_location))
            raise DataError(f"{self.what}: {step}: {why}") from exc

    def column_name(self, name: str) -> str:
        return name.upper() if self.upper_case_columns else name

    @property
    def columns(self) -> list[str]:
        return list(self.kinds)

    def prepare(self, table: pa.Table) -> pa.Table:
        """The chunk with scenario and written_at added, names and types normalised for the warehouse."""
        n = table.num_rows
        if clash := {SCENARIO, WRITTEN_AT} & set(table.column_names):
            raise DataError(
                f"{self.what}: the output already has column(s) {', '.join(sorted(clash))}, "
                "which the warehouse writer adds itself"
            )
        table = table.append_column(SCENARIO, pa.array([self.scenario] * n, pa.string()))
        table = table.append_column(WRITTEN_AT, pa.array([self.written_at] * n, ARROW["timestamp"]))
        if not self.kinds:
            names = [self.column_name(f.name) for f in table.schema]
            self.kinds = {nm: kind_of(f.name, f.type) for nm, f in zip(names, table.schema, strict=True)}
        schema = pa.schema([(nm, arrow_type(k)) for nm, k in self.kinds.items()])
        return table.rename_columns(schema.names).cast(schema)

    def slice_condition(self, alias: str | None = None) -> exp.Expression:
        def col(name: str) -> exp.Column:
            return exp.column(self.column_name(name), table=alias, quoted=True)

        scenario = (
            col(SCENARIO).is_(exp.null())
            if self.scenario is None
            else col(SCENARIO).eq(exp.Literal.string(self.scenario))
        )
        day = exp.cast(exp.Literal.string(self.as_of.isoformat()), exp.DataType.build("DATE"))
        return exp.and_(scenario, col(AS_OF).eq(day))

    def create_table_sql(self) -> str:
        cols = ", ".join(f"{self.q(n)} {sql_type(k, self.dialect)}" for n, k in self.kinds.items())
        return f"CREATE TABLE IF NOT EXISTS {self.sql(self.target)} ({cols})"

    def check_target_columns(self) -> None:
        existing = self.retry(self.backend.schema, "read the table's columns")
        have = {c.upper() if self.upper_case_columns else c for c in existing}
        missing = [c for c in self.columns if c not in have]
        if missing:
            raise DataError(
                f"{self.what}: the existing table {self.display()} has no column(s) {', '.join(missing)} "
                f"(it has {', '.join(existing)}); drop or rename it, or set outputs.destinations."
                f"{self.name}.table to another table"
            )

    def display(self) -> str:
        return ".".join(p.name for p in self.target.parts)

    # ---- the Writer protocol --------------------------------------------------------------------------
    def _write(self, table: pa.Table) -> None:
        table = self.prepare(table)
        if not self.staged:
            self.retry(lambda: self.execute(self.create_table_sql()), "create the table")
            self.check_target_columns()
            self.retry(self.create_stage, "create the staging table")
            self.staged = True
        self.once(lambda: self.append(table), "stage rows")

    def _close(self) -> dict[str, Any]:
        if self.staged:
            self.retry(self.publish, "replace the slice")
        elif self.retry(self.target_exists, "look up the table"):  # no rows: the slice becomes empty
            self.retry(self.clear_slice, "clear the slice")
        self.drop_stage()  # the rows are published: a failure here only leaves the staging table behind
        self.backend.close()
        return {"destination": self.display(), "table": self.display()}

    def _abort(self) -> None:
        self.drop_stage()
        with contextlib.suppress(Exception):
            self.backend.close()

    def drop_stage(self) -> None:
        """Drop the staging table; never raises (abort runs while another error is on its way up)."""
        if not self.staged:
            return
        self.staged = False
        try:
            self.execute(f"DROP TABLE IF EXISTS {self.sql(self.stage_table)}")
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            log.warning(
                "%s: could not drop the staging table %s (%s); drop it by hand",
                self.what,
                ".".join(p.name for p in self.stage_table.parts),
                first_line(exc),
            )

    def target_exists(self) -> bool:
        try:
            self.backend.schema()
        except Exception as exc:  # noqa: BLE001 - a missing table is the expected failure here
            if self.is_transient(exc):
                raise
            return False
        return True

    def clear_slice(self) -> None:
        self.execute(self.sql(exp.delete(self.target, where=self.slice_condition())))

    # ---- per warehouse --------------------------------------------------------------------------------
    @abstractmethod
    def execute(self, sql: str) -> None:
        """Run one statement that returns no rows."""

    def create_stage(self) -> None:
        cols = ", ".join(f"{self.q(n)} {sql_type(k, self.dialect)}" for n, k in self.kinds.items())
        self.execute(f"CREATE TABLE {self.sql(self.stage_table)} ({cols})")

    @abstractmethod
    def append(self, table: pa.Table) -> None:
        """Add prepared rows to the staging table."""

    @abstractmethod
    def publish(self) -> None:
        """Replace the target's slice by the staging table's rows, atomically."""

    def merge_sql(self) -> str:
        """One MERGE that deletes the target's slice and inserts the staged rows (atomic where MERGE is)."""
        cols = [self.q(c) for c in self.columns]
        values = ", ".join(f"s.{c}" for c in cols)
        return (
            f"MERGE INTO {self.sql(self.target)} AS t USING {self.sql(self.stage_table)} AS s ON FALSE "
            f"WHEN NOT MATCHED THEN INSERT ({', '.join(cols)}) VALUES ({values}) "
            f"WHEN NOT MATCHED BY SOURCE AND {self.sql(self.slice_condition('t'))} THEN DELETE"
        )


def render_literals(column: pa.ChunkedArray | pa.Array, kind: str, dialect: str) -> list[str]:
    """SQL literals of a column (NULL for nulls and non-finite floats), rendered per dialect."""
    values = column.to_pylist()
    if kind == "int":
        return ["NULL" if v is None else str(int(v)) for v in values]
    if kind in ("float32", "float64"):
        return [_float(v) for v in values]
    if kind == "bool":
        return ["NULL" if v is None else ("TRUE" if v else "FALSE") for v in values]
    if kind.startswith("list:"):
        inner = kind[5:]
        return [
            "NULL" if v is None else f"ARRAY({', '.join(render_literals(pa.array(v), inner, dialect))})"
            for v in values
        ]
    cache: dict[Any, str] = {}

    def one(v: Any) -> str:
        if v is None:
            return "NULL"
        if v not in cache:
            if kind == "date":
                node = exp.cast(exp.Literal.string(v.isoformat()), exp.DataType.build("DATE"))
            elif kind == "timestamp":
                text = v.astimezone(dt.UTC).replace(tzinfo=None).isoformat(sep=" ")
                node = exp.cast(exp.Literal.string(text), exp.DataType.build("TIMESTAMP"))
            else:
                node = exp.Literal.string(str(v))
            cache[v] = node.sql(dialect=dialect)
        return cache[v]

    return [one(v) for v in values]


def _float(v: float | None) -> str:
    if v is None or not math.isfinite(v):
        return "NULL"
    return repr(float(v))
