"""The SQL side of a cache build or append: which columns an event source contributes, the entity map and
the vocabularies as DuckDB tables on native types, and the one scan query that joins them to the events.

Tables (per connection): ``ent_map(id, idx)``; ``voc_<source>_<i>(v, code, n)`` per categorical column;
``kc_<source>_<j>`` (join-key counts of the events) and ``acodes_<source>_<j>`` (one row per attribute key
with its codes and numbers) per joined attribute source. Vocabularies can start from an existing cache's
values (appends keep every code and add new values after them)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np

from basemodel_pipeline.cache.segment import IDX, ROW_ALIAS, TS, Lookup, OutColumn
from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.config.models import DataSource
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.sources.sql import quote_ident, quote_literal
from basemodel_pipeline.sources.types import INTEGER_PREFIXES, infer_column_type

LIST_VALUES = 32  # a list-valued column becomes 0/1 indicators of its most frequent values


def file_name(col: str) -> str:
    """File stem for a column: prefixed so that no column can collide with ts/offsets. A name with other
    characters than letters, digits, _ and - also carries a hash of itself, so that "a b" and "a_b" get two
    files instead of sharing one."""
    safe = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in col)
    if safe != col:
        safe += "-" + hashlib.sha256(col.encode()).hexdigest()[:8]
    return "col_" + safe


def describe(con: duckdb.DuckDBPyConnection, rel: str) -> dict[str, str]:
    return {r[0]: r[1] for r in con.execute(f"DESCRIBE SELECT * FROM {rel}").fetchall()}


def equals(left: str, left_type: str, right: str, right_type: str) -> str:
    """Join condition on native types when both sides are integers or of the same type, else as text."""
    same = left_type == right_type or (
        left_type.upper().startswith(INTEGER_PREFIXES) and right_type.upper().startswith(INTEGER_PREFIXES)
    )
    return f"{left} = {right}" if same else f"CAST({left} AS VARCHAR) = CAST({right} AS VARCHAR)"


ROW = "file_row_number"


def parquet_rel(files: list[str], row_numbers: bool = False) -> str:
    """read_parquet of the files; with row_numbers, each row's number in its file (the tie-breaker that makes
    the order of simultaneous events of an entity the order of the extract, whatever DuckDB's join order)."""
    opts = ", file_row_number = true" if row_numbers else ""
    return f"read_parquet([{', '.join(quote_literal(f) for f in files)}]{opts})"


@dataclass
class Column:
    name: str
    kind: str  # categorical | numeric
    source_type: str
    expr: str  # in the scan, over the events e (and the attribute code table for joined columns)
    join: int | None = None  # index of the joined attribute source, None for the event's own columns
    attr_column: str = ""  # column in the attribute source
    list_of: str = ""  # an indicator of a list-valued column: that column's name ...
    list_value: str = ""  # ... and the value (as text) it indicates

    @property
    def file(self) -> str:
        return file_name(self.name)

    def meta(self, vocab_size: int = 0) -> dict[str, Any]:
        m: dict[str, Any] = {"type": self.kind, "file": self.file, "source_type": self.source_type}
        if self.kind == "categorical":
            m["vocab_size"] = vocab_size
        if self.list_of:
            m.update(list_of=self.list_of, list_value=self.list_value)
        return m


def contains(list_expr: str, value: str) -> str:
    """1.0 when the list holds the value (compared as text), else 0.0 (also for a missing list)."""
    return f"CAST(coalesce(list_contains(CAST({list_expr} AS VARCHAR[]), {quote_literal(value)}), false) AS FLOAT)"


