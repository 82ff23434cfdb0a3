"""Universal behavioural embeddings: the foundation model's embedding per entity as of a date, in float16.

Streamed in chunks to an output destination (outputs/): Parquet by default (entity_id, as_of, embedding: a
fixed-size list of float32 holding the float16 values); file destinations also get the RecSys Challenge 2025
layout, client_ids.npy (int64 or str) + embeddings.npy (float16 [n, d]), written through a memory map.
As of the cache's latest date the features come from the per-entity state (inference/state.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from basemodel_pipeline import runtime
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.history import provenance as cache_provenance
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.diskfaults import require_space
from basemodel_pipeline.inference.options import EmbedOptions
from basemodel_pipeline.inference.precision import prepare_model
from basemodel_pipeline.inference.predict import CHUNK, entity_features
from basemodel_pipeline.inference.state import default_as_of
from basemodel_pipeline.model.checkpoint import load_checkpoint
from basemodel_pipeline.progress import NullProgress, Progress
from basemodel_pipeline.workspace import cache_dir


@torch.no_grad()
def embedding_chunks(
    model: torch.nn.Module, chunks: Iterator[np.ndarray], device: torch.device, amp: torch.dtype | None
) -> Iterator[np.ndarray]:
    """float16 [chunk, d] embeddings of each feature chunk."""
    for X in chunks:
        with runtime.autocast(device, amp):
            yield model.embed(torch.from_numpy(X).to(device)).float().cpu().numpy().astype(np.float16)


def export_embeddings(
    cfg: PipelineConfig, options: EmbedOptions, progress: Progress | None = None
) -> dict[str, Any]:
    """Embeddings of every entity as of a date (default: the day after the cache's last day) to a destination."""
    from basemodel_pipeline.outputs import open_writer

    progress = progress or NullProgress()
    started = time.perf_counter()
    cache = EventCache(cache_dir(cfg))
    foundation = ws.latest_foundation_dir(cfg)
    model, meta = load_checkpoint(foundation)
    dev = runtime.resolve_device(options.device)
    model, amp, chosen = prepare_model(model, options.precision, dev)
    as_of = options.as_of or default_as_of(cache)
    entity = np.arange(cache.n_entities, dtype=np.int64)
    chunks, info = entity_features(
        Path(cfg.workspace), cache, meta.encoder, entity, as_of, options.replay, progress
    )
    runtime.set_threads()
    ids = cache.entity_ids
    writer = open_writer(cfg, "embeddings", None, as_of, options.output)
    directory = getattr(writer, "directory", None)  # file destinations: add the RecSys-2025 arrays
    dim = None
    with writer:  # any error or stop from here on, the preflight's included, discards the writer's staging
        if directory is not None:  # file destinations: what retention must keep
            # float16 embeddings.npy + float32 Parquet values: known before the first byte
            require_space(directory, len(entity) * meta.arch.hidden_dim * 6, f"embeddings as of {as_of}")
            ws.write_provenance(
                directory, foundation_version=foundation.name, **cache_provenance(cache.manifest, as_of)
            )
        progress.start("embed", len(entity))
        npy = None
        for a, emb in zip(
            range(0, len(entity), CHUNK), embedding_chunks(model, chunks, dev, amp), strict=True
        ):
            dim = emb.shape[1]
            if directory is not None:
                if npy is None:
                    np.save(directory / "client_ids.npy", ids)
                    npy = np.lib.format.open_memmap(
                        directory / "embeddings.npy", "w+", np.float16, (len(entity), dim)
                    )
                npy[a : a + len(emb)] = emb
            flat = pa.array(emb.reshape(-1).astype(np.float32))
            writer.write(
                pa.table(
                    {
                        "entity_id": ids[a : a + len(emb)],
                        "as_of": pa.array([as_of] * len(emb), pa.date32()),
                        "embedding": pa.FixedSizeListArray.from_arrays(flat, dim),
                    }
                )
            )
            progress.advance("embed", len(emb))
        if npy is not None:
            npy.flush()
            del npy
        out = writer.close()
    wall = time.perf_counter() - started
    return {
        **info,
        **out,
        "path": str(Path(out["destination"]).parent) if directory is not None else out["destination"],
        "entities": len(entity),
        "dim": int(dim or meta.arch.hidden_dim),
        "as_of": as_of.isoformat(),
        "precision": chosen,
        "foundation_version": foundation.name,
        "wall_s": round(wall, 2),
        "inference_entities_per_s": round(len(entity) / wall, 1),
    }
