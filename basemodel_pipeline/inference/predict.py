"""Batch scoring as of a date, for every entity or a subset, streamed in chunks to a writer (outputs/).

binary:         entity_id, as_of, score                 (probability)
multiclass:     entity_id, as_of, label, score          (the full distribution: one row per class, sums to 1)
multilabel:     entity_id, as_of, label, score          (probabilities; all classes, or top_k / >= threshold)
regression:     entity_id, as_of, value                 (in the target's units: log1p targets are expm1-ed)
recommendation: entity_id, as_of, rank, item, score     (top_k items of the whole catalogue, best first)

As of the cache's latest date (the default) the features come from the per-entity state (inference/state.py),
so scoring is a forward pass; as of an earlier date they are replayed from the cache's history.

What to score and how is a ScoringOptions (inference/options.py). A subset (`entities`, a file of ids)
never replaces the full table: it is written beside it as its own, named output,
predictions/<scenario>/<as_of>/subsets/<name>/ for file destinations (warehouse tables and shards refuse
subsets, because their writers replace the whole (scenario, as_of) slice).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from pydantic import ValidationError

from basemodel_pipeline import files as fs
from basemodel_pipeline import runtime
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.history import provenance as cache_provenance
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.candidates.base import Candidate, Context
from basemodel_pipeline.candidates.inputs import Rows, RowView
from basemodel_pipeline.candidates.loading import load_candidate
from basemodel_pipeline.config import PipelineConfig, Scenario
from basemodel_pipeline.dates import epoch_seconds
from basemodel_pipeline.errors import ArgumentError, UserError
from basemodel_pipeline.evaluation import drift
from basemodel_pipeline.evaluation.drift import RowSample
from basemodel_pipeline.features.sketch import FeatureEncoder
from basemodel_pipeline.inference.options import ScoringOptions
from basemodel_pipeline.inference.precision import prepare_model
from basemodel_pipeline.inference.shards import PartWriter, parts_dir, shard_range
from basemodel_pipeline.inference.state import (
    EntityState,
    default_as_of,
    ensure_state,
    float32_rows,
    state_serves,
)
from basemodel_pipeline.model.checkpoint import META, CheckpointMeta, damaged, first_error, load_checkpoint
from basemodel_pipeline.progress import NullProgress, Progress
from basemodel_pipeline.tasks import Task, spec_from_dict, task_for
from basemodel_pipeline.tasks.multilabel import DEFAULT_TOP_K
from basemodel_pipeline.workspace import cache_dir

CHUNK = 16384  # entities per step
UNKNOWN_EXAMPLES = 10


def feature_chunks(
    cache: EventCache, enc: FeatureEncoder, entity: np.ndarray, as_of: dt.date, chunk: int = CHUNK
) -> Iterator[np.ndarray]:
    """History features of `entity` as of a date, replayed from the cache `chunk` entities at a time, rounded
    to float16 as the per-entity state stores them: a score depends on the date, not on the path."""
    t = epoch_seconds(as_of)
    for a in range(0, len(entity), chunk):
        e = entity[a : a + chunk]
        yield enc.history(cache, e, np.full(len(e), t, np.int64)).astype(np.float16).astype(np.float32)


def state_chunks(state: EntityState, entity: np.ndarray, chunk: int = CHUNK) -> Iterator[np.ndarray]:
    """The same features read from a state (float16 rows), `chunk` entities at a time."""
    for a in range(0, len(entity), chunk):
        e = entity[a : a + chunk]
        contiguous = len(e) and e[-1] - e[0] == len(e) - 1 and bool(np.all(np.diff(e) == 1))
        rows = state.features[e[0] : e[-1] + 1] if contiguous else state.features[e]
        yield float32_rows(rows).numpy()


def entity_features(
    workspace: Path,
    cache: EventCache,
    encoder: dict,
    entity: np.ndarray,
    as_of: dt.date,
    replay: bool,
    progress: Progress,
) -> tuple[Iterator[np.ndarray], dict[str, Any]]:
    """Feature chunks of `entity` as of a date and what it took: from the per-entity state as of the latest
    date (built or advanced first), replayed from the cache before it or when `replay`."""
    if not state_serves(cache, as_of, replay):
        chunks = feature_chunks(cache, FeatureEncoder.from_dict(encoder), entity, as_of)
        return chunks, {"features": "replay"}
    started = time.perf_counter()
    state, info = ensure_state(workspace, cache, encoder, as_of, progress)
    state_s = time.perf_counter() - started
    info = {
        **info,
        "features": "state",
        "state_s": round(state_s, 2),
        "state_events_read_per_s": round(info.get("new_events", 0) / max(state_s, 1e-9), 1),
    }
    return state_chunks(state, entity), info


def load_scenario(checkpoint: Path) -> tuple[Any, CheckpointMeta, Task]:
    """(model, meta, task) of a scenario checkpoint; the task decodes outputs with the stored target spec."""
    model, meta = load_checkpoint(checkpoint)
    if meta.target is None or meta.scenario is None:
        raise damaged(checkpoint, f"{META}: not a scenario checkpoint (no 'target' or 'scenario')")
    spec = dict(meta.target)
    extra = checkpoint / "target.json"
    if extra.exists():
        spec.update(json.loads(extra.read_text()))
    try:
        target = spec_from_dict(spec)
    except (ValidationError, ValueError) as err:  # a field the task's record lacks, or an unknown task
        reason = first_error(err) if isinstance(err, ValidationError) else str(err)
        raise damaged(checkpoint, f"{META}: unreadable target ({reason})") from None
    return model, meta, task_for(target)


def load_published(checkpoint: Path, meta: CheckpointMeta, task: Task) -> Candidate:
    """The candidate the scenario published (candidates/selection.py)."""
    if meta.published is None:
        raise damaged(checkpoint, f"{META}: names no published candidate (an older format)")
    ctx = Context(Scenario.model_validate(meta.scenario), task.spec, task)
    published = meta.published
    folder = checkpoint / "candidates"
    files = {f.name: f.read_bytes() for f in folder.iterdir()} if folder.is_dir() else {}
    return load_candidate(published, files, ctx)


@dataclass
class Scorer:
    """A scenario model ready to score feature chunks at a precision on a device."""

    model: torch.nn.Module
    meta: CheckpointMeta
    task: Task  # the scenario's task: decoding and the predictions table
    device: torch.device
    amp: torch.dtype | None
    precision: str
    published: Candidate

    @classmethod
    def load(cls, checkpoint: Path, precision: str = "auto", device: str = "cpu") -> Scorer:
        model, meta, task = load_scenario(checkpoint)
        dev = runtime.resolve_device(device)
        model, amp, chosen = prepare_model(model.eval(), precision, dev)
        return cls(model, meta, task, dev, amp, chosen, load_published(checkpoint, meta, task))

    def outputs(
        self, cache: EventCache, X: np.ndarray, entity: np.ndarray, as_of: dt.date, top_k: int
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """The published candidate's probabilities / values [n] or [n, C], or (items [n, k], scores) for
        recommendation."""
        enc = FeatureEncoder.from_dict(self.meta.encoder)
        t = np.full(len(entity), epoch_seconds(as_of), np.int64)
        rows = Rows(
            cache, enc, np.asarray(entity, np.int64), t, RowView(X), None, self.model, self.device, self.amp
        )
        if self.task.ranked:
            return self.published.rank(rows, top_k)
        return self.published.predict(rows)


def check_checkpoint_matches(
    cache: EventCache, scenario: Scenario, meta: CheckpointMeta, checkpoint: Path
) -> None:
    """The newest checkpoint of a scenario must come from this scenario definition and this data: another
    config sharing the workspace (or an edit not yet fine-tuned) would otherwise have its model scored and
    its predictions overwritten under this config's name."""
    trained = meta.scenario
    if trained is not None and trained != scenario.model_dump(mode="json"):
        changed = sorted(
            k
            for k in {*trained, *scenario.model_dump(mode="json")}
            if trained.get(k) != scenario.model_dump(mode="json").get(k)
        )
        raise UserError(
            f"scenario '{scenario.name}': its newest checkpoint ({checkpoint}) was trained from a different "
            f"definition (differs in: {', '.join(changed)}); fine-tune it with this config first, or give this "
            "config its own workspace if another config shares this one"
        )
    fingerprint = meta.cache_fingerprint
    if fingerprint is not None and fingerprint != cache.manifest["fingerprint"]:
        raise UserError(
            f"scenario '{scenario.name}': its newest checkpoint ({checkpoint}) was trained on other data (cache "
            f"{fingerprint}, this config's is {cache.manifest['fingerprint']}); fine-tune it with this config "
            "first, or give this config its own workspace if another config shares this one"
        )