def list_columns(
    con: duckdb.DuckDBPyConnection,
    name: str,
    duck_type: str,
    values_sql: str,
    fixed: list[str] | None,
    join: int | None = None,
    attr_column: str = "",
    expr: str = "",
) -> list[Column]:
    """Multi-hot of a list-valued column: one numeric 0/1 column "<name>=<value>" per value among its
    LIST_VALUES most frequent (``values_sql`` yields one row v per list element), or the ``fixed`` values an
    existing cache already has (appends keep the columns of the base)."""
    if fixed is None:
        rows = con.execute(
            f"SELECT CAST(v AS VARCHAR) AS v, count(*) AS n FROM ({values_sql}) WHERE v IS NOT NULL "
            f"GROUP BY 1 ORDER BY n DESC, v LIMIT {LIST_VALUES}"
        ).fetchall()
        fixed = [r[0] for r in rows]
    return [
        Column(
            f"{name}={v}", "numeric", duck_type, contains(expr, v) if expr else "", join, attr_column, name, v
        )
        for v in fixed
    ]


def fixed_lists(columns_meta: dict[str, Any] | None) -> dict[str, list[str]]:
    """{list column: its indicated values} recorded in a cache manifest's column meta."""
    out: dict[str, list[str]] = {}
    for m in (columns_meta or {}).values():
        if m.get("list_of"):
            out.setdefault(m["list_of"], []).append(m["list_value"])
    return out


@dataclass
class Join:
    source: DataSource
    rel: str
    types: dict[str, str]
    on: dict[str, str]  # event column -> attribute column


@dataclass
class SourcePlan:
    src: DataSource
    rel: str  # FROM expression of the events
    types: dict[str, str]
    columns: list[Column] = field(default_factory=list)
    joins: list[Join] = field(default_factory=list)

    @property
    def entity(self) -> str:
        return quote_ident(self.src.main_entity_column or "")

    @property
    def ts(self) -> str:
        return quote_ident(self.src.date_column.name if self.src.date_column else "")

    def table(self, kind: str, i: int) -> str:
        return quote_ident(f"{kind}_{self.src.name}_{i}")


def plan_source(
    cfg: PipelineConfig,
    con: duckdb.DuckDBPyConnection,
    src: DataSource,
    rel: str,
    attr_rels: dict[str, str],
    previous_columns: dict[str, Any] | None = None,
) -> SourcePlan:
    """Columns of an event source (its own, then those of its joined attribute sources) and their types.
    ``previous_columns`` (an existing cache's column meta) fixes the values of list-valued columns (appends)."""
    types = describe(con, rel)
    plan = SourcePlan(src, rel, types)
    assert src.main_entity_column and src.date_column
    skip = {src.main_entity_column, src.date_column.name, ROW}
    names = {c for c in types if src.keeps(c)}  # as a fresh extract would have them
    fixed: dict[str, list[str]] | None = (
        fixed_lists(previous_columns) if previous_columns is not None else None
    )
    for c, t in types.items():
        kind = infer_column_type(c, t, src.column_types.get(c))
        if c in skip or kind == "ignore" or not src.keeps(c):
            continue
        if kind == "list":
            q = quote_ident(c)
            values = f"SELECT unnest(e.{q}) AS v FROM {rel} e"
            keep = None if fixed is None else fixed.get(c, [])
            plan.columns += list_columns(con, c, t, values, keep, expr=f"e.{q}")
            continue
        plan.columns.append(Column(c, kind, t, f"e.{quote_ident(c)}"))
    for j, join in enumerate(src.joined_data_sources):
        attr = cfg.source(join.name)
        arel = attr_rels[attr.name]
        atypes = describe(con, arel)
        plan.joins.append(Join(attr, arel, atypes, dict(join.join_on)))
        for c, t in atypes.items():
            if c in join.join_on.values() or not attr.keeps(c):
                continue
            name = c if c not in names else f"{attr.name}.{c}"
            names.add(name)
            kind = infer_column_type(c, t, attr.column_types.get(c))
            if kind == "list":
                values = f"SELECT unnest(a.{quote_ident(c)}) AS v FROM {arel} a"
                keep = None if fixed is None else fixed.get(name, [])
                plan.columns += list_columns(con, name, t, values, keep, join=j, attr_column=c)
            elif kind != "ignore":
                plan.columns.append(Column(name, kind, t, "", join=j, attr_column=c))
    return plan


