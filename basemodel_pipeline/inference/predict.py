"""Batch scoring of every entity as of a date, streamed in chunks, written atomically to Parquet.

binary:         entity_id, as_of, score                 (probability)
multiclass:     entity_id, as_of, label, score          (the full distribution: one row per class, sums to 1)
multilabel:     entity_id, as_of, label, score          (probabilities; all classes, or top_k / >= threshold)
regression:     entity_id, as_of, value                 (in the target's units: log1p targets are expm1-ed)
recommendation: entity_id, as_of, rank, item, score     (top_k items of the whole catalogue, best first)
"""

from __future__ import annotations

import datetime as dt
import json
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
from basemodel_pipeline.scenarios.heads import Head, own_history
from basemodel_pipeline.scenarios.targets import Examples, TargetSpec
from basemodel_pipeline.training import loop
from basemodel_pipeline.training.splits import epoch_seconds

MAX_LABELS_ALL = 100  # multilabel: write every class's score up to this many classes
DEFAULT_TOP_K = 20


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


def load_scenario(checkpoint: Path) -> tuple[Any, dict, Head]:
    """(model, meta, head) of a scenario checkpoint; the head decodes outputs with the stored target spec."""
    model, meta = load_checkpoint(checkpoint)
    spec = dict(meta["target"])
    extra = checkpoint / "target.json"
    if extra.exists():
        spec.update(json.loads(extra.read_text()))
    return model, meta, Head(TargetSpec.from_dict(spec))


def score_entities(
    cache: EventCache,
    checkpoint: Path,
    entity: np.ndarray,
    as_of: dt.date,
    chunk: int = 16384,
    progress: Progress | None = None,
    top_k: int = 10,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Outputs for entity indices as of a date: probabilities [n] (binary) / [n, C] (multiclass,
    multilabel), values [n] (regression, on the training scale), or (items [n, k], scores) (recommendation)."""
    model, meta, head = load_scenario(checkpoint)
    enc = FeatureEncoder.from_dict(meta["encoder"])
    loop.set_threads()
    outs: list = []
    t = epoch_seconds(as_of)
    for a, X in zip(
        range(0, len(entity), chunk), feature_chunks(cache, enc, entity, as_of, chunk), strict=True
    ):
        logits = loop.predict(model, X, torch.device("cpu"))
        if head.task == "recommendation":
            e = entity[a : a + chunk]
            own = own_history(cache, head.spec, Examples(e, np.full(len(e), t, np.int64), np.zeros(len(e))))
            outs.append(head.top_items(logits, top_k, history=own))
        else:
            outs.append(head.scores(logits))
        if progress is not None:
            progress.advance("predict", len(X))
    if head.task == "recommendation":
        if not outs:
            return np.zeros((0, top_k), np.int64), np.zeros((0, top_k), np.float32)
        return np.concatenate([o[0] for o in outs]), np.concatenate([o[1] for o in outs])
    if not outs:
        return np.zeros((0, meta["arch"]["out_dim"]), np.float32)
    return np.concatenate(outs)


def _long(
    ids: np.ndarray, as_of: dt.date, labels: np.ndarray, scores: np.ndarray, keep: np.ndarray
) -> pa.Table:
    """One row per (entity, label) where keep [n, C] is true."""
    rows, cols = np.nonzero(keep)
    return pa.table(
        {
            "entity_id": ids[rows],
            "as_of": pa.array([as_of] * len(rows), pa.date32()),
            "label": labels[cols],
            "score": scores[rows, cols],
        }
    )


def output_table(
    head: Head,
    ids: np.ndarray,
    as_of: dt.date,
    out: Any,
    top_k: int | None,
    threshold: float | None,
) -> pa.Table:
    """The predictions table of one task type (see the module docstring)."""
    task = head.task
    date = pa.array([as_of] * len(ids), pa.date32())
    if task == "binary":
        return pa.table({"entity_id": ids, "as_of": date, "score": out})
    if task == "regression":
        value = np.expm1(out) if head.spec.extra.get("log1p") else out
        return pa.table({"entity_id": ids, "as_of": date, "value": value})
    if task == "recommendation":
        items, scores = out
        names = np.array(head.spec.extra["items"], dtype=object)
        k = items.shape[1]
        return pa.table(
            {
                "entity_id": np.repeat(ids, k),
                "as_of": pa.array([as_of] * (len(ids) * k), pa.date32()),
                "rank": np.tile(np.arange(1, k + 1, dtype=np.int32), len(ids)),
                "item": names[items.ravel()],
                "score": scores.ravel(),
            }
        )
    classes = np.array(head.spec.classes, dtype=object)
    keep = np.ones(out.shape, dtype=bool)
    if task == "multilabel":
        if top_k is None and threshold is None and len(classes) > MAX_LABELS_ALL:
            top_k = DEFAULT_TOP_K
        if top_k is not None:
            kth = np.sort(out, axis=1)[:, -min(top_k, out.shape[1])][:, None]
            keep &= out >= kth
        if threshold is not None:
            keep &= out >= threshold
    return _long(ids, as_of, classes, out, keep)


def predict(
    cfg: PipelineConfig,
    scenario: Scenario,
    as_of: dt.date | None,
    progress: Progress,
    top_k: int | None = None,
    threshold: float | None = None,
) -> dict[str, Any]:
    """Score every entity as of a date (default: the day after the cache's last day).

    ``top_k``: recommendation list length (default: the scenario's k) and, for multilabel, keep the k best
    labels per entity; ``threshold``: multilabel, keep labels scoring at least this (both may be combined).
    Multilabel scenarios with more than MAX_LABELS_ALL classes keep the DEFAULT_TOP_K best by default."""
    started = time.perf_counter()
    cache = EventCache(cache_dir(cfg))
    checkpoint = ws.latest_scenario_dir(cfg, scenario.name)
    _, meta, head = load_scenario(checkpoint)
    as_of = as_of or default_as_of(cache)
    if as_of <= cfg.data_params.data_start_date:
        raise UserError(f"--as-of {as_of} is before data_start_date ({cfg.data_params.data_start_date})")
    entity = np.arange(cache.n_entities, dtype=np.int64)
    progress.start("predict", len(entity))
    model_top_k = top_k or meta["scenario"].get("k", DEFAULT_TOP_K)
    out = score_entities(cache, checkpoint, entity, as_of, progress=progress, top_k=model_top_k)
    table = output_table(head, cache.entity_ids, as_of, out, top_k, threshold)
    out_dir = ws.predictions_dir(cfg, scenario.name, as_of)
    ws.clean_stale_tmp(out_dir.parent)
    tmp = ws.staging_dir(out_dir)
    pq.write_table(table, tmp / "predictions.parquet", compression="zstd")
    ws.publish_dir(tmp, out_dir)
    wall = time.perf_counter() - started
    ids = cache.entity_ids
    return {
        "path": str(out_dir / "predictions.parquet"),
        "rows": table.num_rows,
        "entities": cache.n_entities,
        "as_of": as_of.isoformat(),
        "model_version": meta["version"],
        "wall_s": round(wall, 2),
        "inference_entities_per_s": round(len(ids) / wall, 1),
    }
