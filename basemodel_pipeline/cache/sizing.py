"""Cache sizing: the bytes the source data, the extracts, the cache and the checkpoints take, and the
recommended working volume of a workspace (what it holds + HEADROOM). `basemodel cache-size` reports it;
the free-space preflight (cache/preflight.py) names it in its message."""

from __future__ import annotations

import glob
import json
import shutil
from pathlib import Path
from typing import Any

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.config.models import PipelineConfig
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.sources.parquet import is_local, parquet_glob

HEADROOM = 0.2


def _bytes_under(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def source_bytes(cfg: PipelineConfig) -> int:
    """Bytes of the source data: local Parquet files as they are, other sources by their extracts."""
    total = 0
    for src in cfg.data_sources:
        if is_local(src):
            path = src.data_location.path
            total += sum(Path(p).stat().st_size for p in glob.glob(parquet_glob(path), recursive=True))
        else:
            total += _bytes_under(ws.extracts_dir(cfg, src.name))
    return total


def recommended_working_volume(
    cfg: PipelineConfig,
    src_bytes: int | None = None,
    checkpoint_bytes: int | None = None,
    cache_bytes: int | None = None,
) -> int:
    """What the workspace holds, + 20% headroom: the extracts (about the source's size), the cache (its size
    when built, else about the source's size: docs/design.md, "Artifact sizes"), the checkpoints and everything else under the
    workspace (predictions, state, reports)."""
    src_bytes = source_bytes(cfg) if src_bytes is None else src_bytes
    if checkpoint_bytes is None:
        checkpoint_bytes = _bytes_under(ws.root(cfg) / "checkpoints")
    extract_bytes = sum(_bytes_under(ws.extracts_dir(cfg, s.name)) for s in cfg.data_sources)
    cache_bytes = src_bytes if cache_bytes is None else cache_bytes
    other = sum(_bytes_under(ws.root(cfg) / d) for d in ("predictions", "state", "embeddings", "reports"))
    held = max(extract_bytes, src_bytes) + cache_bytes + checkpoint_bytes + other
    return int(held * (1 + HEADROOM))


def cache_sizing(cfg: PipelineConfig) -> dict[str, Any]:
    """Cache bytes against source bytes, entities, events, date range, and the recommended working volume
    (recommended_working_volume) next to the free space of the workspace's volume."""
    manifest_file = ws.cache_dir(cfg) / "manifest.json"
    if not manifest_file.exists():
        raise UserError(
            f"no cache for this config at {manifest_file.parent}; run `basemodel cache CONFIG` first"
        )
    manifest = json.loads(manifest_file.read_text())
    sources = manifest.get("sources", {})
    cache_bytes = sum(f["bytes"] for f in manifest.get("files", {}).values())
    src_bytes = source_bytes(cfg)
    checkpoint_bytes = _bytes_under(ws.root(cfg) / "checkpoints")
    recommended = recommended_working_volume(cfg, src_bytes, checkpoint_bytes, cache_bytes)
    return {
        "cache_path": str(manifest_file.parent),
        "cache_bytes": cache_bytes,
        "source_bytes": src_bytes,
        "cache_to_source": round(cache_bytes / src_bytes, 3) if src_bytes else None,
        "extract_bytes": sum(_bytes_under(ws.extracts_dir(cfg, s.name)) for s in cfg.data_sources),
        "checkpoint_bytes": checkpoint_bytes,
        "entities": manifest.get("n_entities"),
        "events": sum(s.get("n_events", 0) for s in sources.values()),
        "first_day": min((s["min_date"] for s in sources.values() if s.get("min_date")), default=None),
        "last_day": max((s["max_date"] for s in sources.values() if s.get("max_date")), default=None),
        "shards": len(manifest.get("shards", [])),
        "appends": len(manifest.get("appends", [])),
        "last_build": manifest.get("built"),
        "recommended_working_volume_bytes": recommended,
        "workspace_free_bytes": shutil.disk_usage(ws.root(cfg)).free,
    }