def check_joins(con: duckdb.DuckDBPyConnection, plan: SourcePlan) -> None:
    """Attribute keys must be unique and match at least one event (run after key_counts)."""
    for j, join in enumerate(plan.joins):
        keys = list(join.on.values())
        dup = con.execute(
            f"SELECT {', '.join(quote_ident(k) for k in keys)}, count(*) FROM {join.rel} GROUP BY ALL "
            "HAVING count(*) > 1 LIMIT 1"
        ).fetchone()
        if dup:
            raise DataError(
                f"attribute source '{join.source.name}': key {dict(zip(keys, dup[:-1], strict=True))} appears "
                f"{dup[-1]} times; join keys {keys} must be unique (deduplicate the table or pick another key)"
            )
        matched = con.execute(
            f"SELECT count(*) FROM {plan.table('kc', j)} k SEMI JOIN {join.rel} a ON {key_cond(plan, j, 'k')}"
        ).fetchone()[0]
        if matched == 0:
            raise DataError(
                f"source '{plan.src.name}' joined with '{join.source.name}' on {join.on}: no event matches any "
                "row (are the ids formatted differently in the two sources?)"
            )


def key_cond(plan: SourcePlan, j: int, left: str, right: str = "a") -> str:
    join = plan.joins[j]
    return " AND ".join(
        equals(f"{left}.{quote_ident(ev)}", plan.types[ev], f"{right}.{quote_ident(at)}", join.types[at])
        for ev, at in join.on.items()
    )


def key_counts(con: duckdb.DuckDBPyConnection, plan: SourcePlan) -> None:
    """kc_<source>_<j>: events per join key (the vocabularies of joined columns count events through it)."""
    for j, join in enumerate(plan.joins):
        keys = ", ".join(quote_ident(k) for k in join.on)
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE {plan.table('kc', j)} AS SELECT {keys}, count(*) AS n "
            f"FROM {plan.rel} GROUP BY ALL"
        )


def ts_expr(col: str) -> str:
    """Epoch seconds (floor) of a DATE/TIMESTAMP column."""
    return f"CAST(floor(epoch_us(CAST({col} AS TIMESTAMP)) / 1000000.0) AS BIGINT)"


LOOKUP_SLACK = 4  # a dense lookup table may be this many times larger than the number of keys (+ 1M)


def lookup(
    con: duckdb.DuckDBPyConnection, sql: str, key: str, dtype: type, default: float = 0
) -> Lookup | None:
    """Dense key -> value table of `sql` (k, x) when the integer keys span a small range, else None."""
    data = con.execute(sql).fetchnumpy()
    k, x = data["k"], data["x"]
    if np.ma.isMaskedArray(k):  # NULL keys never match
        keep = ~np.ma.getmaskarray(k)
        k, x = k.data[keep], x[keep]
    if not len(k):
        return None
    lo, hi = int(k.min()), int(k.max())
    if hi - lo + 1 > LOOKUP_SLACK * len(k) + (1 << 20):
        return None
    table = np.full(hi - lo + 1, default, dtype=dtype)
    table[k.astype(np.int64) - lo] = np.ma.filled(x, default) if np.ma.isMaskedArray(x) else x
    return Lookup(key, lo, table, default)


def _integer(t: str) -> bool:
    return t.upper().startswith(INTEGER_PREFIXES)


