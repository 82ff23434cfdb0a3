"""Build, reuse or append to the event cache from the extracts.

Layout of one version of <workspace>/cache/<fingerprint>/ (a symlink to the current version, see
cache/versions.py; all arrays are .npy, read back through memory maps):
    manifest.json                  sizes, column types, inputs, shards, appends, sha256 of every file
    entities.parquet               entity_id in entity-index order (entity-hash shards, each sorted by id)
    events/<source>/offsets.npy    int64 [n_entities + 1]: events of entity i are rows offsets[i]:offsets[i+1]
    events/<source>/ts.npy         int64 [n_events] epoch seconds, sorted within each entity
    events/<source>/<column>.npy   int32 codes (categorical, 0 = missing) or float32 (numeric)
    vocab/<source>/<column>.parquet  value, count: code k is row k-1 (most frequent first)
    attributes/<column>.npy        main-entity attributes per entity index
    appends/<NNNN>/                one segment per append: the same layout for the new days only (offsets
                                   over the grown entity index, new entities and new vocabulary values only)
See docs/cache.md; EventCache (cache/store.py) presents the base and its appends as one CSR view.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache import integrity, versions
from basemodel_pipeline.cache import plan as P
from basemodel_pipeline.cache.preflight import DiskUsage, preflight
from basemodel_pipeline.cache.segment import write_segment
from basemodel_pipeline.cache.view import active_segments, compact, existing_vocab, segment_dirs
from basemodel_pipeline.config import PipelineConfig, data_fingerprint
from basemodel_pipeline.config.models import DataSource
from basemodel_pipeline.dates import iso_day
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.progress import Progress
from basemodel_pipeline.sources import damaged

FORMAT_VERSION = 3  # 3: column files of names with other characters carry a hash (no collisions)
# re-exported for sources/suggest.py
infer_column_type, FLOAT_PREFIXES, NUMERIC_PREFIXES = (
    P.infer_column_type,
    P.FLOAT_PREFIXES,
    P.NUMERIC_PREFIXES,
)


def extract_files(cfg: PipelineConfig, src: DataSource) -> list[Path]:
    d = ws.extracts_dir(cfg, src.name)
    files = sorted(d.glob("*.parquet"))
    if not files:
        raise DataError(f"no extract found for source '{src.name}' in {d}; run the extract stage first")
    return files


def extract_glob(cfg: PipelineConfig, src: DataSource) -> str:
    extract_files(cfg, src)
    return str(ws.extracts_dir(cfg, src.name) / "*.parquet")


def content_hash(path: Path) -> str:
    """sha256 of a Parquet file's footer (schema, row groups, sizes, statistics): changes when the content
    does, costs O(1) per file whatever its size. Other files are hashed whole."""
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        size = fh.tell()
        if size >= 12:
            fh.seek(size - 8)
            tail = fh.read(8)
            footer = int.from_bytes(tail[:4], "little")
            if tail[4:] == b"PAR1" and footer + 8 <= size:
                fh.seek(size - 8 - footer)
                return hashlib.sha256(fh.read(footer + 8)).hexdigest()[:32]
    return ws.sha256_file(path)[:32]


def input_signature(cfg: PipelineConfig) -> dict[str, list[list[Any]]]:
    """Name, size and content hash of every extract file (never the mtime: a touched file is unchanged)."""
    sig = {}
    for src in cfg.data_sources:
        d = ws.extracts_dir(cfg, src.name)
        sig[src.name] = [[f.name, f.stat().st_size, content_hash(f)] for f in sorted(d.glob("*.parquet"))]
    return sig


def cache_dir(cfg: PipelineConfig) -> Path:
    return ws.cache_root(cfg) / data_fingerprint(cfg)


def read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def cache_lock(final: Path) -> Iterator[None]:
    """One writer per cache directory (across processes); released when the process dies. On the way out
    the versions no reader holds any more are deleted (cache/versions.py)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(versions.writer_lock_path(final), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            versions.migrate(final)
            yield
        finally:
            versions.sweep(final)
            fcntl.flock(fh, fcntl.LOCK_UN)


def build_cache(
    cfg: PipelineConfig, progress: Progress, disk_usage: DiskUsage = shutil.disk_usage
) -> dict[str, Any]:
    """Reuse the cache when the extracts are unchanged, append when only new days were added after its last
    day, else build it afresh (after a free-space preflight). Every outcome is published atomically as a
    new version; readers of older versions keep theirs (cache/versions.py)."""
    from basemodel_pipeline.cache.append import append_days, plan_append

    final = cache_dir(cfg)
    signature = input_signature(cfg)
    with cache_lock(final), damaged_extracts_named(cfg):
        manifest = read_manifest(final)
        if manifest and manifest.get("format_version") == FORMAT_VERSION:
            manifest = _unless_changed(final, manifest, progress)
        if manifest and manifest.get("format_version") == FORMAT_VERSION:
            if manifest.get("inputs") == signature:
                return summary(final, manifest, reused=True)
            new_days = plan_append(cfg, manifest, signature)
            if new_days and cfg.cache.max_appends:
                if len(active_segments(manifest)) >= cfg.cache.max_appends:
                    manifest = compact_cache(final, manifest, progress)
                appended = append_days(cfg, final, manifest, new_days, signature, progress)
                if appended is not None:
                    return appended
        ws.clean_stale_tmp(final.parent)
        preflight(cfg, final.parent, disk_usage)
        tmp = ws.staging_dir(final)
        try:
            previous = (
                (final, manifest) if manifest and manifest.get("format_version") == FORMAT_VERSION else None
            )
            manifest = _build_into(cfg, tmp, progress, previous)
            manifest["inputs"] = signature
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
            versions.publish(tmp, final)
        finally:
            ws.discard_dir(tmp)  # nothing once published; a failed build's staging otherwise
    return summary(final, manifest, reused=False)


def _unless_changed(final: Path, manifest: dict[str, Any], progress: Progress) -> dict[str, Any] | None:
    """The manifest of the current version when its files are as written (integrity.check_for_reuse);
    when one was changed, a warning and None (rebuild afresh) or, if only arrays changed, a manifest that
    keeps entity indices and codes but matches no input (rebuild from it)."""
    problems = integrity.check_for_reuse(final.resolve(), manifest)
    if not problems:
        return manifest
    progress.log(f"warning: {integrity.describe(final, problems)}; rebuilding it")
    return None if integrity.damaged_parts(problems) else {**manifest, "inputs": None}


def _build_into(
    cfg: PipelineConfig, tmp: Path, progress: Progress, previous: tuple[Path, dict[str, Any]] | None
) -> dict[str, Any]:
    """A full build into the staging directory `tmp`; returns its manifest (files recorded)."""
    spill = Path(cfg.cache.spill_directory) / tmp.name if cfg.cache.spill_directory else tmp / ".spill"
    con = connect(cfg, spill / "duckdb")
    try:
        manifest, hashes = _build(cfg, con, tmp, spill, progress, previous)
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)
    manifest["files"] = file_records(tmp, hashes)
    return manifest


