"""Free-space preflight before a cache build: what the build will write (the cache and its sort spill,
estimated from the extracts' Parquet footers) against the free space of the workspace volume and of the
spill directory's volume, with the recommended working volume (cache/sizing.py) in the message."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.sizing import HEADROOM, recommended_working_volume
from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.diskfaults import existing_ancestor
from basemodel_pipeline.errors import UserError

DiskUsage = Callable[[str], Any]  # shutil.disk_usage: an object with .free (bytes)
GIB = 2**30


def build_estimate(cfg: PipelineConfig) -> dict[str, int]:
    """Bytes a full build writes: the cache (8-byte time + 4 bytes per column per event, offsets per entity
    row bound) and the spill of the shard pass (8-byte entity index on top)."""
    cache = spill = 0
    for src in cfg.sources("event"):
        files = sorted(ws.extracts_dir(cfg, src.name).glob("*.parquet"))
        if not files:
            continue
        rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        columns = len(pq.read_schema(files[0]).names) - 2
        for join in src.joined_data_sources:
            attr = sorted(ws.extracts_dir(cfg, join.name).glob("*.parquet"))
            columns += len(pq.read_schema(attr[0]).names) - len(join.join_on) if attr else 0
        cache += rows * (8 + 4 * columns) + rows * 8  # offsets: at most one entity per event
        spill += rows * (16 + 4 * columns)
    return {"cache_bytes": cache, "spill_bytes": spill}


def preflight(cfg: PipelineConfig, cache_root: Path, disk_usage: DiskUsage) -> dict[str, Any]:
    """Raise UserError when the build cannot fit; returns the numbers it compared."""
    est = build_estimate(cfg)
    spill_dir = (
        existing_ancestor(Path(cfg.cache.spill_directory)) if cfg.cache.spill_directory else cache_root
    )
    cache_root = existing_ancestor(cache_root)
    same = os.stat(spill_dir).st_dev == os.stat(cache_root).st_dev
    needs = (
        {cache_root: est["cache_bytes"] + est["spill_bytes"]}
        if same
        else {cache_root: est["cache_bytes"], spill_dir: est["spill_bytes"]}
    )
    recommended = recommended_working_volume(cfg, cache_bytes=int(est["cache_bytes"]))
    report: dict[str, Any] = {**est, "recommended_working_volume_bytes": recommended}
    for path, need in needs.items():
        need = int(need * (1 + HEADROOM))
        free = int(disk_usage(str(path)).free)
        report[f"free_bytes:{path}"] = free
        if free < need:
            what = (
                "the cache and the sort spill"
                if same
                else ("the cache" if path == cache_root else "the sort spill (cache.spill_directory)")
            )
            raise UserError(
                f"not enough free space to build the event cache: {what} need about {need / GIB:.2f} GiB "
                f"({need:,} B, with {HEADROOM:.0%} headroom) on the volume of {path}, which has "
                f"{free / GIB:.2f} GiB ({free:,} B) free; the recommended working volume for this workspace is "
                f"{recommended / GIB:.2f} GiB (extracts, cache, checkpoints and outputs + {HEADROOM:.0%}). Free space there, move "
                "the workspace to a larger volume, or set cache.spill_directory to a volume with room"
            )
    return report
