"""Scenario fine-tuning from the foundation checkpoint, with per-scenario early stopping, and evaluation of
the model beside the popularity and hand-crafted-aggregates + LightGBM baselines on the same temporal split.

Modes: ``frozen`` (the trunk's outputs are computed once, then only the head trains: seconds per epoch even
with thousands of labels), ``full`` (everything trains), ``lora`` (low-rank adapters on the trunk's linear
layers + the head; merged into the weights before saving). ``finetune_many`` featurises the union of all
the scenarios' examples in one pass over the event cache, then trains each head with its own stopping point.
The baselines that need no network are read from the scenario's stage when its CPU step fitted them
(scenarios/baselines.py, scenarios/staging.py), and fitted here otherwise: the same models either way.
What the scenarios share (the featurised examples, the splits) is scenarios/shared.py's; the candidates they
fit, compare and publish are candidates/'s; the network's training loop is scenarios/network.py's.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from basemodel_pipeline import locks, runtime
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.versions import data_version as cache_data_version
from basemodel_pipeline.cache.windows import windows_metadata
from basemodel_pipeline.candidates.bagging import seed_spread
from basemodel_pipeline.candidates.base import Candidate
from basemodel_pipeline.candidates.calibration import amounts_summary, calibrate_outputs
from basemodel_pipeline.candidates.lightgbm import LightGBM
from basemodel_pipeline.candidates.selection import (
    NOT_APPLICABLE,
    Selection,
    choose,
    primary,
    with_blend,
    worse_on_test,
)
from basemodel_pipeline.config import PipelineConfig, Scenario
from basemodel_pipeline.dates import iso_day
from basemodel_pipeline.metadata import json_dumps
from basemodel_pipeline.model.checkpoint import CheckpointMeta, publish_checkpoint
from basemodel_pipeline.model.trunk import TrunkWithHead
from basemodel_pipeline.progress import Progress
from basemodel_pipeline.scenarios.fitting import Fit, fit_beside_network, fit_candidates
from basemodel_pipeline.scenarios.network import clear_resume, train_network
from basemodel_pipeline.scenarios.outcome import kept_outputs, run_summary
from basemodel_pipeline.scenarios.refit import fit_windows, production_refit, refit
from basemodel_pipeline.scenarios.shared import (
    Shared,
    open_shared,
    prepare,
    refits,
    split_parts,
)
from basemodel_pipeline.targets.labels import Examples, TargetSpec
from basemodel_pipeline.tasks import Task, task_for
from basemodel_pipeline.training import promotion
from basemodel_pipeline.training.work import WorkCounter


@dataclass(frozen=True)
class Finished:
    """A fine-tuned scenario about to be published: what its report is made from. The report itself is
    composed above this layer (pipeline.py passes reports.scenario.report_files as finetune_many's `report`)."""

    shared: Shared
    scenario: Scenario
    model: TrunkWithHead
    task: Task
    test: Examples  # the test window's examples
    result: dict[str, Any]  # what metrics.json holds
    truth: Any  # the test labels
    outputs: dict[str, Any]  # every candidate's test outputs


ReportFiles = Callable[[Finished], dict[str, str]]  # files to publish beside the checkpoint


def finetune_many(
    cfg: PipelineConfig,
    scenarios: list[Scenario],
    progress: Progress,
    keep_outputs: bool = False,
    report: ReportFiles | None = None,
) -> dict[str, dict[str, Any]]:
    """Fine-tune several scenarios with one featurisation pass; each stops on its own validation metric.
    ``keep_outputs``: each result also holds "test_outputs" (every candidate's test outputs), "test_truth",
    "test_entity" and "test_time" (bench/bench_quality.py computes paired intervals from them). ``report``:
    the files (report.html, ...) each checkpoint is published with; without it a checkpoint has metrics.json
    but no report. Each scenario's training lock is held throughout (locks.training_lock)."""
    with contextlib.ExitStack() as held:
        for sc in sorted(scenarios, key=lambda s: s.name):  # one order for every run: no deadlock
            held.enter_context(
                locks.training_lock(ws.scenario_root(cfg, sc.name), f"finetune of {sc.name}", progress.log)
            )
        return _finetune_many(cfg, scenarios, progress, keep_outputs, report)


def _finetune_many(
    cfg: PipelineConfig,
    scenarios: list[Scenario],
    progress: Progress,
    keep_outputs: bool,
    report: ReportFiles | None,
) -> dict[str, dict[str, Any]]:
    shared = open_shared(cfg, progress)
    prepared = {}
    for sc in scenarios:
        t0 = time.perf_counter()
        prepared[sc.name] = (*prepare(shared, sc), time.perf_counter() - t0)
        sizes = ", ".join(
            f"{k}={len(v):,}"
            + (f" (of {shared.available[sc.name][k]:,})" if len(v) < shared.available[sc.name][k] else "")
            for k, v in prepared[sc.name][1].items()
        )
        progress.log(f"{sc.name}: {sizes} examples")
    runtime.import_beside()  # the heads' optimizers import torch's compiler stack: while featurising
    featurise_s = shared.featurise([x for _, ex, _ in prepared.values() for x in ex.values()])
    counter = WorkCounter(shared.cache, [plan.name for plan in shared.enc.sources])
    # every distinct (entity, time) example, featurised once
    counter.add(shared.keys[:, 0], shared.keys[:, 1])
    done = counter.summary(featurise_s)
    work = {
        "featurise_examples": done["examples"],
        "featurise_history_events": done["history_events"],
        "featurise_examples_per_s": done["examples_per_s"],
        "featurise_history_events_per_s": done["history_events_per_s"],
    }
    out = {}
    for sc in scenarios:
        spec, ex, targets_s = prepared[sc.name]
        timing = {"targets_s": targets_s, "featurise_s": featurise_s}
        out[sc.name] = _finish(shared, sc, spec, ex, progress, timing, dict(work), keep_outputs, report)
    return out


def finetune(
    cfg: PipelineConfig, scenario: Scenario, progress: Progress, report: ReportFiles | None = None
) -> dict[str, Any]:
    return finetune_many(cfg, [scenario], progress, report=report)[scenario.name]


def _finish(
    shared: Shared,
    scenario: Scenario,
    spec: TargetSpec,
    ex: dict[str, Examples],
    progress: Progress,
    timing: dict,
    work: dict,
    keep_outputs: bool = False,
    report: ReportFiles | None = None,
) -> dict[str, Any]:
    """Train the network, fit the other candidates, choose on validation, score the test window once,
    publish the checkpoint with the chosen candidate (and the report's files, when `report` is given)."""
    cfg = shared.cfg
    parts = split_parts(ex)
    mode, task = scenario.mode or cfg.training_params.finetune.mode, task_for(spec)
    beside = fit_beside_network(shared, scenario, spec, {**parts, "test": ex["test"]}, task, mode, progress)
    t0 = time.perf_counter()
    model, task, history, best = train_network(
        shared, scenario, spec, {"train": parts["train"], "val": parts["stop"]}, progress, task=task
    )
    timing["train_s"] = time.perf_counter() - t0
    # examples the network trained on, all epochs (features come from the shared featurisation pass)
    work["train_examples_per_s"] = round(len(parts["train"]) * len(history) / max(timing["train_s"], 1e-9), 1)
    model.to(runtime.resolve_device(cfg.training_params.foundation.device))
    fit = fit_candidates(
        shared, scenario, spec, {**parts, "test": ex["test"]}, model, task, mode, progress, beside
    )
    t0 = time.perf_counter()
    selection, published = _choose(fit, parts, scenario)
    timing["select_s"] = time.perf_counter() - t0
    progress.log(f"{scenario.name}: published {selection.published}: {selection.reason}")
    t0 = time.perf_counter()
    outputs = _score_test(fit, selection, published)  # the test window, scored once, after the choice
    timing["test_s"] = time.perf_counter() - t0
    timing["candidates_fit_s"] = sum(fit.fit_s.values())
    refit_info: dict[str, Any] = {}
    if cfg.training_params.finetune.refit_on_validation:
        t0 = time.perf_counter()
        model, outputs["model"] = refit(
            shared, scenario, spec, parts, ex["test"], model, history, published, progress
        )
        timing["refit_s"] = time.perf_counter() - t0
        refit_info = {"refit_on_validation": True, "windows": "training + validation"}
    truth = fit.ctx.task.truth(ex["test"].labels)
    result = {
        **_evaluation(fit, spec, scenario, selection, outputs, truth),
        "mode": mode,
        "best_val": best,
        "examples": {
            "train": len(ex["train"]),
            "stop": len(parts["stop"]),
            "select": len(parts["select"]),
            "test": len(ex["test"]),
            "available": shared.available.get(scenario.name, {}),  # before finetune.max_*_examples
        },
        "regime": shared.regime,
        **({"refit": refit_info} if refit_info else {}),
        "history": history,
        "timing_s": {k: round(v, 2) for k, v in timing.items()},
        "work": work,  # training/work.py
        "test_date": cfg.data_params.test_date.isoformat(),
        "test_split_points": [iso_day(int(t)) for t in np.unique(ex["test"].time)],
        "windows": windows_metadata(cfg),
        "foundation_version": shared.fmeta.version,
        "cache_data_version": cache_data_version(shared.cache.manifest),
    }
    learned = [parts["train"], *((parts["stop"], parts["select"]) if refit_info else ())]
    result["fit_windows"] = {
        "data_end": str(shared.cache.source_max_date(scenario.target.source)),
        "evaluated": fit_windows(learned, scenario),
    }
    if refits(cfg, scenario):  # after the test measurement: every complete window, the newest weeks too
        everything = {**parts, **{k: ex[k] for k in ("test", "newest") if k in ex}}
        model = production_refit(
            shared, scenario, spec, everything, model, history, published, progress, result
        )
        learned = list(everything.values())
    result["fit_windows"]["published"] = fit_windows(learned, scenario)
    done = Finished(shared, scenario, model, task, ex["test"], result, truth, outputs)
    version, final, verdict = _publish(done, spec, selection, published, report, timing, progress)
    kept = kept_outputs(outputs, truth, ex["test"]) if keep_outputs else {}
    summary = run_summary(final, version, result, selection, timing, work, fit.stage_info["reused"])
    return {**kept, **summary, **promotion.summary(verdict)}


def _choose(fit: Fit, parts: dict[str, Examples], scenario: Scenario) -> tuple[Selection, Candidate]:
    """The published candidate (or blend), chosen on the selection rows of the validation windows; the
    outputs' calibrations from every validation row."""
    task, candidates, select = fit.ctx.task, fit.candidates, fit.rows["select"]
    staged = fit.stage.select if fit.stage is not None else {}
    y_select = select.labels if task.ranked else task.truth(parts["select"].labels)
    val_out = {
        name: staged[name] if name in staged else cand.predict(select) for name, cand in candidates.items()
    }
    fitted = [n for n in ("neural", "lightgbm_hybrid", "lightgbm_aggregates") if n in candidates]
    if task.per_class and len(fitted) > 2:
        # one weight per model, thousands of labels: the blend joins the network and the better LightGBM. For
        # binary and regression all three (CJ, 3 seeds: churn 0.8554 vs 0.8544 AUROC with two, spend 1.4293 vs
        # 1.4363 RMSE: the two LightGBMs err differently enough to help)
        gbm = [n for n in fitted if n != "neural"]
        scores = {n: primary(task, y_select, val_out[n]) for n in gbm}
        fitted = ["neural", max(gbm, key=lambda n: scores[n] if np.isfinite(scores[n]) else -np.inf)]
    members = [] if task.ranked else fitted
    selection, published = choose(
        fit.ctx, candidates, val_out, y_select, select.entity, members, scenario.publish
    )
    if task.calibrated:
        stop = (fit.rows["stop"], task.truth(parts["stop"].labels))
        fit.calibrations = calibrate_outputs(
            fit.ctx, fit.candidates, selection, published, val_out, y_select, stop
        )
    return selection, published


def _score_test(fit: Fit, selection: Selection, published: Candidate) -> dict[str, Any]:
    """Every candidate's test outputs ("model": the published one's, first); the blend's too when the
    selection fitted one, even if another candidate is published."""
    staged_test = fit.stage.test if fit.stage is not None else {}
    test = fit.rows["test"]
    outputs = {
        name: staged_test[name] if name in staged_test else cand.predict(test)
        for name, cand in fit.candidates.items()
    }
    outputs = with_blend(fit.ctx, fit.candidates, selection, published, outputs)
    return {"model": outputs[selection.published], **outputs}


def _evaluation(
    fit: Fit, spec: TargetSpec, scenario: Scenario, selection: Selection, outputs: dict[str, Any], truth: Any
) -> dict[str, Any]:
    """The test metrics of every candidate and what was chosen: the heart of metrics.json."""
    task = fit.ctx.task
    log1p = bool(getattr(spec.details, "log1p", False))

    def metrics_of(name: str) -> dict[str, Any]:
        o = outputs[name]
        return {
            **task.evaluate(truth, o, scenario.k, log1p),
            **task.calibrated_metrics(truth, o, fit.calibrations.get(name)),
        }

    with ThreadPoolExecutor(runtime.cpu_workers(len(outputs))) as pool:  # numpy's sorts release the GIL
        all_metrics = dict(zip(outputs, pool.map(metrics_of, outputs), strict=True))
    for name in ("popularity",):  # popularity scores rank but are not probabilities: no log-loss
        if name in all_metrics:
            all_metrics[name] = {
                k: (float("nan") if "log_loss" in k else v) for k, v in all_metrics[name].items()
            }
    test = {name: m[task.primary_metric] for name, m in all_metrics.items()}
    amounts = (
        # the money maps learned from every validation row (calibrate_outputs)
        amounts_summary(
            all_metrics["model"],
            truth,
            fit.rows["test"].entity,
            len(fit.rows["select"]) + len(fit.rows["stop"]),
        )
        if task.calibrated
        else None
    )
    if task.ranked:
        test.setdefault("lightgbm_aggregates", None)  # no LightGBM on aggregates for ranking the catalogue
        test.setdefault("repeat_purchases", None)  # items: new: not applicable (not_applicable says why)
    return {
        "metric": task.primary_metric,
        "task": task.name,
        "published": selection.published,
        "selection": selection.to_dict(),
        "test": test,
        "test_metrics": all_metrics,
        "classes": len(spec.classes) or getattr(spec.details, "n_items", 1),
        "repeat_weight": getattr(spec.details, "repeat_weight", None),
        "candidates_fit_s": fit.fit_s,
        # multilabel LightGBM: the row bound and the rows each per-label booster trained on
        "lightgbm_rows": {
            name: cand.gbm.sampling()
            for name, cand in fit.candidates.items()
            if task.per_label and isinstance(cand, LightGBM) and cand.gbm is not None
        },
        "baselines": fit.stage_info,
        "seed_spread": seed_spread(fit.candidates, fit.rows),
        **({"amounts": amounts} if amounts else {}),
        "test_worse_than": worse_on_test(task, test),
        **({"not_applicable": NOT_APPLICABLE} if task.ranked and "repeat_purchases" not in outputs else {}),
    }


def _publish(
    done: Finished,
    spec: TargetSpec,
    selection: Selection,
    published: Candidate,
    report: ReportFiles | None,
    timing: dict,
    progress: Progress,
) -> tuple[str, Path, promotion.Verdict]:
    """Publish the checkpoint as a candidate version: weights, model.json, metrics.json, the published
    candidate's files, the target's large parts, a Python target's source and the report's files; then run its
    quality gates, which make it LATEST (served) or leave it rejected (training/promotion.py)."""
    shared, scenario, result = done.shared, done.scenario, done.result
    stored = spec.to_dict()
    big = {
        k: stored.pop(k) for k in ("items", "popularity") if k in stored
    }  # target.json; the rest model.json
    published_meta, published_files = published.save()
    result["published_description"] = published.describe()  # metrics.json and the report say what it is
    meta = CheckpointMeta(
        kind="scenario",
        scenario=scenario.model_dump(mode="json"),
        target=stored,
        arch=shared.fmeta.arch.with_out_dim(done.task.out_dim),
        encoder=shared.fmeta.encoder,
        foundation_version=shared.fmeta.version,
        cache_fingerprint=shared.cache.manifest["fingerprint"],
        published={"name": selection.published, **published_meta},
        metrics={k: v for k, v in result.items() if k != "history"},
    )
    extra: dict[str, str | bytes] = {
        "metrics.json": json_dumps(result),
        **{f"candidates/{k}": v for k, v in published_files.items()},
    }
    if report is not None:
        t0 = time.perf_counter()
        extra.update(report(done))
        timing["report_s"] = time.perf_counter() - t0
    if big:
        extra["target.json"] = json.dumps(big)
    from basemodel_pipeline.targets.python import function_source

    source = function_source(scenario)  # a Python target's; None for a declarative one
    if source is not None:
        extra["target_function.py"] = source
    root = ws.scenario_root(shared.cfg, scenario.name)
    version, final = publish_checkpoint(root, done.model, meta, extra, promote=False)
    clear_resume(shared.cfg, scenario.name)  # the network's resumable states are no longer needed
    verdict = promotion.judge(shared.cfg, root, version, by="finetune")
    if result["test_worse_than"]:
        progress.log(
            f"{scenario.name}: warning: the published {selection.published} is worse on the test window than "
            f"{', '.join(result['test_worse_than'])} (chosen on validation; see the report)"
        )
    if verdict.status == "rejected":
        progress.log(
            f"{scenario.name}: version {version} rejected by its quality gates ({verdict.reason}); "
            f"still serving {verdict.previous or 'nothing'}"
        )
    return version, final, verdict
