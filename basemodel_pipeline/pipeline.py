"""The pipeline's stages as plain functions: the CLI, the Pipes entrypoints (entrypoints/) and notebooks call these.

Rolling split dates (`training_end_date: auto`, relative starts) are resolved against the cache here, at
each run (cache/windows.py). Each stage reads its inputs from the workspace, writes its artifact atomically and returns a flat dict of
metadata (numbers, strings, paths) that the caller can show: Dagster attaches it to the materialization.
A full or read-only disk ends a stage in one line naming the path (diskfaults.py).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from basemodel_pipeline import files as fs
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.windows import resolve_windows
from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.diskfaults import guarded
from basemodel_pipeline.progress import NullProgress, Progress

if TYPE_CHECKING:
    from basemodel_pipeline.inference.options import EmbedOptions, ScoringOptions


@guarded
def run_extract(
    cfg: PipelineConfig,
    source: str | None = None,
    progress: Progress | None = None,
    days: tuple[dt.date, dt.date] | None = None,
) -> dict[str, Any]:
    """Extract one source (or all) into workspace/extracts/<source>/. Returns {source: {rows, files, path}}.

    With ``days=(start, end)`` only the event days in [start, end) are re-extracted: exactly those day files
    are rewritten (or removed when the source no longer has that day) and every other day stays untouched.
    Attribute tables are always extracted whole.
    """
    from basemodel_pipeline.sources.extract import extract_source

    if days is not None and not days[0] < days[1]:
        from basemodel_pipeline.errors import UserError

        raise UserError(
            f"day range {days[0]}..{days[1]} is empty; the end day is exclusive and must be later"
        )
    names = [source] if source else [s.name for s in cfg.data_sources]
    return {name: extract_source(cfg, cfg.source(name), progress or NullProgress(), days) for name in names}


@guarded
def run_cache(cfg: PipelineConfig, progress: Progress | None = None, **options: Any) -> dict[str, Any]:
    """Build (or reuse) the event cache from the extracts. Returns {path, fingerprint, entities, events, ...}.
    Options of cache.build.build_cache: disk_usage (what the free-space preflight asks)."""
    from basemodel_pipeline.cache.build import build_cache

    return build_cache(cfg, progress or NullProgress(), **options)


@guarded
def run_pretrain(cfg: PipelineConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Train the foundation model on the cache. Returns {path, version, train_loss, val_loss, ...}."""
    from basemodel_pipeline.training.pretrain import pretrain

    return pretrain(resolve_windows(cfg), progress or NullProgress())


@guarded
def run_finetune(cfg: PipelineConfig, scenario: str, progress: Progress | None = None) -> dict[str, Any]:
    """Fine-tune one scenario from the foundation checkpoint; evaluate it and the baselines on the test window."""
    from basemodel_pipeline.reports.scenario import report_files
    from basemodel_pipeline.scenarios.finetune import finetune

    cfg = resolve_windows(cfg)
    return finetune(cfg, cfg.scenario(scenario), progress or NullProgress(), report=report_files)


@guarded
def run_baselines(cfg: PipelineConfig, scenario: str, progress: Progress | None = None) -> dict[str, Any]:
    """A scenario's CPU phase: fit its baselines (no network) and stage them for run_finetune, which then
    reads them instead of fitting them (scenarios/baselines.py). Returns {data_version, path, reused, ...}."""
    from basemodel_pipeline.scenarios.baselines import run_baselines as fit_and_stage

    cfg = resolve_windows(cfg)
    return fit_and_stage(cfg, cfg.scenario(scenario), progress or NullProgress())


@guarded
def run_finetune_many(
    cfg: PipelineConfig, scenarios: list[str], progress: Progress | None = None
) -> dict[str, Any]:
    """Fine-tune several scenarios with one featurisation pass (each stops on its own validation metric).
    Returns {scenario: metadata} (a single scenario returns its metadata directly)."""
    from basemodel_pipeline.reports.scenario import report_files
    from basemodel_pipeline.scenarios.finetune import finetune_many

    cfg = resolve_windows(cfg)
    scs = [cfg.scenario(s) for s in scenarios]
    out = finetune_many(cfg, scs, progress or NullProgress(), report=report_files)
    return out[scenarios[0]] if len(scenarios) == 1 else out