def resolve_entities(cache: EventCache, ids: list[str] | None) -> tuple[np.ndarray, list[str]]:
    """Entity indices of the requested ids in request order (all entities when None) and the unknown ids.

    Raises when no requested id is in the cache: scoring nothing is never the intended result."""
    if ids is None:
        return np.arange(cache.n_entities, dtype=np.int64), []
    known_ids = cache.entity_ids
    if known_ids.dtype.kind in "iu":
        parsed = np.array([_as_int(i) for i in ids], dtype=object)
        numeric = np.array([p is not None for p in parsed], dtype=bool)
        idx = np.full(len(ids), -1, np.int64)
        if numeric.any():
            idx[numeric] = cache.entity_index(parsed[numeric].astype(np.int64))
    else:
        idx = cache.entity_index(np.array([str(i) for i in ids], dtype=object))
    unknown = [str(ids[i]) for i in np.nonzero(idx < 0)[0]]
    idx = idx[idx >= 0]
    _, first = np.unique(idx, return_index=True)  # each entity once, in request order
    idx = idx[np.sort(first)]
    if len(idx) == 0:
        shown = ", ".join(unknown[:UNKNOWN_EXAMPLES])
        raise ArgumentError(
            "entities",
            None,
            f"none of the {len(ids)} requested entity ids is in the cache (e.g. {shown}); check the id "
            "column and format, or leave the ids out to score every entity",
        )
    return idx, unknown


