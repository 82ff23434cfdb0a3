"""Append new days to an event cache without rebuilding it.

When the extracts differ from the cache's inputs only by new day files of event sources, each later than
the source's last day in the cache (every existing file unchanged: same size and content hash), the new
days are written as one segment appends/<NNNN>/ in the base layout: events of the new days only, CSR
offsets over the grown entity index, the new entities (indices after the existing ones) and the new
vocabulary values (codes after the existing ones). Existing entities keep their index and values their
code. The work reads only the new day files plus the entity ids and vocabularies (no event of the history).

The new version is staged beside the cache (the current version's files hard-linked, the segment and the
manifest written) and published by one pointer switch (cache/versions.py): a killed append leaves the
previous cache as it was, and readers of the previous version keep it. Anything else (a changed, removed or late old day, a new attribute
table, events not after the cache's last time) returns None and the caller rebuilds.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
from pathlib import Path
from typing import Any

import duckdb

from basemodel_pipeline import files as fs
from basemodel_pipeline import manifests
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache import plan as P
from basemodel_pipeline.cache import versions
from basemodel_pipeline.cache import writer as W
from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.dates import iso_day
from basemodel_pipeline.progress import Progress

DAY_FILE = re.compile(r"^\d{4}-\d{2}-\d{2}\.parquet$")


def plan_append(
    cfg: PipelineConfig, manifest: dict[str, Any], signature: dict[str, list[list[Any]]]
) -> dict[str, list[str]] | None:
    """{event source: new day files} when only new, later days were added; None otherwise."""
    old = manifest.get("inputs") or {}
    if set(old) != set(signature):
        return None
    added: dict[str, list[str]] = {}
    for name, files in signature.items():
        before = {f[0]: f for f in old[name]}
        now = {f[0]: f for f in files}
        if any(now.get(k) != v for k, v in before.items()):
            return None  # an existing file changed or disappeared
        new = sorted(set(now) - set(before))
        if not new:
            continue
        src = cfg.source(name)
        last = max(before, default="")
        if src.type != "event" or any(not DAY_FILE.match(f) or f <= last for f in new):
            return None
        added[name] = new
    return added or None


def append_days(
    cfg: PipelineConfig,
    final: Path,
    manifest: dict[str, Any],
    new_days: dict[str, list[str]],
    signature: dict[str, list[list[Any]]],
    progress: Progress,
) -> dict[str, Any] | None:
    """Write the append segment into a new version (the current one's files hard-linked, the segment and the
    manifest new) and publish it; None when the new data cannot be appended (rebuild instead)."""
    fs.clean_stale_tmp(final.parent)  # a killed writer's staging
    tmp = fs.staging_dir(final)
    try:
        versions.link_files(final, manifest["files"], tmp)
        name = f"{len(manifest.get('appends', [])) + 1:04d}"
        out = tmp / "appends" / name
        out.mkdir(parents=True)
        spill = (
            Path(cfg.cache.spill_directory) / f".{final.name}.{name}.tmp"
            if cfg.cache.spill_directory
            else tmp / ".spill"
        )
        con = W.connect(cfg, spill / "duckdb")
        try:
            result = _write(cfg, con, final, manifest, new_days, out, name, spill, progress)
        except duckdb.Error as exc:  # e.g. a column whose type changed: rebuild, which reports real problems
            progress.log(f"cannot append ({exc}); rebuilding the cache")
            result = None
        finally:
            con.close()
            shutil.rmtree(spill, ignore_errors=True)
        if result is None:
            return None
        new_manifest, hashes = result
        new_manifest["inputs"] = signature
        new_manifest["files"] = {**manifest["files"], **W.file_records(tmp, hashes, under=out)}
        (tmp / "manifest.json").write_text(json.dumps(manifests.signed(new_manifest), indent=2))
        versions.publish(tmp, final)
        return {**W.summary(final, new_manifest, reused=False), "appended": new_manifest["appends"][-1]}
    finally:
        fs.discard_dir(tmp)  # nothing once published; a failed or stopped append's staging otherwise


def _write(
    cfg: PipelineConfig,
    con: duckdb.DuckDBPyConnection,
    final: Path,
    manifest: dict[str, Any],
    new_days: dict[str, list[str]],
    out: Path,
    segment: str,
    spill: Path,
    progress: Progress,
) -> tuple[dict[str, Any], dict[str, str]] | None:
    progress.start("cache append", len(new_days) + 1)
    id_type = "BIGINT" if manifest["entity_id_type"] == "int64" else "VARCHAR"
    n_old = W.load_entity_map(con, final, manifest, id_type)
    attr_rels = W.attribute_rels(cfg)
    plans = []
    for src_name, files in new_days.items():
        src = cfg.source(src_name)
        rel = P.parquet_rel([str(ws.extracts_dir(cfg, src.name) / f) for f in files], True)
        old_cols = manifest["sources"][src.name]["columns"]
        plan = P.plan_source(cfg, con, src, rel, attr_rels, old_cols)  # list columns keep their values
        if {c.name: c.kind for c in plan.columns} != {c: m["type"] for c, m in old_cols.items()}:
            progress.log(f"source '{src.name}': the new days have other columns; rebuilding the cache")
            return None
        plans.append(plan)
    n_total = W.add_new_entities(con, P.entity_counts_sql(plans, id_type), n_old)
    if n_total > n_old:
        con.execute(
            f"COPY (SELECT id AS entity_id FROM ent_map WHERE idx >= {n_old} ORDER BY idx) "
            f"TO {P.quote_literal(str(out / 'entities.parquet'))} (FORMAT parquet)"
        )
    new = json.loads(json.dumps(manifest))
    hashes: dict[str, str] = {}
    events = 0
    for plan in plans:
        meta = new["sources"][plan.src.name]
        P.key_counts(con, plan)
        old_vocab = W.previous_vocab((final, manifest), plan.src.name, plan.columns)
        n, ts_range, h, vocab = W.write_source(
            con, plan, id_type, old_vocab, [(0, n_total)], n_total, out, spill, segment=True
        )
        if ts_range and meta.get("max_ts") is not None and ts_range[0] <= meta["max_ts"]:
            progress.log(
                f"source '{plan.src.name}': new days start before the cache's last event; rebuilding"
            )
            return None
        hashes.update(h)
        events += n
        meta["n_events"] += n
        if ts_range:
            meta["max_ts"], meta["max_date"] = ts_range[1], iso_day(ts_range[1])
            if meta.get("min_ts") is None:
                meta["min_ts"], meta["min_date"] = ts_range[0], iso_day(ts_range[0])
        for c in plan.columns:
            if c.name in vocab:
                meta["columns"][c.name]["vocab_size"] = vocab[c.name][1]
        progress.advance("cache append", events=n)
    if manifest.get("attributes") and n_total > n_old:
        old_attr = W.previous_attribute_vocab((final, manifest))
        attrs = W.write_attributes(cfg, con, out, id_type, n_old, old_attr, segment=True)
        if set(attrs.get("columns", {})) != set(manifest["attributes"]["columns"]):
            return None
        new["attributes"] = {**manifest["attributes"], "columns": attrs["columns"]}
    progress.advance("cache append")
    now = dt.datetime.now(dt.UTC).isoformat()
    new["n_entities"] = int(n_total)
    if n_total > n_old:
        new["shards"] = [*manifest.get("shards", []), [n_old, int(n_total)]]
    new["created"] = now
    days = sorted({f.removesuffix(".parquet") for files in new_days.values() for f in files})
    new["appends"] = [
        *manifest.get("appends", []),
        {"segment": segment, "days": days, "events": events,
         "new_entities": int(n_total - n_old), "n_entities": int(n_total), "at": now},
    ]  # fmt: skip
    return new, hashes