def scan_sql(
    con: duckdb.DuckDBPyConnection, plan: SourcePlan, id_type: str
) -> tuple[str, Lookup | None, list[OutColumn]]:
    """The query streaming (entity index, epoch seconds, row in file, codes/values) of every event with an
    entity and a time. Joins on integer keys of a small range become dense lookup tables applied by numpy
    (about 10x cheaper than DuckDB's hash joins); other keys are joined in DuckDB on native types."""
    selects = [f"{ts_expr('e.' + plan.ts)} AS {TS}", f"CAST(e.{ROW} AS INTEGER) AS {ROW_ALIAS}"]
    joins = []
    entity = None
    if id_type == "BIGINT":
        entity = lookup(con, "SELECT id AS k, idx AS x FROM ent_map", "__key_entity", np.int64, -1)
    if entity:
        selects.append(f"CAST(e.{plan.entity} AS BIGINT) AS __key_entity")
    else:
        selects.append(f"m.idx AS {IDX}")
        joins.append(f"JOIN ent_map m ON CAST(e.{plan.entity} AS {id_type}) = m.id")
    outs = []
    join_lookup = {}
    for j, join in enumerate(plan.joins):
        (ev, at), single = next(iter(join.on.items())), len(join.on) == 1
        join_lookup[j] = single and _integer(plan.types[ev]) and _integer(join.types[at])
        if join_lookup[j]:
            lo, hi, n = con.execute(
                f"SELECT min({quote_ident(at)}), max({quote_ident(at)}), count(*) FROM {plan.table('acodes', j)}"
            ).fetchone()
            join_lookup[j] = bool(n) and hi - lo + 1 <= LOOKUP_SLACK * n + (1 << 20)
        if join_lookup[j]:
            selects.append(f"e.{quote_ident(ev)} AS __key_j{j}")
        else:
            joins.append(f"LEFT JOIN {plan.table('acodes', j)} j{j} ON {key_cond(plan, j, 'e', f'j{j}')}")
    for i, col in enumerate(plan.columns):
        dtype, cast = (np.int32, "INTEGER") if col.kind == "categorical" else (np.float32, "FLOAT")
        table = None
        if col.join is not None and join_lookup[col.join]:
            at = quote_ident(next(iter(plan.joins[col.join].on.values())))
            acodes = plan.table("acodes", col.join)
            table = lookup(con, f"SELECT {at} AS k, c{i} AS x FROM {acodes}", f"__key_j{col.join}", dtype)
            assert table is not None  # the key range was checked above
        elif col.join is None and col.kind == "categorical" and _integer(col.source_type):
            table = lookup(con, f"SELECT v AS k, code AS x FROM {plan.table('voc', i)}", f"__key_c{i}", dtype)
            if table:
                selects.append(f"{col.expr} AS __key_c{i}")
        if table is not None:
            outs.append(OutColumn(f"c{i}", col.file, dtype, table))
            continue
        if col.kind == "categorical" and col.join is None:
            joins.append(f"LEFT JOIN {plan.table('voc', i)} v{i} ON {col.expr} = v{i}.v")
            value = f"v{i}.code"
        else:
            value = col.expr
        selects.append(f"CAST(coalesce({value}, 0) AS {cast}) AS c{i}")
        outs.append(OutColumn(f"c{i}", col.file, dtype))
    sql = (
        f"SELECT {', '.join(selects)} FROM {plan.rel} e {' '.join(joins)} "
        f"WHERE e.{plan.ts} IS NOT NULL AND e.{plan.entity} IS NOT NULL"
    )
    return sql, entity, outs


def entity_id_type(plans: list[SourcePlan]) -> str:
    """BIGINT when every event source's entity column is an integer, else VARCHAR."""
    types = [p.types[p.src.main_entity_column or ""] for p in plans]
    return "BIGINT" if all(t.upper().startswith(INTEGER_PREFIXES) for t in types) else "VARCHAR"


def entity_counts_sql(plans: list[SourcePlan], id_type: str) -> str:
    """(id, n): events per entity over every event source."""
    union = " UNION ALL ".join(
        f"SELECT CAST({p.entity} AS {id_type}) AS id, count(*) AS n FROM {p.rel} "
        f"WHERE {p.entity} IS NOT NULL AND {p.ts} IS NOT NULL GROUP BY 1"
        for p in plans
    )
    return f"SELECT id, sum(n)::BIGINT AS n FROM ({union}) GROUP BY 1"