@contextlib.contextmanager
def damaged_extracts_named(cfg: PipelineConfig) -> Iterator[None]:
    """A read of the extracts that fails on a damaged file (truncated, corrupt pages) becomes one line
    naming the file and the extract to redo, instead of DuckDB's or pyarrow's message."""
    try:
        yield
    except (duckdb.Error, pa.ArrowException, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            raise  # the system's (disk full, permissions), not a file's content
        files = {s.name: sorted(ws.extracts_dir(cfg, s.name).glob("*.parquet")) for s in cfg.data_sources}
        damaged.check_extracts(files)
        raise


def compact_cache(final: Path, manifest: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Fold the appended segments into a new base (same entity indices and codes), published as a new
    version."""
    progress.log(f"compacting {len(active_segments(manifest))} appended segments of {final}")
    ws.clean_stale_tmp(final.parent)
    tmp = ws.staging_dir(final)
    new, hashes = compact(final, manifest, tmp)
    new["files"] = file_records(tmp, hashes)
    (tmp / "manifest.json").write_text(json.dumps(new, indent=2))
    versions.publish(tmp, final)
    return new


def file_records(root: Path, known: dict[str, str], under: Path | None = None) -> dict[str, Any]:
    """{relative path: {bytes, sha256, mtime_ns}} of every file under `under` (default: root); `known` hashes are
    reused (computed while writing), the rest are read."""
    records = {}
    for f in sorted((under or root).rglob("*")):
        if f.is_file() and f.name != "manifest.json":
            rel = str(f.relative_to(root))
            records[rel] = integrity.record(f, known.get(str(f)) or ws.sha256_file(f))
    return records


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


def data_version(manifest: dict[str, Any]) -> str:
    """Changes exactly when the extracts' content does (Dagster's data version of event_cache)."""
    content = json.dumps([manifest.get("format_version"), manifest.get("inputs")], sort_keys=True)
    return f"{manifest['fingerprint']}-{hashlib.sha256(content.encode()).hexdigest()[:12]}"


def summary(path: Path, manifest: dict[str, Any], reused: bool) -> dict[str, Any]:
    sources = manifest["sources"].values()
    appends = manifest.get("appends", [])
    return {
        "path": str(path),
        "fingerprint": manifest["fingerprint"],
        "data_version": data_version(manifest),
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


def shard_count(cfg: PipelineConfig, events: int, entities: int) -> int:
    k = cfg.cache.shards or max(1, math.ceil(events / cfg.cache.shard_events))
    return max(1, min(k, entities))


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


def _hash_shards(con: duckdb.DuckDBPyConnection, k: int) -> list[tuple[int, int]]:
    """ent_map numbering entities by shard (hash of the id) then by id; returns the shards' index ranges."""
    shard = f"(hash(id) % {k})"
    con.execute(
        f"CREATE TEMP TABLE ent_map AS SELECT id, (row_number() OVER (ORDER BY {shard}, id) - 1)::BIGINT AS idx, "
        f"{shard}::INTEGER AS shard FROM ent_counts"
    )
    sizes = dict(con.execute("SELECT shard, count(*) FROM ent_map GROUP BY 1").fetchall())
    shards, start = [], 0
    for s in range(k):
        if sizes.get(s):
            shards.append((start, start + sizes[s]))
            start += sizes[s]
    return shards


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


def _build(
    cfg: PipelineConfig,
    con: duckdb.DuckDBPyConnection,
    out: Path,
    spill: Path,
    progress: Progress,
    previous: tuple[Path, dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Build every array into `out`. With `previous` (the cache being replaced), its entities keep their
    indices and its values their codes; otherwise entities are numbered by hash shard."""
    events = cfg.sources("event")
    progress.start("cache", len(events) + 2)
    attr_rels = attribute_rels(cfg)
    plans = [
        P.plan_source(cfg, con, s, P.parquet_rel([str(f) for f in extract_files(cfg, s)], True), attr_rels)
        for s in events
    ]
    id_type = P.entity_id_type(plans)
    con.execute(f"CREATE TEMP TABLE ent_counts AS {P.entity_counts_sql(plans, id_type)}")
    n_entities, total = con.execute("SELECT count(*), coalesce(sum(n), 0) FROM ent_counts").fetchone()
    if not n_entities:
        raise DataError("the event extracts hold no event with an entity and a time; check the extracts")
    id_kind = "int64" if id_type == "BIGINT" else "string"
    if previous and previous[1].get("entity_id_type") != id_kind:
        previous = None
    if previous:  # entities keep their index, new ones come after (one more shard range)
        n_old = load_entity_map(con, *previous, id_type)
        n_entities = add_new_entities(con, "SELECT id FROM ent_counts", n_old)
        shards = [(int(a), int(b)) for a, b in previous[1]["shards"]]
        shards += [(n_old, n_entities)] if n_entities > n_old else []
    else:
        shards = _hash_shards(con, shard_count(cfg, int(total), int(n_entities)))
    con.execute(
        f"COPY (SELECT id AS entity_id FROM ent_map ORDER BY idx) TO {P.quote_literal(str(out / 'entities.parquet'))} "
        "(FORMAT parquet)"
    )
    progress.advance("cache")
    now = dt.datetime.now(dt.UTC).isoformat()
    manifest: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "fingerprint": data_fingerprint(cfg),
        "created": now,  # this version of the content (a build or an append)
        "built": now,  # the last full build
        "n_entities": int(n_entities),
        "entity_id_type": id_kind,
        "shards": [list(s) for s in shards],
        "appends": [],
        "sources": {},
    }
    hashes: dict[str, str] = {}
    for plan in plans:
        P.key_counts(con, plan)
        P.check_joins(con, plan)
        old_vocab = previous_vocab(previous, plan.src.name, plan.columns)
        n, ts_range, h, vocab = write_source(
            con, plan, id_type, old_vocab, shards, int(n_entities), out, spill, segment=False
        )
        hashes.update(h)
        manifest["sources"][plan.src.name] = source_meta(plan, n, ts_range, vocab)
        progress.advance("cache", events=n)
    old_attr_vocab = previous_attribute_vocab(previous)
    manifest["attributes"] = write_attributes(cfg, con, out, id_type, 0, old_attr_vocab, segment=False)
    progress.advance("cache")
    return manifest, hashes


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
    vocab = P.build_vocabularies(con, plan, old_vocab, only_new=segment)
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
    meta, arrays, new_vocab = P.attribute_arrays(cfg, con, rel, id_type, first, existing, segment)
    (out / "attributes").mkdir(parents=True, exist_ok=True)
    for name, values in arrays.items():
        np.save(out / "attributes" / f"{name}.npy", values)
    for col, table in new_vocab.items():
        (out / "vocab" / "__attributes").mkdir(parents=True, exist_ok=True)
        pq.write_table(table, out / "vocab" / "__attributes" / f"{P.file_name(col)}.parquet")
    return meta
