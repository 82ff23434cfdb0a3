"""Scenario fine-tuning from the foundation checkpoint, with per-scenario early stopping, and evaluation of
the model beside the popularity and hand-crafted-aggregates + LightGBM baselines on the same temporal split."""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.build import cache_dir
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import PipelineConfig, Scenario
from basemodel_pipeline.config.models import BinaryTarget
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.evaluation import baselines, metrics
from basemodel_pipeline.evaluation.aggregates import aggregate_features
from basemodel_pipeline.features.sketch import FeatureEncoder
from basemodel_pipeline.model.checkpoint import build_model, load_trunk_state, publish_checkpoint
from basemodel_pipeline.progress import Progress
from basemodel_pipeline.scenarios.targets import Examples, build_examples, choose_classes
from basemodel_pipeline.training import loop
from basemodel_pipeline.training.splits import scenario_split_times


def _check_split(name: str, part: str, ex: Examples, task: str) -> None:
    y = ex.labels
    if len(ex) == 0:
        raise DataError(
            f"scenario '{name}': the {part} split has no examples; check data_params and the target"
        )
    if task == "binary" and len(np.unique(y)) < 2:
        raise DataError(
            f"scenario '{name}': the {part} split has only one label value ({y[0]:.0f}); "
            "the target never (or always) happens there"
        )


def evaluate_baselines(
    cache: EventCache, scenario: Scenario, spec_codes: list[int], ex: dict[str, Examples]
) -> dict[str, float]:
    """Popularity and aggregates + LightGBM on the same split; returns test metrics."""
    task, target = scenario.task, scenario.target
    feats = {k: aggregate_features(cache, v.entity, v.time)[0] for k, v in ex.items()}
    lgb = baselines.lightgbm_scores(
        task, feats["train"], ex["train"].labels, feats["val"], ex["val"].labels, feats["test"]
    )
    test = ex["test"]
    if isinstance(target, BinaryTarget):
        pop = baselines.popularity_scores("binary", cache, test.entity, test.time, target.source)
        pop = -pop if target.event == "none" else pop  # more activity = less churn
    else:
        pop = baselines.popularity_scores(
            "multilabel",
            cache,
            test.entity,
            test.time,
            target.source,
            column=target.column,
            class_codes=np.array(spec_codes),
        )
    return {
        "lightgbm_aggregates": metrics.primary_metric(task, test.labels, lgb),
        "popularity": metrics.primary_metric(task, test.labels, pop),
    }


def finetune(cfg: PipelineConfig, scenario: Scenario, progress: Progress) -> dict[str, Any]:
    started = time.perf_counter()
    p = cfg.training_params.finetune
    cache = EventCache(cache_dir(cfg))
    foundation = ws.latest_foundation_dir(cfg)
    fmeta = json.loads((foundation / "model.json").read_text())
    enc = FeatureEncoder.from_dict(fmeta["encoder"])
    times = scenario_split_times(cfg.data_params, scenario.target.horizon_days, f"scenario '{scenario.name}'")
    spec = choose_classes(cache, scenario, times["train"])
    ex = {k: build_examples(cache, scenario, spec, v) for k, v in times.items()}
    for k, v in ex.items():
        _check_split(scenario.name, k, v, scenario.task)
    progress.log(f"{scenario.name}: {', '.join(f'{k}={len(v)}' for k, v in ex.items())} examples")
    t0 = time.perf_counter()
    X = {k: enc.history(cache, v.entity, v.time) for k, v in ex.items()}
    featurise_s = time.perf_counter() - t0

    torch.manual_seed(p.seed)
    loop.set_threads()
    device = loop.pick_device(cfg.training_params.foundation.device)
    n_out = 1 if scenario.task == "binary" else len(spec.classes)
    arch = {**fmeta["arch"], "out_dim": n_out}
    model = build_model(arch)
    model.trunk.load_state_dict(load_trunk_state(foundation))
    model.to(device)
    if p.mode == "frozen":
        for param in model.trunk.parameters():
            param.requires_grad_(False)
    y = {k: v.labels.reshape(len(v), -1) for k, v in ex.items()}
    steps = p.epochs * -(-len(X["train"]) // p.batch_size)
    opt, sched = loop.optimizer_and_schedule(
        model, p.learning_rate, p.weight_decay, min(100, steps // 10), steps
    )
    loss_fn = nn.BCEWithLogitsLoss()
    rng = np.random.default_rng(p.seed)
    progress.start(f"finetune {scenario.name}", steps)
    best, best_state, history, bad = -np.inf, None, [], 0
    for epoch in range(p.epochs):
        train_loss = loop.train_epoch(
            model,
            X["train"],
            y["train"],
            loss_fn,
            opt,
            sched,
            p.batch_size,
            rng,
            device,
            on_step=lambda v, _n: progress.advance(f"finetune {scenario.name}", 1, loss=v),
        )
        val_metric = metrics.primary_metric(
            scenario.task, ex["val"].labels, _scores(model, X["val"], device, n_out)
        )
        history.append({"epoch": epoch + 1, "train_loss": train_loss, "val_metric": val_metric})
        progress.log(
            f"{scenario.name} epoch {epoch + 1}: train_loss={train_loss:.4f} val_{metrics.PRIMARY_METRIC[scenario.task]}={val_metric:.4f}"
        )
        if val_metric > best:
            best, best_state, bad = val_metric, copy.deepcopy(model.state_dict()), 0
        else:
            bad += 1
            if bad >= p.patience:
                break
    assert best_state is not None
    model.load_state_dict(best_state)
    test_scores = _scores(model, X["test"], device, n_out)
    train_s = time.perf_counter() - started
    metric_name = metrics.PRIMARY_METRIC[scenario.task]
    test = {"model": metrics.primary_metric(scenario.task, ex["test"].labels, test_scores)}
    t0 = time.perf_counter()
    test.update(evaluate_baselines(cache, scenario, spec.class_codes, ex))
    baseline_s = time.perf_counter() - t0

    result = {
        "metric": metric_name,
        "test": test,
        "best_val": best,
        "examples": {k: len(v) for k, v in ex.items()},
        "history": history,
        "test_date": cfg.data_params.test_date.isoformat(),
    }
    meta = {
        "kind": "scenario",
        "scenario": scenario.model_dump(mode="json"),
        "target": spec.to_dict(),
        "arch": arch,
        "encoder": fmeta["encoder"],
        "foundation_version": fmeta["version"],
        "metrics": result,
    }
    extra = {"metrics.json": json.dumps(result, indent=2)}
    version, final = publish_checkpoint(ws.scenario_root(cfg, scenario.name), model, meta, extra)
    return {
        "path": str(final),
        "version": version,
        "metric": metric_name,
        "test_model": test["model"],
        "test_lightgbm_aggregates": test["lightgbm_aggregates"],
        "test_popularity": test["popularity"],
        "best_val": best,
        "epochs": len(history),
        "train_examples": len(ex["train"]),
        "classes": len(spec.classes) or 1,
        "featurise_s": round(featurise_s, 2),
        "train_s": round(train_s, 2),
        "baselines_s": round(baseline_s, 2),
    }


def _scores(model: nn.Module, X: np.ndarray, device: torch.device, n_out: int) -> np.ndarray:
    logits = loop.predict(model, X, device)
    probs = 1.0 / (1.0 + np.exp(-logits))
    return probs[:, 0] if n_out == 1 else probs
