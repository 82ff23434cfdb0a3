"""Batch scoring of every entity as of a date, streamed in chunks, written atomically to Parquet.

binary:     entity_id, as_of, score
multilabel: entity_id, as_of, label, score   (one row per entity and class)
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.build import cache_dir
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import PipelineConfig, Scenario
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.features.sketch import FeatureEncoder
from basemodel_pipeline.model.checkpoint import load_checkpoint
from basemodel_pipeline.progress import Progress
from basemodel_pipeline.training import loop
from basemodel_pipeline.training.splits import epoch_seconds


def default_as_of(cache: EventCache) -> dt.date:
    """The day after the last event day: every event in the cache is history."""
    return cache.max_date + dt.timedelta(days=1)


def feature_chunks(
    cache: EventCache, enc: FeatureEncoder, entity: np.ndarray, as_of: dt.date, chunk: int = 16384
) -> Iterator[np.ndarray]:
    """History features of `entity` as of a date, `chunk` entities at a time (bounded memory)."""
    t = epoch_seconds(as_of)
    for a in range(0, len(entity), chunk):
        e = entity[a : a + chunk]
        yield enc.history(cache, e, np.full(len(e), t, np.int64))


def score_entities(
    cache: EventCache,
    checkpoint: Path,
    entity: np.ndarray,
    as_of: dt.date,
    chunk: int = 16384,
    progress: Progress | None = None,
) -> np.ndarray:
    """Probabilities [n] (binary) or [n, C] (multilabel) for entity indices as of a date."""
    model, meta = load_checkpoint(checkpoint)
    enc = FeatureEncoder.from_dict(meta["encoder"])
    loop.set_threads()
    outs = []
    for X in feature_chunks(cache, enc, entity, as_of, chunk):
        logits = loop.predict(model, X, torch.device("cpu"))
        outs.append(1.0 / (1.0 + np.exp(-logits)))
        if progress is not None:
            progress.advance("predict", len(X))
    probs = np.concatenate(outs) if outs else np.zeros((0, meta["arch"]["out_dim"]), np.float32)
    return probs[:, 0] if meta["target"]["task"] == "binary" else probs


def predict(
    cfg: PipelineConfig, scenario: Scenario, as_of: dt.date | None, progress: Progress
) -> dict[str, Any]:
    started = time.perf_counter()
    cache = EventCache(cache_dir(cfg))
    checkpoint = ws.latest_scenario_dir(cfg, scenario.name)
    _, meta = load_checkpoint(checkpoint)
    as_of = as_of or default_as_of(cache)
    if as_of <= cfg.data_params.data_start_date:
        raise UserError(f"--as-of {as_of} is before data_start_date ({cfg.data_params.data_start_date})")
    entity = np.arange(cache.n_entities, dtype=np.int64)
    progress.start("predict", len(entity))
    probs = score_entities(cache, checkpoint, entity, as_of, progress=progress)
    ids = cache.entity_ids
    if meta["target"]["task"] == "binary":
        table = pa.table(
            {"entity_id": ids, "as_of": pa.array([as_of] * len(ids), pa.date32()), "score": probs}
        )
    else:
        classes = meta["target"]["classes"]
        table = pa.table(
            {
                "entity_id": np.repeat(ids, len(classes)),
                "as_of": pa.array([as_of] * (len(ids) * len(classes)), pa.date32()),
                "label": np.tile(np.array(classes, dtype=object), len(ids)),
                "score": probs.reshape(-1),
            }
        )
    out_dir = ws.predictions_dir(cfg, scenario.name, as_of)
    ws.clean_stale_tmp(out_dir.parent)
    tmp = ws.staging_dir(out_dir)
    pq.write_table(table, tmp / "predictions.parquet", compression="zstd")
    ws.publish_dir(tmp, out_dir)
    wall = time.perf_counter() - started
    return {
        "path": str(out_dir / "predictions.parquet"),
        "rows": table.num_rows,
        "entities": len(ids),
        "as_of": as_of.isoformat(),
        "model_version": meta["version"],
        "wall_s": round(wall, 2),
        "inference_entities_per_s": round(len(ids) / wall, 1),
    }
