"""What writing a cache version takes, shared by a full build (cache/build.py) and an append
(cache/append.py): the DuckDB connection, the entity map, the vocabularies and CSR arrays of one source,
the attributes, the file records and the summary. The layout is build.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from basemodel_pipeline import manifests
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache import codes, integrity, versions
from basemodel_pipeline.cache import plan as P
from basemodel_pipeline.cache.segment import write_segment
from basemodel_pipeline.cache.view import active_segments, existing_vocab, segment_dirs
from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.config.models import DataSource
from basemodel_pipeline.dates import iso_day
from basemodel_pipeline.errors import DataError


def extract_files(cfg: PipelineConfig, src: DataSource) -> list[Path]:
    """A source's extract files, sorted; a DataError naming the stage to run when there are none."""
    d = ws.extracts_dir(cfg, src.name)
    files = sorted(d.glob("*.parquet"))
    if not files:
        raise DataError(f"no extract found for source '{src.name}' in {d}; run the extract stage first")
    return files


def connect(cfg: PipelineConfig, spill: Path) -> duckdb.DuckDBPyConnection:
    """DuckDB with bounded memory: whatever exceeds the limit spills to disk instead of growing the process."""
    p = cfg.cache
    spill.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "memory_limit": p.duckdb_memory_limit,
        "temp_directory": str(spill),
        "preserve_insertion_order": False,  # the order is restored by the sort (segment.py)
    }
    if p.threads:
        config["threads"] = p.threads
    return duckdb.connect(config=config)


def file_records(root: Path, known: dict[str, str], under: Path | None = None) -> dict[str, Any]:
    """{relative path: {bytes, sha256, mtime_ns}} of every file under `under` (default: root); `known` hashes are
    reused (computed while writing), the rest are read."""
    records = {}
    for f in sorted((under or root).rglob("*")):
        if f.is_file() and f.name != "manifest.json":
            rel = str(f.relative_to(root))
            records[rel] = integrity.record(f, known.get(str(f)) or manifests.sha256_file(f))
    return records


def summary(path: Path, manifest: dict[str, Any], reused: bool) -> dict[str, Any]:
    sources = manifest["sources"].values()
    appends = manifest.get("appends", [])
    return {
        "path": str(path),
        "fingerprint": manifest["fingerprint"],
        "data_version": versions.data_version(manifest),
        "entities": manifest["n_entities"],
        "events": sum(s["n_events"] for s in sources),
        "bytes": sum(f["bytes"] for f in manifest["files"].values()),
        "shards": len(manifest.get("shards", [])),
        "appends": len(appends),
        "active_segments": len(active_segments(manifest)),
        "min_date": min((s["min_date"] for s in sources if s["min_date"]), default=None),
        "max_date": max((s["max_date"] for s in sources if s["max_date"]), default=None),
        "reused": reused,
    }


def attribute_rels(cfg: PipelineConfig) -> dict[str, str]:
    return {s.name: P.parquet_rel([str(f) for f in extract_files(cfg, s)]) for s in cfg.sources("attribute")}


def source_meta(plan: P.SourcePlan, n: int, ts_range: tuple[int, int] | None, vocab: dict) -> dict[str, Any]:
    return {
        "n_events": n,
        "entity_column": plan.src.main_entity_column,
        "min_ts": ts_range[0] if ts_range else None,
        "max_ts": ts_range[1] if ts_range else None,
        "min_date": iso_day(ts_range[0]) if ts_range else None,
        "max_date": iso_day(ts_range[1]) if ts_range else None,
        "columns": {c.name: c.meta(vocab.get(c.name, (None, 0))[1]) for c in plan.columns},
    }


def write_vocab(out: Path, plan: P.SourcePlan, vocab: dict[str, tuple[pa.Table, int]]) -> None:
    for col in plan.columns:
        if col.name in vocab:
            (out / "vocab" / plan.src.name).mkdir(parents=True, exist_ok=True)
            pq.write_table(vocab[col.name][0], out / "vocab" / plan.src.name / f"{col.file}.parquet")


