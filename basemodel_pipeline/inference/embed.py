"""Universal behavioural embeddings: the foundation trunk's output per entity as of a date, in float16.

Written as Parquet (entity_id, as_of, embedding: fixed-size list of float32 holding the float16 values) and in
the RecSys Challenge 2025 layout: client_ids.npy (int64 or str) + embeddings.npy (float16 [n, d]).
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.build import cache_dir
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.features.sketch import FeatureEncoder
from basemodel_pipeline.inference.predict import default_as_of, feature_chunks
from basemodel_pipeline.model.checkpoint import load_checkpoint
from basemodel_pipeline.progress import Progress
from basemodel_pipeline.training import loop
from basemodel_pipeline.training.calibrate import cpu_has_bf16


@torch.no_grad()
def entity_embeddings(
    cache: EventCache,
    checkpoint_dir,
    entity: np.ndarray,
    as_of: dt.date,
    chunk: int = 16384,
    progress: Progress | None = None,
) -> np.ndarray:
    """float16 [n, hidden] trunk embeddings of entity indices as of a date."""
    model, meta = load_checkpoint(checkpoint_dir)
    enc = FeatureEncoder.from_dict(meta["encoder"])
    loop.set_threads()
    amp = torch.bfloat16 if cpu_has_bf16() else None  # the export is float16 anyway
    outs = []
    for X in feature_chunks(cache, enc, entity, as_of, chunk):
        with loop.autocast(torch.device("cpu"), amp):
            outs.append(model.trunk(torch.from_numpy(X)).float().numpy().astype(np.float16))
        if progress is not None:
            progress.advance("embed", len(X))
    return np.concatenate(outs) if outs else np.zeros((0, meta["arch"]["hidden_dim"]), np.float16)


def export_embeddings(cfg: PipelineConfig, as_of: dt.date | None, progress: Progress) -> dict[str, Any]:
    started = time.perf_counter()
    cache = EventCache(cache_dir(cfg))
    foundation = ws.latest_foundation_dir(cfg)
    as_of = as_of or default_as_of(cache)
    entity = np.arange(cache.n_entities, dtype=np.int64)
    progress.start("embed", len(entity))
    emb = entity_embeddings(cache, foundation, entity, as_of, progress=progress)
    out_dir = ws.root(cfg) / "embeddings" / as_of.isoformat()
    ws.clean_stale_tmp(out_dir.parent)
    tmp = ws.staging_dir(out_dir)
    ids = cache.entity_ids
    np.save(tmp / "client_ids.npy", ids)
    np.save(tmp / "embeddings.npy", emb)
    flat = pa.array(emb.reshape(-1).astype(np.float32))
    table = pa.table(
        {
            "entity_id": ids,
            "as_of": pa.array([as_of] * len(ids), pa.date32()),
            "embedding": pa.FixedSizeListArray.from_arrays(flat, emb.shape[1]),
        }
    )
    pq.write_table(table, tmp / "embeddings.parquet", compression="zstd")
    ws.publish_dir(tmp, out_dir)
    wall = time.perf_counter() - started
    return {
        "path": str(out_dir),
        "entities": len(ids),
        "dim": int(emb.shape[1]),
        "as_of": as_of.isoformat(),
        "foundation_version": foundation.name,
        "wall_s": round(wall, 2),
        "inference_entities_per_s": round(len(ids) / wall, 1),
    }
