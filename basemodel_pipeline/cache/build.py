"""Build the event cache from the extracts with DuckDB.

Layout of <workspace>/cache/<fingerprint>/ (all arrays are .npy, read back through memory maps):
    manifest.json                  sizes, column types, inputs, sha256 of every file
    entities.parquet               entity_id in entity-index order
    events/<source>/offsets.npy    int64 [n_entities + 1]: events of entity i are rows offsets[i]:offsets[i+1]
    events/<source>/ts.npy         int64 [n_events] epoch seconds, sorted within each entity
    events/<source>/<column>.npy   int32 codes (categorical, 0 = missing) or float32 (numeric)
    vocab/<source>/<column>.parquet  value, count: code k is row k-1 (most frequent first)
    attributes/<column>.npy        main-entity attributes per entity index
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.config import PipelineConfig, data_fingerprint
from basemodel_pipeline.config.models import DataSource
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.progress import Progress
from basemodel_pipeline.sources.parquet import quote_ident, quote_literal

FORMAT_VERSION = 1
NUMERIC_PREFIXES = (
    "TINYINT",
    "SMALLINT",
    "INTEGER",
    "BIGINT",
    "HUGEINT",
    "UTINYINT",
    "USMALLINT",
    "UINTEGER",
    "UBIGINT",
    "FLOAT",
    "DOUBLE",
    "DECIMAL",
    "REAL",
)
FLOAT_PREFIXES = ("FLOAT", "DOUBLE", "DECIMAL", "REAL")


def infer_column_type(name: str, duck_type: str, override: str | None) -> str:
    """categorical | numeric | ignore. Integers named like ids are categorical; floats numeric; text categorical."""
    if override:
        return override
    t = duck_type.upper()
    if t.startswith(("DATE", "TIME", "INTERVAL", "BLOB", "STRUCT", "MAP", "LIST")) or t.endswith("[]"):
        return "ignore"
    if t.startswith(FLOAT_PREFIXES):
        return "numeric"
    if t.startswith(NUMERIC_PREFIXES):
        return "categorical" if name.lower().endswith("id") or name.lower().endswith("_key") else "numeric"
    return "categorical"


def extract_glob(cfg: PipelineConfig, src: DataSource) -> str:
    d = ws.extracts_dir(cfg, src.name)
    files = sorted(d.glob("*.parquet"))
    if not files:
        raise DataError(f"no extract found for source '{src.name}' in {d}; run the extract stage first")
    return str(d / "*.parquet")


def input_signature(cfg: PipelineConfig) -> dict[str, list[list[Any]]]:
    """Name, size and mtime of every extract file: the cache is rebuilt when any of them changes."""
    sig = {}
    for src in cfg.data_sources:
        d = ws.extracts_dir(cfg, src.name)
        sig[src.name] = [
            [f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(d.glob("*.parquet"))
        ]
    return sig


def cache_dir(cfg: PipelineConfig) -> Path:
    return ws.cache_root(cfg) / data_fingerprint(cfg)


def build_cache(cfg: PipelineConfig, progress: Progress) -> dict[str, Any]:
    final = cache_dir(cfg)
    signature = input_signature(cfg)
    manifest_file = final / "manifest.json"
    if manifest_file.exists():
        manifest = json.loads(manifest_file.read_text())
        if manifest.get("inputs") == signature and manifest.get("format_version") == FORMAT_VERSION:
            return _summary(final, manifest, reused=True)
    ws.clean_stale_tmp(final.parent)
    tmp = ws.staging_dir(final)
    con = _connect(cfg, tmp)
    try:
        manifest = _build(cfg, con, tmp, progress)
    finally:
        con.close()
        shutil.rmtree(tmp / ".duckdb_spill", ignore_errors=True)
    manifest["inputs"] = signature
    manifest["files"] = {
        str(f.relative_to(tmp)): {"bytes": f.stat().st_size, "sha256": ws.sha256_file(f)}
        for f in sorted(tmp.rglob("*"))
        if f.is_file()
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    ws.publish_dir(tmp, final)
    return _summary(final, manifest, reused=False)


def _connect(cfg: PipelineConfig, staging: Path) -> duckdb.DuckDBPyConnection:
    """DuckDB with bounded memory: sorts larger than the limit spill to disk instead of growing the process."""
    p = cfg.cache
    spill = Path(p.spill_directory) if p.spill_directory else staging / ".duckdb_spill"
    spill.mkdir(parents=True, exist_ok=True)
    config = {"memory_limit": p.duckdb_memory_limit, "temp_directory": str(spill)}
    if p.threads:
        config["threads"] = p.threads
    return duckdb.connect(config=config)


def _summary(path: Path, manifest: dict[str, Any], reused: bool) -> dict[str, Any]:
    return {
        "path": str(path),
        "fingerprint": manifest["fingerprint"],
        "entities": manifest["n_entities"],
        "events": sum(s["n_events"] for s in manifest["sources"].values()),
        "bytes": sum(f["bytes"] for f in manifest["files"].values()),
        "min_date": min(s["min_date"] for s in manifest["sources"].values()),
        "max_date": max(s["max_date"] for s in manifest["sources"].values()),
        "reused": reused,
    }


def _event_view(
    cfg: PipelineConfig, con: duckdb.DuckDBPyConnection, src: DataSource
) -> dict[str, tuple[str, str]]:
    """Create view ev_<name>: the event extract joined with its attribute sources.

    Returns column -> (duckdb type, inferred type) for the data columns of the view."""
    view = quote_ident(f"ev_{src.name}")
    base = f"read_parquet({quote_literal(extract_glob(cfg, src))})"
    selects, joins = ["e.*"], []
    event_cols = {r[0]: r[1] for r in con.execute(f"DESCRIBE SELECT * FROM {base}").fetchall()}
    types = {c: (t, infer_column_type(c, t, src.column_types.get(c))) for c, t in event_cols.items()}
    for j, join in enumerate(src.joined_data_sources):
        attr = cfg.source(join.name)
        attr_rel = f"read_parquet({quote_literal(extract_glob(cfg, attr))})"
        attr_cols = {r[0]: r[1] for r in con.execute(f"DESCRIBE SELECT * FROM {attr_rel}").fetchall()}
        keys = list(join.join_on.values())
        dup = con.execute(
            f"SELECT {', '.join(quote_ident(k) for k in keys)}, count(*) FROM {attr_rel} GROUP BY ALL "
            "HAVING count(*) > 1 LIMIT 1"
        ).fetchone()
        if dup:
            raise DataError(
                f"attribute source '{attr.name}': key {dict(zip(keys, dup[:-1], strict=True))} appears {dup[-1]} "
                f"times; join keys {keys} must be unique (deduplicate the table or pick another key)"
            )
        alias = f"a{j}"
        cond = " AND ".join(
            f"CAST(e.{quote_ident(left)} AS VARCHAR) = CAST({alias}.{quote_ident(right)} AS VARCHAR)"
            for left, right in join.join_on.items()
        )
        joins.append(f"LEFT JOIN {attr_rel} {alias} ON {cond}")
        matched = con.execute(
            f"SELECT count(*) FROM {base} e SEMI JOIN {attr_rel} {alias} ON {cond}"
        ).fetchone()[0]
        if matched == 0:
            raise DataError(
                f"source '{src.name}' joined with '{attr.name}' on {join.join_on}: no event matches any row "
                "(are the ids formatted differently in the two sources?)"
            )
        for c, t in attr_cols.items():
            if c in keys:
                continue
            name = c if c not in types else f"{attr.name}.{c}"
            selects.append(f"{alias}.{quote_ident(c)} AS {quote_ident(name)}")
            types[name] = (t, infer_column_type(c, t, attr.column_types.get(c)))
    con.execute(
        f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT {', '.join(selects)} FROM {base} e {' '.join(joins)}"
    )
    # materialise once: the entity index, the vocabularies and the sorted write all scan it
    con.execute(f"CREATE OR REPLACE TEMP TABLE {quote_ident(f'evt_{src.name}')} AS SELECT * FROM {view}")
    assert src.main_entity_column and src.date_column
    for key in (src.main_entity_column, src.date_column.name):
        types.pop(key, None)
    return {c: v for c, v in types.items() if v[1] != "ignore"}


def _build(
    cfg: PipelineConfig, con: duckdb.DuckDBPyConnection, out: Path, progress: Progress
) -> dict[str, Any]:
    events = cfg.sources("event")
    progress.start("cache", len(events) + 2)
    columns = {src.name: _event_view(cfg, con, src) for src in events}
    # entity index: every entity with at least one event, sorted by id
    union = " UNION ".join(
        f"SELECT DISTINCT CAST({quote_ident(s.main_entity_column)} AS VARCHAR) AS entity_id "
        f"FROM {quote_ident('evt_' + s.name)} WHERE {quote_ident(s.main_entity_column)} IS NOT NULL"
        for s in events
    )
    id_types = {
        con.execute(
            f"SELECT typeof({quote_ident(s.main_entity_column)}) FROM {quote_ident('evt_' + s.name)} LIMIT 1"
        ).fetchone()[0]
        for s in events
    }
    numeric_ids = all(t in ("BIGINT", "INTEGER", "HUGEINT", "UBIGINT") for t in id_types)
    order = "CAST(entity_id AS BIGINT)" if numeric_ids else "entity_id"
    con.execute(
        f"CREATE TEMP TABLE entities AS SELECT entity_id, row_number() OVER (ORDER BY {order}) - 1 AS idx "
        f"FROM ({union})"
    )
    n_entities = con.execute("SELECT count(*) FROM entities").fetchone()[0]
    ent_sql = f"SELECT {'CAST(entity_id AS BIGINT)' if numeric_ids else 'entity_id'} AS entity_id FROM entities ORDER BY idx"
    con.execute(f"COPY ({ent_sql}) TO {quote_literal(str(out / 'entities.parquet'))} (FORMAT parquet)")
    progress.advance("cache")
    manifest: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "fingerprint": data_fingerprint(cfg),
        "created": dt.datetime.now(dt.UTC).isoformat(),
        "n_entities": int(n_entities),
        "entity_id_type": "int64" if numeric_ids else "string",
        "sources": {},
    }
    for src in events:
        manifest["sources"][src.name] = _write_source(con, src, columns[src.name], out, n_entities)
        progress.advance("cache")
    manifest["attributes"] = _write_attributes(cfg, con, out)
    progress.advance("cache")
    return manifest


def _vocab(con: duckdb.DuckDBPyConnection, view: str, col: str, out: Path) -> tuple[str, int]:
    """Frequency-ordered vocabulary table voc_<col>(v, code); writes it to Parquet. Returns (table, size)."""
    table = quote_ident(f"voc_{view}_{col}")
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {table} AS SELECT v, row_number() OVER (ORDER BY c DESC, v) AS code, c "
        f"FROM (SELECT CAST({quote_ident(col)} AS VARCHAR) AS v, count(*) AS c FROM {quote_ident(view)} "
        f"WHERE {quote_ident(col)} IS NOT NULL GROUP BY 1)"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    con.execute(
        f"COPY (SELECT v AS value, c AS count FROM {table} ORDER BY code) TO {quote_literal(str(out))} "
        "(FORMAT parquet)"
    )
    return table, int(con.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def _write_source(
    con: duckdb.DuckDBPyConnection,
    src: DataSource,
    cols: dict[str, tuple[str, str]],
    out: Path,
    n_entities: int,
) -> dict[str, Any]:
    view = f"evt_{src.name}"
    ent, ts = (
        quote_ident(src.main_entity_column or ""),
        quote_ident(src.date_column.name if src.date_column else ""),
    )
    d = out / "events" / src.name
    d.mkdir(parents=True)
    selects, joins, meta = ["en.idx AS __idx", f"CAST(epoch(e.{ts}) AS BIGINT) AS __ts"], [], {}
    for i, (col, (duck_type, kind)) in enumerate(cols.items()):
        fname = _file_name(col)
        if kind == "categorical":
            table, size = _vocab(con, view, col, out / "vocab" / src.name / f"{fname}.parquet")
            joins.append(f"LEFT JOIN {table} v{i} ON CAST(e.{quote_ident(col)} AS VARCHAR) = v{i}.v")
            selects.append(f"CAST(coalesce(v{i}.code, 0) AS INTEGER) AS c{i}")
            meta[col] = {"type": "categorical", "vocab_size": size, "file": fname, "source_type": duck_type}
        else:
            selects.append(f"CAST(coalesce(e.{quote_ident(col)}, 0) AS FLOAT) AS c{i}")
            meta[col] = {"type": "numeric", "file": fname, "source_type": duck_type}
    sql = (
        f"SELECT {', '.join(selects)} FROM {quote_ident(view)} e "
        f"JOIN entities en ON CAST(e.{ent} AS VARCHAR) = en.entity_id {' '.join(joins)} "
        f"WHERE e.{ts} IS NOT NULL ORDER BY __idx, __ts"
    )
    n = con.execute(
        f"SELECT count(*) FROM {quote_ident(view)} e WHERE e.{ent} IS NOT NULL AND e.{ts} IS NOT NULL"
    ).fetchone()[0]
    arrays = {
        "__idx": np.lib.format.open_memmap(d / ".idx.npy", "w+", np.int64, (n,)),
        "__ts": np.lib.format.open_memmap(d / "ts.npy", "w+", np.int64, (n,)),
    }
    for i, m in enumerate(meta.values()):
        dtype = np.int32 if m["type"] == "categorical" else np.float32
        arrays[f"c{i}"] = np.lib.format.open_memmap(d / f"{m['file']}.npy", "w+", dtype, (n,))
    pos = 0
    reader = con.execute(sql).fetch_record_batch(1 << 20)
    for batch in reader:
        k = batch.num_rows
        for name, arr in arrays.items():
            arr[pos : pos + k] = batch.column(name).to_numpy(zero_copy_only=False)
        pos += k
    assert pos == n, (pos, n)
    counts = np.bincount(arrays["__idx"], minlength=n_entities)
    offsets = np.zeros(n_entities + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    np.save(d / "offsets.npy", offsets)
    ts_arr = arrays["__ts"]
    for arr in arrays.values():
        arr.flush()
    del arrays
    (d / ".idx.npy").unlink()
    return {
        "n_events": int(n),
        "entity_column": src.main_entity_column,
        "min_date": dt.datetime.fromtimestamp(int(ts_arr.min()), dt.UTC).date().isoformat() if n else None,
        "max_date": dt.datetime.fromtimestamp(int(ts_arr.max()), dt.UTC).date().isoformat() if n else None,
        "columns": meta,
    }


def _write_attributes(cfg: PipelineConfig, con: duckdb.DuckDBPyConnection, out: Path) -> dict[str, Any]:
    srcs = cfg.sources("main_entity_attribute")
    if not srcs:
        return {}
    src = srcs[0]
    rel = f"read_parquet({quote_literal(extract_glob(cfg, src))})"
    con.execute(f"CREATE TEMP VIEW attr AS SELECT * FROM {rel}")
    key = src.main_entity_column or ""
    desc = {r[0]: r[1] for r in con.execute("DESCRIBE SELECT * FROM attr").fetchall()}
    matched = con.execute(
        f"SELECT count(*) FROM entities en SEMI JOIN attr a ON en.entity_id = CAST(a.{quote_ident(key)} AS VARCHAR)"
    ).fetchone()[0]
    if matched == 0:
        raise DataError(
            f"main_entity_attribute source '{src.name}': no {key} matches any entity of the event "
            "sources (are the ids formatted differently?)"
        )
    d = out / "attributes"
    d.mkdir()
    meta: dict[str, Any] = {"source": src.name, "matched_entities": int(matched), "columns": {}}
    for col, t in desc.items():
        kind = infer_column_type(col, t, src.column_types.get(col))
        if col == key or kind == "ignore":
            continue
        fname = _file_name(col)
        if kind == "categorical":
            table, size = _vocab(con, "attr", col, out / "vocab" / "__attributes" / f"{fname}.parquet")
            value = "coalesce(v.code, 0)::INTEGER"
            join = f"LEFT JOIN {table} v ON CAST(a.{quote_ident(col)} AS VARCHAR) = v.v"
            meta["columns"][col] = {"type": "categorical", "vocab_size": size, "file": fname}
        else:
            value, join = f"coalesce(a.{quote_ident(col)}, 0)::FLOAT", ""
            meta["columns"][col] = {"type": "numeric", "file": fname}
        sql = (
            f"SELECT {value} AS x FROM entities en LEFT JOIN (SELECT DISTINCT ON ({quote_ident(key)}) * FROM attr) a "
            f"ON en.entity_id = CAST(a.{quote_ident(key)} AS VARCHAR) {join} ORDER BY en.idx"
        )
        np.save(d / f"{fname}.npy", con.execute(sql).fetchnumpy()["x"])
    return meta


def _file_name(col: str) -> str:
    """File stem for a column: prefixed so that no column can collide with ts/offsets."""
    return "col_" + "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in col)