def _as_int(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def read_entity_ids(path: Path) -> list[str]:
    """Entity ids from a text file (one per line) or a CSV/Parquet file with an entity_id column."""
    if not path.exists():
        raise ArgumentError("entities", path, "does not exist")
    if path.suffix in (".parquet", ".csv"):
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path) if path.suffix == ".parquet" else pacsv.read_csv(path)
        except (pa.ArrowException, OSError) as exc:
            kind = "Parquet" if path.suffix == ".parquet" else "CSV"
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ArgumentError(
                "entities",
                path,
                f"is not readable {kind} ({reason}); write the ids as {kind} with an entity_id column, or as "
                "text with one id per line",
            ) from None
        if "entity_id" not in table.column_names:
            columns = ", ".join(table.column_names)
            raise ArgumentError("entities", path, f"has no entity_id column (columns: {columns})")
        return [str(v) for v in table.column("entity_id").to_pylist() if v is not None]
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def predict(
    cfg: PipelineConfig, scenario: Scenario, options: ScoringOptions, progress: Progress | None = None
) -> dict[str, Any]:
    """Score entities (all, or the ids in the file `options.entities`) as of a date (default: the day after the
    cache's last day) and stream the table to an output destination (default: Parquet in the workspace).

    ``top_k``: recommendation list length (default: the scenario's k) and, for multilabel, keep the k best
    labels per entity; ``threshold``: multilabel, keep labels scoring at least this (both may be combined).
    Multilabel scenarios with more than MAX_LABELS_ALL classes (tasks/multilabel.py) keep the DEFAULT_TOP_K best
    by default.
    ``shard=(i, k)`` scores the i-th of k contiguous slices of the entities (see inference/shards.py).
    As of the latest date the per-entity state is used unless ``replay``.
    With ``entities`` the table is the subset named ``options.subset_name``, written beside the full table
    (predictions/<scenario>/<as_of>/subsets/<name>/), which it leaves untouched. Workers and merges are
    pipeline.run_predict's: here one process scores everything or its one shard."""
    from basemodel_pipeline.outputs import open_writer

    progress = progress or NullProgress()
    top_k, threshold, shard, subset = options.top_k, options.threshold, options.shard, options.subset_name
    if subset is not None:
        check_subset_destination(cfg, options.output)
    started = time.perf_counter()
    cache = EventCache(cache_dir(cfg))
    checkpoint = ws.latest_scenario_dir(cfg, scenario.name)
    scorer = Scorer.load(checkpoint, options.precision, options.device)
    check_checkpoint_matches(cache, scenario, scorer.meta, checkpoint)
    as_of = options.as_of or default_as_of(cache)
    if as_of <= cfg.data_params.data_start_date:
        raise ArgumentError("as_of", as_of, f"is before data_start_date ({cfg.data_params.data_start_date})")
    ids_wanted = read_entity_ids(options.entities) if options.entities is not None else None
    entity, unknown = resolve_entities(cache, ids_wanted)
    entity = entity[shard_range(len(entity), shard)]
    chunks, meta = entity_features(
        Path(cfg.workspace), cache, scorer.meta.encoder, entity, as_of, options.replay, progress
    )
    runtime.set_threads()
    model_top_k = top_k or (scorer.meta.scenario or {}).get("k", DEFAULT_TOP_K)
    ids = cache.entity_ids
    if shard:
        part = parts_dir(cfg, scenario.name, as_of, shard[1]) / f"part-{shard[0]:05d}.parquet"
        writer: Any = PartWriter(part, scorer.meta.version)
    else:
        writer = open_writer(cfg, "predictions", scenario.name, as_of, options.output, subset=subset)
        if getattr(writer, "directory", None) is not None:  # file destinations: what retention must keep
            ws.write_provenance(
                writer.directory,
                scenario=scenario.name,
                model_version=scorer.meta.version,
                foundation_version=scorer.meta.foundation_version,
                **cache_provenance(cache.manifest, as_of),
            )
    scoring_started = time.perf_counter()
    progress.start("predict", len(entity))
    sample = RowSample(len(entity))
    with writer:
        for a, X in zip(range(0, len(entity), CHUNK), chunks, strict=True):
            e = entity[a : a + CHUNK]
            sample.add(X)
            out = scorer.outputs(cache, X, e, as_of, model_top_k)
            writer.write(scorer.task.output_table(ids[e], as_of, out, top_k, threshold))
            progress.advance("predict", len(e))
        if len(entity) == 0:  # an empty shard or subset still writes the table's columns
            writer.write(
                scorer.task.output_table(
                    ids[:0], as_of, scorer.task.empty_outputs(model_top_k), top_k, threshold
                )
            )
        info = writer.close()
    scoring_s = time.perf_counter() - scoring_started
    wall = time.perf_counter() - started
    meta.update(
        {
            **info,
            "entities": len(entity),
            "as_of": as_of.isoformat(),
            "precision": scorer.precision,
            "model_version": scorer.meta.version,
            **cache_provenance(cache.manifest, as_of),  # what scenario_retrain_sensor compares
            "wall_s": round(wall, 2),
            "scoring_s": round(scoring_s, 2),
            "inference_entities_per_s": round(len(entity) / max(scoring_s, 1e-9), 1),
            "unknown_entities": len(unknown),
        }
    )
    if subset is not None:
        meta["subset"] = subset
    if unknown:
        meta["unknown_examples"] = ", ".join(unknown[:UNKNOWN_EXAMPLES])
    if shard is None and subset is None and len(entity):  # the whole population: how far it moved
        meta.update(population_drift(cfg, scenario.name, scorer.meta.version, as_of, sample.rows(), progress))
    return meta


