"""Embedding probe on The Complete Journey: the same fixed MLP on foundation embeddings vs on aggregates.

    .venv/bin/python bench/bench_probe.py [--workspace bench_workspace] [--protocol recsys] [--seeds 0 1 2]

Needs a workspace where the foundation model has been trained (e.g. after bench/bench_demo.py or make demo).
The embeddings are what `basemodel embed` exports: `model.embed(features)` in float16.

Protocols (all run by default; every result holds each probe seed and their mean):
- ``recsys`` (RecSys Challenge 2025): one embedding per entity as of the test split point
  (data_params.training_end_date), targets in the window after it; the probe is cross-fitted over 5 folds of
  entities (training/probe.py: cross_fitted_scores), so every entity is scored by a probe that never saw it;
  the score is the mean of the 5 per-fold AUROCs (fold_metric: each fold has its own probe and calibration).
- ``weekly``: the scenario split (docs/design.md, "Evaluation protocol"): the probe fits on the weekly training split points, chooses
  its epoch on the validation split points and is scored on the test window. The foundation was trained to
  predict the futures of those training weeks, so this probe can learn to trust what the trunk recalls about
  them (docs/benchmarks.md, "Probe").
- ``unseen_weeks``: the weekly protocol without that leak: the probe fits on the validation split points only
  (target windows the foundation never trained on), chooses its epoch on one fold of their entities
  (entity_folds) and is scored on the test window.

A paired bootstrap over the scored rows gives a 95% interval of (embeddings - aggregates) for the
seed-averaged scores. Writes bench/results/embedding_probe.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import psutil
import torch

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.cache.windows import resolve_windows
from basemodel_pipeline.config import load_config
from basemodel_pipeline.evaluation.resampling import Metric, entity_folds, fold_metric, paired_bootstrap
from basemodel_pipeline.features.aggregates import aggregate_features
from basemodel_pipeline.features.sketch import FeatureEncoder
from basemodel_pipeline.model.checkpoint import load_checkpoint
from basemodel_pipeline.scenarios.targets import build_examples, choose_classes
from basemodel_pipeline.targets.labels import Examples
from basemodel_pipeline.tasks import task_named
from basemodel_pipeline.training.probe import cross_fitted_scores, probe_scores
from basemodel_pipeline.training.splits import scenario_split_times
from basemodel_pipeline.workspace import cache_dir

PROTOCOLS = ("recsys", "weekly", "unseen_weeks")
PARTS = {"recsys": ("test",), "weekly": ("train", "val", "test"), "unseen_weeks": ("val", "test")}
FOLDS = 5  # recsys protocol


def _inputs(model, enc: FeatureEncoder, cache: EventCache, ex: Examples) -> dict[str, np.ndarray]:
    with torch.no_grad():
        emb = model.embed(torch.from_numpy(enc.history(cache, ex.entity, ex.time))).numpy()
    return {
        "embeddings": emb.astype(np.float16),
        "aggregates": aggregate_features(cache, ex.entity, ex.time)[0],
    }


def _scores(protocol: str, feats: dict, ex: dict[str, Examples], metric: Metric, seed: int) -> np.ndarray:
    if protocol == "recsys":
        test = ex["test"]
        return cross_fitted_scores(feats["test"], test.labels, test.entity, metric, FOLDS, seed=seed)
    if protocol == "unseen_weeks":
        val, X = ex["val"], feats["val"]
        choose = entity_folds(val.entity, FOLDS) == 0  # one fold of entities picks the epoch
        fit, check = val.subset(~choose), val.subset(choose)
        return probe_scores(X[~choose], fit.labels, X[choose], check.labels, feats["test"], metric, seed)
    return probe_scores(
        feats["train"], ex["train"].labels, feats["val"], ex["val"].labels, feats["test"], metric, seed
    )


def run_protocol(protocol: str, cfg, model, enc, cache, sc, seeds: list[int], result: dict) -> None:
    """Both probes of one scenario under one protocol; adds `<protocol>_<scenario>_*` keys to result."""
    started = time.perf_counter()
    times = scenario_split_times(resolve_windows(cfg).data_params, sc.target.horizon_days, sc.name)
    spec = choose_classes(cache, sc, times["train"])
    parts = PARTS[protocol]
    ex = {k: build_examples(cache, sc, spec, times[k]) for k in parts}
    inputs = {k: _inputs(model, enc, cache, v) for k, v in ex.items()}
    truth = ex["test"].labels
    groups = entity_folds(ex["test"].entity, FOLDS) if protocol == "recsys" else None
    key = f"{protocol}_{sc.name}"
    mean_scores = {}
    for name in ("embeddings", "aggregates"):
        feats = {k: v[name] for k, v in inputs.items()}
        per_seed, runs = [], []
        for seed in seeds:
            s = _scores(protocol, feats, ex, task_named(sc.task).primary, seed)
            runs.append(s)
            per_seed.append(round(fold_metric(task_named(sc.task).primary, truth, s, groups), 4))
        mean_scores[name] = np.mean(runs, 0)
        result[f"{key}_probe_{name}"] = round(float(np.mean(per_seed)), 4)
        result[f"{key}_probe_{name}_per_seed"] = per_seed
    diff, lo, hi = paired_bootstrap(
        task_named(sc.task).primary,
        truth,
        mean_scores["embeddings"],
        mean_scores["aggregates"],
        groups=groups,
    )
    result[f"{key}_seed_mean_diff"] = round(diff, 4)
    result[f"{key}_seed_mean_diff_ci95"] = [round(lo, 4), round(hi, 4)]
    result[f"{key}_rows"] = len(truth)
    result[f"{key}_fit_rows"] = {
        "recsys": int(len(truth) * 3 / 5),
        "weekly": len(ex.get("train", ())),
        "unseen_weeks": int(len(ex.get("val", ())) * 4 / 5),
    }[protocol]
    result["embedding_dim"] = int(inputs["test"]["embeddings"].shape[1])
    result[f"{sc.name}_metric"] = task_named(sc.task).primary_metric
    result[f"{key}_wall_s"] = round(time.perf_counter() - started, 1)
    print(key, {k: v for k, v in result.items() if k.startswith(key)}, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workspace", default="bench_workspace")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="probe seeds")
    parser.add_argument("--protocol", choices=PROTOCOLS, nargs="+", default=list(PROTOCOLS))
    parser.add_argument("--results", default=str(Path(__file__).parent / "results" / "embedding_probe.json"))
    args = parser.parse_args()
    cfg = load_config(Path(args.workspace) / "config.yaml")
    cache = EventCache(cache_dir(cfg))
    model, meta = load_checkpoint(ws.latest_foundation_dir(cfg))
    enc = FeatureEncoder.from_dict(meta.encoder)
    torch.set_num_threads(2)
    result: dict[str, object] = {
        "benchmark": "embedding_probe",
        "dataset": "The Complete Journey",
        "command": "python bench/bench_probe.py --protocol "
        + " ".join(args.protocol)
        + " --seeds "
        + " ".join(map(str, args.seeds)),
        "machine": f"{platform.machine()} {psutil.cpu_count()} cores",
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "foundation_version": meta.version,
        "probe_seeds": args.seeds,
        "recsys_score": f"mean of the {FOLDS} per-fold metrics of the cross-fitted probe",
    }
    for protocol in args.protocol:
        for sc in cfg.scenarios:
            run_protocol(protocol, cfg, model, enc, cache, sc, args.seeds, result)
    result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    out = Path(args.results)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
