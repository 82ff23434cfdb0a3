"""Scoring in K local worker processes: each scores one shard of the entities into a part file, then the
parts are merged in order into the destination: the same table as one process (inference/shards.py).

The workers are Python processes started with multiprocessing's spawn method, each calling
inference.predict.predict on its shard; the library never starts its own CLI. Their number is capped by the
cores and the free memory (cap_workers), and each gets cores // K torch threads.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from basemodel_pipeline import stops
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import PipelineConfig, Scenario
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.inference.options import ScoringOptions
from basemodel_pipeline.inference.predict import predict
from basemodel_pipeline.inference.shards import merge_shards
from basemodel_pipeline.inference.state import default_as_of, ensure_state, state_serves
from basemodel_pipeline.model.checkpoint import read_meta
from basemodel_pipeline.progress import NullProgress, Progress
from basemodel_pipeline.workspace import cache_dir

WORKER_MEMORY = 400 * 2**20  # about what one scoring process holds (model, state slice, batches)


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def available_memory() -> int | None:
    """Bytes of memory available to new processes (psutil, else /proc/meminfo), or None if unknown."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # pragma: no cover - psutil is in requirements.lock
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cap_workers(requested: int, cores: int, free: int | None) -> tuple[int, str | None]:
    """(workers to start, one-line note when fewer than `requested`): at most one per core and one per
    WORKER_MEMORY of free memory (when known), and at least one."""
    by_memory = requested if free is None else free // WORKER_MEMORY
    workers = max(1, min(requested, cores, by_memory))
    if workers == requested:
        return workers, None
    memory = "free memory unknown" if free is None else f"{free / 2**30:.1f} GiB free"
    return workers, (
        f"workers {requested} capped to {workers}: {cores} core{'s' * (cores != 1)}, {memory} "
        f"at ~{WORKER_MEMORY // 2**20} MB per worker"
    )


def _start_worker(threads: int) -> None:
    """Each worker's share of the cores: torch's threads, and the variable predict reads (runtime.set_threads)."""
    os.environ["OMP_NUM_THREADS"] = os.environ["BASEMODEL_TORCH_THREADS"] = str(threads)
    stops.in_worker()  # a stop of the stage ends its workers (stops.end_children)
    import torch

    torch.set_num_threads(threads)


def _score_shard(cfg: PipelineConfig, scenario: Scenario, options: ScoringOptions) -> None:
    """One worker's job: score its shard (options.shard) into its part file (a stop removes the part's
    staging)."""
    with stops.stopping_cleanly():
        predict(cfg, scenario, options, NullProgress())


def predict_with_workers(
    cfg: PipelineConfig, scenario: Scenario, options: ScoringOptions, progress: Progress
) -> dict[str, Any]:
    """Build or advance the shared state once, score `options.workers` shards in as many local processes (each
    with the run's options for its shard), merge the parts into the options' output. The count is capped
    by the cores and free memory (the cap is logged; the result reports the workers actually used)."""
    requested, cores = options.workers, usable_cores()
    k, note = cap_workers(requested, cores, available_memory())
    if note:
        progress.log(note)
    cache = EventCache(cache_dir(cfg))
    as_of = options.as_of or default_as_of(cache)
    if state_serves(cache, as_of, replay=options.replay):
        meta = read_meta(ws.latest_scenario_dir(cfg, scenario.name))
        ensure_state(Path(cfg.workspace), cache, meta.encoder, as_of, progress)
    started = time.perf_counter()
    context = multiprocessing.get_context("spawn")  # no fork of a process holding torch's threads
    errors = []
    progress.start("predict", k)
    with ProcessPoolExecutor(k, context, initializer=_start_worker, initargs=(max(1, cores // k),)) as pool:
        jobs = [pool.submit(_score_shard, cfg, scenario, options.for_shard(i, k, as_of)) for i in range(k)]
        for i, job in enumerate(jobs):
            try:
                job.result()
            except UserError as exc:
                errors.append(f"shard {i}/{k}: {exc}")
            except BrokenProcessPool:
                errors.append(
                    f"shard {i}/{k}: its worker process died (killed, or out of memory: try fewer workers)"
                )
            progress.advance("predict", 1)
    if errors:
        raise UserError("; ".join(errors))
    wall = time.perf_counter() - started
    out = merge_shards(cfg, scenario.name, as_of, k, options.output)
    return {**out, "workers": k, "workers_requested": requested, "workers_wall_s": round(wall, 2)}