def check_subset_destination(cfg: PipelineConfig, destination: str | None) -> None:
    """A subset is written to files only: a warehouse writer would replace the whole (scenario, as_of) slice."""
    from basemodel_pipeline.config.outputs import FileOutput

    dest_name, dest = cfg.outputs.destination(destination)
    if not isinstance(dest, FileOutput):
        raise ArgumentError(
            "output",
            repr(dest_name),
            f"is a {dest.kind} table, where a subset would replace the whole (scenario, as_of) slice; write "
            "subsets to a file destination (e.g. parquet)",
        )


def population_drift(
    cfg: PipelineConfig,
    scenario: str,
    model_version: str,
    as_of: dt.date,
    X: np.ndarray,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """PSI of the features scored now against the first full scoring of this model version (which becomes
    the reference: drift 0). Recorded as `drift_psi` in the predictions' metadata. The predictions are
    published by then: a reference that cannot be written (a full disk) is a warning, not a failed run, and
    the next full scoring tries again."""
    path = ws.drift_reference(cfg, scenario, model_version)
    try:
        ref = json.loads(path.read_text())
    except (OSError, ValueError):
        ref = {**drift.reference(X), "as_of": as_of.isoformat()}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fs.atomic_write_text(path, json.dumps(ref))
        except OSError as exc:
            (progress or NullProgress()).log(
                f"warning: {scenario}: drift reference not saved ({path}: {exc.strerror or exc}); the "
                "predictions are published, the next full scoring saves it"
            )
            return {"drift_reference_saved": False}
    return {"drift_psi": round(drift.psi(ref, X), 4), "drift_reference_as_of": ref["as_of"]}
