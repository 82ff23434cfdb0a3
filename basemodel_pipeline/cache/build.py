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

from basemodel_pipeline import files as fs
from basemodel_pipeline import manifests
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache import integrity, versions
from basemodel_pipeline.cache import plan as P
from basemodel_pipeline.cache.preflight import DiskUsage, preflight
from basemodel_pipeline.cache.view import active_segments, compact
from basemodel_pipeline.cache.writer import (
    add_new_entities,
    attribute_rels,
    connect,
    extract_files,
    file_records,
    load_entity_map,
    previous_attribute_vocab,
    previous_vocab,
    source_meta,
    summary,
    write_attributes,
    write_source,
)
from basemodel_pipeline.config import PipelineConfig, data_fingerprint
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.progress import Progress
from basemodel_pipeline.sources import damaged

FORMAT_VERSION = 3  # 3: column files of names with other characters carry a hash (no collisions)


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
    return manifests.sha256_file(path)[:32]


def input_signature(cfg: PipelineConfig) -> dict[str, list[list[Any]]]:
    """Name, size and content hash of every extract file (never the mtime: a touched file is unchanged)."""
    sig = {}
    for src in cfg.data_sources:
        d = ws.extracts_dir(cfg, src.name)
        sig[src.name] = [[f.name, f.stat().st_size, content_hash(f)] for f in sorted(d.glob("*.parquet"))]
    return sig


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

    final = ws.cache_dir(cfg)
    signature = input_signature(cfg)
    with cache_lock(final), damaged_extracts_named(cfg):
        manifest = versions.read_manifest(final)
        if manifest is None and final.resolve().is_dir():
            progress.log(
                f"warning: event cache {final.resolve()}: manifest.json missing or unreadable; rebuilding it"
            )
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
        fs.clean_stale_tmp(final.parent)
        preflight(cfg, final.parent, disk_usage)
        tmp = fs.staging_dir(final)
        try:
            previous = (
                (final, manifest) if manifest and manifest.get("format_version") == FORMAT_VERSION else None
            )
            manifest = _build_into(cfg, tmp, progress, previous)
            manifest["inputs"] = signature
            (tmp / "manifest.json").write_text(json.dumps(manifests.signed(manifest), indent=2))
            versions.publish(tmp, final)
        finally:
            fs.discard_dir(tmp)  # nothing once published; a failed build's staging otherwise
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
    fs.clean_stale_tmp(final.parent)
    tmp = fs.staging_dir(final)
    try:
        new, hashes = compact(final, manifest, tmp)
        new["files"] = file_records(tmp, hashes)
        (tmp / "manifest.json").write_text(json.dumps(manifests.signed(new), indent=2))
        versions.publish(tmp, final)
    finally:
        fs.discard_dir(tmp)  # nothing once published; a failed or stopped compaction's staging otherwise
    return new


def shard_count(cfg: PipelineConfig, events: int, entities: int) -> int:
    k = cfg.cache.shards or max(1, math.ceil(events / cfg.cache.shard_events))
    return max(1, min(k, entities))


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
