"""A scenario's CPU phase: its examples' features and the candidates that need no network (LightGBM on the
aggregates, popularity, repeat purchases, co-occurrence), fitted and staged for the fine-tuning step
(scenarios/staging.py).

Dagster runs it as the ``scenario_baselines`` step, outside the ``gpu`` pool, before ``scenario_model``;
fine-tuning then reads the stage instead of fitting them while it holds the GPU. Without a stage (``basemodel
finetune`` alone) fine-tuning fits them itself: the same code on the same rows, so the same models and metrics.
"""

from __future__ import annotations

import time
from typing import Any

from basemodel_pipeline.cache.versions import data_version as cache_data_version
from basemodel_pipeline.candidates.base import Context
from basemodel_pipeline.candidates.selection import BASELINES
from basemodel_pipeline.candidates.zoo import candidate_models
from basemodel_pipeline.config import PipelineConfig, Scenario
from basemodel_pipeline.progress import Progress
from basemodel_pipeline.scenarios import staging
from basemodel_pipeline.scenarios.shared import open_shared, prepare, split_parts
from basemodel_pipeline.tasks import task_for


def run_baselines(cfg: PipelineConfig, scenario: Scenario, progress: Progress) -> dict[str, Any]:
    """Fit and stage the scenario's baselines (kept when a stage of the same key exists). `cfg` has its
    windows resolved. Returns {data_version (the stage key), path, reused, candidates, fit_s, ...}."""
    t_start = time.perf_counter()
    shared = open_shared(cfg, progress)
    key = shared.stage_key(scenario)
    path = staging.stage_path(cfg, scenario.name, key)
    meta: dict[str, Any] = {
        "data_version": key,
        "path": str(path),
        "foundation_version": shared.fmeta.version,
        "cache_data_version": cache_data_version(shared.cache.manifest),
    }
    stage = staging.read(path)
    if stage is not None:
        progress.log(f"{scenario.name}: baselines already staged for key {key}: nothing to fit")
        return {**meta, "reused": True, "candidates": list(stage.saved), "fit_s": stage.fit_s}
    timing: dict[str, float] = {}
    t0 = time.perf_counter()
    spec, ex = prepare(shared, scenario)
    ex.pop("newest", None)  # the production refit's windows: the baselines are staged for evaluation only
    timing["targets_s"] = time.perf_counter() - t0
    progress.log(f"{scenario.name}: {', '.join(f'{k}={len(v)}' for k, v in ex.items())} examples")
    timing["featurise_s"] = shared.featurise(list(ex.values()))
    parts = split_parts(ex)
    rows = {k: shared.plain_rows(v) for k, v in {**parts, "test": ex["test"]}.items()}
    ctx = Context(scenario, spec, task_for(spec), cfg.training_params.finetune.seed, progress)
    candidates = {k: v for k, v in candidate_models(ctx, scenario.candidates).items() if k in BASELINES}
    t0 = time.perf_counter()
    stage = staging.fit_baselines(key, candidates, rows, progress, scenario.name)
    timing["fit_s"] = time.perf_counter() - t0
    staging.write(stage, path)
    timing["total_s"] = time.perf_counter() - t_start
    progress.log(f"{scenario.name}: baselines staged in {path} ({timing['total_s']:.1f} s)")
    return {
        **meta,
        "reused": False,
        "candidates": list(stage.saved),
        "fit_s": stage.fit_s,
        "examples": {k: len(v) for k, v in rows.items()},
        "timing_s": {k: round(v, 2) for k, v in timing.items()},
    }
