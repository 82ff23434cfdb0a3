"""Embedding probe on The Complete Journey: the same fixed MLP on foundation embeddings vs on aggregates.

    .venv/bin/python bench/bench_probe.py [--workspace bench_workspace] [--seeds 0 1]

Needs a workspace where the foundation model has been trained (e.g. after bench/bench_demo.py or make demo).
The embeddings are what `basemodel embed` exports: `model.embed(features)` in float16. Each probe seed trains
the probe once per input; the result holds every seed and their mean. Writes bench/results/embedding_probe.json.
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
from basemodel_pipeline.cache.build import cache_dir
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import load_config
from basemodel_pipeline.evaluation.aggregates import aggregate_features
from basemodel_pipeline.evaluation.metrics import primary_metric
from basemodel_pipeline.evaluation.probe import probe_scores
from basemodel_pipeline.features.sketch import FeatureEncoder
from basemodel_pipeline.model.checkpoint import load_checkpoint
from basemodel_pipeline.scenarios.targets import build_examples, choose_classes
from basemodel_pipeline.training.splits import scenario_split_times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workspace", default="bench_workspace")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="probe seeds")
    parser.add_argument("--results", default=str(Path(__file__).parent / "results" / "embedding_probe.json"))
    args = parser.parse_args()
    cfg = load_config(Path(args.workspace) / "config.yaml")
    cache = EventCache(cache_dir(cfg))
    model, meta = load_checkpoint(ws.latest_foundation_dir(cfg))
    enc = FeatureEncoder.from_dict(meta["encoder"])
    torch.set_num_threads(2)
    result: dict[str, object] = {
        "benchmark": "embedding_probe",
        "dataset": "The Complete Journey",
        "command": "python bench/bench_probe.py --seeds " + " ".join(map(str, args.seeds)),
        "machine": f"{platform.machine()} {psutil.cpu_count()} cores",
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "foundation_version": meta["version"],
        "probe_seeds": args.seeds,
    }
    for sc in cfg.scenarios:
        started = time.perf_counter()
        times = scenario_split_times(cfg.data_params, sc.target.horizon_days, sc.name)
        spec = choose_classes(cache, sc, times["train"])
        ex = {k: build_examples(cache, sc, spec, v) for k, v in times.items()}
        with torch.no_grad():
            emb = {
                k: model.embed(torch.from_numpy(enc.history(cache, v.entity, v.time)))
                .numpy()
                .astype(np.float16)
                for k, v in ex.items()
            }
        result["embedding_dim"] = int(emb["train"].shape[1])
        agg = {k: aggregate_features(cache, v.entity, v.time)[0] for k, v in ex.items()}
        for name, feats in (("embeddings", emb), ("aggregates", agg)):
            per_seed = []
            for seed in args.seeds:
                scores = probe_scores(
                    feats["train"],
                    ex["train"].labels,
                    feats["val"],
                    ex["val"].labels,
                    feats["test"],
                    sc.task,
                    seed,
                )
                per_seed.append(round(primary_metric(sc.task, ex["test"].labels, scores), 4))
            result[f"{sc.name}_probe_{name}"] = round(float(np.mean(per_seed)), 4)
            result[f"{sc.name}_probe_{name}_per_seed"] = per_seed
        result[f"{sc.name}_metric"] = "auroc" if sc.task == "binary" else "macro_auroc"
        result[f"{sc.name}_wall_s"] = round(time.perf_counter() - started, 1)
        print(sc.name, {k: v for k, v in result.items() if k.startswith(sc.name)}, flush=True)
    result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    out = Path(args.results)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
