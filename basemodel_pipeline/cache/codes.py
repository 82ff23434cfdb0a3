"""Categorical codes of the event cache: each categorical column's vocabulary (codes 1..V, existing values
keeping theirs when the cache is appended to, new ones next, most frequent first), the joined attribute
columns' codes, the main-entity attribute arrays, and reading the vocabulary segment files back."""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from basemodel_pipeline.cache.plan import SourcePlan, contains, describe, file_name, key_cond
from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.sources.sql import quote_ident
from basemodel_pipeline.sources.types import infer_column_type


def vocab_table(
    con: duckdb.DuckDBPyConnection, table: str, counts_sql: str, duck_type: str, existing: pa.Table | None
) -> tuple[pa.Table, int]:
    """Create `table(v, code, n)`: the existing values keep codes 1..len(existing); values of `counts_sql`
    (v, n) not among them get the next codes, most frequent first. Returns (every value with its count in
    code order, number of existing values)."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE {table} (v {duck_type}, code INTEGER, n BIGINT)")
    start = 0
    if existing is not None and existing.num_rows:
        codes = pa.array(np.arange(1, existing.num_rows + 1, dtype=np.int32))
        con.register("__old_vocab", pa.table({"value": existing.column("value"), "code": codes}))
        con.execute(f"INSERT INTO {table} SELECT CAST(value AS {duck_type}), code, 0 FROM __old_vocab")
        con.unregister("__old_vocab")
        start = existing.num_rows
        con.execute(f"UPDATE {table} t SET n = c.n FROM ({counts_sql}) c WHERE t.v = c.v")
    con.execute(
        f"INSERT INTO {table} SELECT c.v, ({start} + row_number() OVER (ORDER BY c.n DESC, CAST(c.v AS VARCHAR)))"
        f"::INTEGER, c.n FROM ({counts_sql}) c WHERE c.v IS NOT NULL AND NOT EXISTS "
        f"(SELECT 1 FROM {table} t WHERE t.v = c.v)"
    )
    values = con.execute(f"SELECT CAST(v AS VARCHAR) AS value, n AS count FROM {table} ORDER BY code")
    return values.to_arrow_table(), start


def build_vocabularies(
    con: duckdb.DuckDBPyConnection, plan: SourcePlan, existing: dict[str, pa.Table], only_new: bool
) -> dict[str, tuple[pa.Table, int]]:
    """voc_<source>_<i> for every categorical column and acodes_<source>_<j> for every join.
    Returns {column: (values to write: all, or only_new ones for an append segment, vocabulary size)}."""
    out: dict[str, tuple[pa.Table, int]] = {}
    for i, col in enumerate(plan.columns):
        if col.kind != "categorical":
            continue
        if col.join is None:
            q = quote_ident(col.name)
            counts = f"SELECT {q} AS v, count(*) AS n FROM {plan.rel} GROUP BY 1"
        else:
            j, q = col.join, quote_ident(col.attr_column)
            counts = (
                f"SELECT a.{q} AS v, sum(k.n)::BIGINT AS n FROM {plan.table('kc', j)} k "
                f"JOIN {plan.joins[j].rel} a ON {key_cond(plan, j, 'k')} GROUP BY 1"
            )
        values, start = vocab_table(
            con, plan.table("voc", i), counts, col.source_type, existing.get(col.name)
        )
        out[col.name] = (values.slice(start) if only_new else values, values.num_rows)
    for j, join in enumerate(plan.joins):
        selects = [f"a.{quote_ident(k)}" for k in join.on.values()]
        joins = []
        for i, col in enumerate(plan.columns):
            if col.join != j:
                continue
            q = quote_ident(col.attr_column)
            if col.kind == "categorical":
                joins.append(f"LEFT JOIN {plan.table('voc', i)} v{i} ON a.{q} = v{i}.v")
                selects.append(f"v{i}.code AS c{i}")
            elif col.list_of:
                selects.append(f"{contains(f'a.{q}', col.list_value)} AS c{i}")
            else:
                selects.append(f"CAST(a.{q} AS FLOAT) AS c{i}")
            col.expr = f"j{j}.c{i}"
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE {plan.table('acodes', j)} AS SELECT {', '.join(selects)} "
            f"FROM {join.rel} a {' '.join(joins)}"
        )
    return out


def attribute_arrays(
    cfg: PipelineConfig,
    con: duckdb.DuckDBPyConnection,
    rel: str,
    id_type: str,
    first: int,
    existing: dict[str, pa.Table],
    segment: bool,
) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, pa.Table]]:
    """Main-entity attributes of entity indices >= first: (manifest meta, {file stem: array}, {column:
    vocabulary values to write}). For an append `segment`: no match check, only the new values."""
    src = cfg.sources("main_entity_attribute")[0]
    key = src.main_entity_column or ""
    types = describe(con, rel)
    cond = f"m.id = CAST(a.{quote_ident(key)} AS {id_type})"
    if not segment:
        matched = con.execute(f"SELECT count(*) FROM ent_map m SEMI JOIN {rel} a ON {cond}").fetchone()[0]
        if matched == 0:
            raise DataError(
                f"main_entity_attribute source '{src.name}': no {key} matches any entity of the event "
                "sources (are the ids formatted differently?)"
            )
    meta: dict[str, Any] = {"source": src.name, "columns": {}}
    selects, joins, new_vocab = [], [], {}
    for i, (col, t) in enumerate(types.items()):
        kind = infer_column_type(col, t, src.column_types.get(col))
        if col == key or kind == "ignore" or not src.keeps(col):
            continue
        if kind == "list":  # said in the manifest and by validate / suggest-config, never silently
            meta.setdefault("ignored", {})[col] = (
                "list-valued main-entity attribute: not used (list columns of event and joined attribute "
                "sources become multi-hot indicators); store one row per value in an event or attribute source"
            )
            continue
        q, name = quote_ident(col), file_name(col)
        if kind == "categorical":
            table = quote_ident(f"voc_attr_{i}")
            counts = f"SELECT {q} AS v, count(*) AS n FROM {rel} GROUP BY 1"
            values, start = vocab_table(con, table, counts, t, existing.get(col))
            new_vocab[col] = values.slice(start) if segment else values
            size = values.num_rows
            joins.append(f"LEFT JOIN {table} v{i} ON a.{q} = v{i}.v")
            selects.append(f"CAST(coalesce(v{i}.code, 0) AS INTEGER) AS {quote_ident(name)}")
            meta["columns"][col] = {"type": "categorical", "vocab_size": size, "file": name}
        else:
            selects.append(f"CAST(coalesce(a.{q}, 0) AS FLOAT) AS {quote_ident(name)}")
            meta["columns"][col] = {"type": "numeric", "file": name}
    if not selects:
        return meta, {}, new_vocab
    sql = (
        f"SELECT {', '.join(selects)} FROM ent_map m LEFT JOIN (SELECT DISTINCT ON ({quote_ident(key)}) * "
        f"FROM {rel}) a ON {cond} {' '.join(joins)} WHERE m.idx >= {first} ORDER BY m.idx"
    )
    return meta, con.execute(sql).fetchnumpy(), new_vocab


def read_vocab(files: list[Any]) -> pa.Table:
    """Concatenated (value, code order) of vocabulary segment files that exist."""
    tables = [pq.read_table(f, columns=["value"]) for f in files if f.exists()]
    if not tables:
        return pa.table({"value": pa.array([], pa.string())})
    return pa.concat_tables(tables)