def load_entity_map(
    con: duckdb.DuckDBPyConnection, path: Path, manifest: dict[str, Any], id_type: str
) -> int:
    """ent_map(id, idx) of an existing cache (base and active segments); returns its number of entities."""
    ids = pa.concat_tables(
        [
            pq.read_table(d / "entities.parquet")
            for d in segment_dirs(path, manifest)
            if (d / "entities.parquet").exists()
        ]
    ).column("entity_id")
    con.register("__ids", pa.table({"id": ids, "idx": pa.array(range(len(ids)), pa.int64())}))
    con.execute(f"CREATE OR REPLACE TEMP TABLE ent_map AS SELECT CAST(id AS {id_type}) AS id, idx FROM __ids")
    con.unregister("__ids")
    return len(ids)


def add_new_entities(con: duckdb.DuckDBPyConnection, ids_sql: str, first: int) -> int:
    """Give the ids of `ids_sql` missing from ent_map the indices first, first + 1, ... (by id); returns the
    number of entities."""
    con.execute(
        f"INSERT INTO ent_map SELECT c.id, {first} + row_number() OVER (ORDER BY c.id) - 1 FROM ({ids_sql}) c "
        "WHERE NOT EXISTS (SELECT 1 FROM ent_map m WHERE m.id = c.id)"
    )
    return int(con.execute("SELECT count(*) FROM ent_map").fetchone()[0])


def previous_vocab(
    previous: tuple[Path, dict[str, Any]] | None, source: str, columns: list[P.Column]
) -> dict[str, pa.Table]:
    """Values of an existing cache's vocabularies of categorical columns that are still categorical."""
    if not previous or source not in previous[1]["sources"]:
        return {}
    old = previous[1]["sources"][source]["columns"]
    return {
        c.name: existing_vocab(*previous, source, old[c.name]["file"])
        for c in columns
        if c.kind == "categorical" and old.get(c.name, {}).get("type") == "categorical"
    }


def previous_attribute_vocab(previous: tuple[Path, dict[str, Any]] | None) -> dict[str, pa.Table]:
    """Values of an existing cache's vocabularies of categorical main-entity attributes."""
    columns = (previous[1].get("attributes") or {}).get("columns", {}) if previous else {}
    return {
        c: existing_vocab(*previous, "__attributes", m["file"])
        for c, m in columns.items()
        if m["type"] == "categorical"
    }


def write_source(
    con: duckdb.DuckDBPyConnection,
    plan: P.SourcePlan,
    id_type: str,
    old_vocab: dict[str, pa.Table],
    shards: list[tuple[int, int]],
    n_entities: int,
    out: Path,
    spill: Path,
    segment: bool,
) -> tuple[int, tuple[int, int] | None, dict[str, str], dict[str, tuple[pa.Table, int]]]:
    """Vocabularies (extending old_vocab) and the sorted CSR arrays of one event source into `out` (an append
    `segment` writes only the new vocabulary values). Returns (events, time range, sha256 of the arrays,
    {column: (vocabulary values written, vocabulary size)})."""
    vocab = codes.build_vocabularies(con, plan, old_vocab, only_new=segment)
    write_vocab(out, plan, vocab)
    sql, entity, cols = P.scan_sql(con, plan, id_type)
    events = out / "events" / plan.src.name
    n, ts_range, hashes = write_segment(
        con, sql, entity, cols, shards, n_entities, events, spill / plan.src.name
    )
    return n, ts_range, hashes, vocab


def write_attributes(
    cfg: PipelineConfig,
    con: duckdb.DuckDBPyConnection,
    out: Path,
    id_type: str,
    first: int,
    existing: dict[str, pa.Table],
    segment: bool,
) -> dict[str, Any]:
    """attributes/<column>.npy for entity indices >= first and their vocabularies (new values only for an
    append segment)."""
    srcs = cfg.sources("main_entity_attribute")
    if not srcs:
        return {}
    import numpy as np

    rel = P.parquet_rel([str(f) for f in extract_files(cfg, srcs[0])])
    meta, arrays, new_vocab = codes.attribute_arrays(cfg, con, rel, id_type, first, existing, segment)
    (out / "attributes").mkdir(parents=True, exist_ok=True)
    for name, values in arrays.items():
        np.save(out / "attributes" / f"{name}.npy", values)
    for col, table in new_vocab.items():
        (out / "vocab" / "__attributes").mkdir(parents=True, exist_ok=True)
        pq.write_table(table, out / "vocab" / "__attributes" / f"{P.file_name(col)}.parquet")
    return meta