@guarded
def run_predict(
    cfg: PipelineConfig,
    scenario: str,
    options: ScoringOptions | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Score every entity (or the ids of `options.entities`) as of a date (default: the day after the cache's
    last event day) and write the table to the output destination. The options also lay the run out
    (inference/options.py): in this process (the default), in K local worker processes then merged, one shard
    of K into a part file, or the merge of K part files."""
    from basemodel_pipeline.inference.options import ScoringOptions
    from basemodel_pipeline.inference.predict import predict
    from basemodel_pipeline.inference.shards import merge_shards
    from basemodel_pipeline.inference.workers import predict_with_workers

    cfg, options, progress = resolve_windows(cfg), options or ScoringOptions(), progress or NullProgress()
    sc = cfg.scenario(scenario)
    if options.merge_shards:
        return merge_shards(cfg, sc.name, options.as_of, options.merge_shards, options.output)
    if options.workers > 1:
        return predict_with_workers(cfg, sc, options, progress)
    return predict(cfg, sc, options, progress)


@guarded
def run_embed(
    cfg: PipelineConfig, options: EmbedOptions | None = None, progress: Progress | None = None
) -> dict[str, Any]:
    """Export float16 foundation embeddings of every entity as of a date (default: Parquet + RecSys-2025 arrays
    in workspace/embeddings/<as_of>/); the options are inference.options.EmbedOptions."""
    from basemodel_pipeline.inference.embed import export_embeddings
    from basemodel_pipeline.inference.options import EmbedOptions

    return export_embeddings(resolve_windows(cfg), options or EmbedOptions(), progress or NullProgress())


def checkpoint_root(cfg: PipelineConfig, scenario: str | None) -> Path:
    """A scenario's checkpoint root, or the foundation's when `scenario` is None."""
    return ws.scenario_root(cfg, cfg.scenario(scenario).name) if scenario else ws.foundation_root(cfg)


@guarded
def run_promote(
    cfg: PipelineConfig, scenario: str | None, version: str | None = None, force: bool = False
) -> dict[str, Any]:
    """Serve `version` (default: the newest) of a scenario (or the foundation, `scenario` None): its gates run
    again and must pass unless `force`; promoting an earlier version is a rollback. Returns its verdict."""
    from basemodel_pipeline.training import promotion

    root = checkpoint_root(cfg, scenario)
    verdict = promotion.promote(cfg, root, version, force)
    return {"version": verdict.version, "previous": verdict.previous, **promotion.summary(verdict)}


def list_versions(cfg: PipelineConfig, scenario: str | None) -> list[dict[str, str]]:
    """Every checkpoint version of a scenario (or the foundation), newest first: served, promoted earlier,
    rejected (with the failed gates) or a candidate."""
    from basemodel_pipeline.training import promotion

    return [vars(v) for v in promotion.listing(checkpoint_root(cfg, scenario))]


@guarded
def write_summary(cfg: PipelineConfig) -> dict[str, Any]:
    """Collect each scenario's test metrics into workspace/reports/summary.json."""
    scenarios: dict[str, Any] = {}
    for sc in cfg.scenarios:
        if not ws.has_scenario(cfg, sc.name):
            continue
        metrics_file = ws.latest_scenario_dir(cfg, sc.name) / "metrics.json"
        if not metrics_file.exists():
            continue
        m = json.loads(metrics_file.read_text())
        test = m["test"]
        scenarios[sc.name] = {
            "metric": m["metric"],
            "published": m["published"],
            "model": test["model"],
            "neural": test.get("neural", test["model"]),
            "lightgbm_aggregates": test.get("lightgbm_aggregates"),
            "repeat_purchases": test.get("repeat_purchases"),
            "popularity": test["popularity"],
        }
    out = Path(cfg.workspace) / "reports" / "summary.json"
    fs.atomic_write_text(out, json.dumps({"scenarios": scenarios}, indent=2))
    return {"path": str(out), "scenarios": scenarios}
