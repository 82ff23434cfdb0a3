"""Benchmark: the six Complete Journey scenarios (demo.FULL_CONFIG), ours vs LightGBM-on-aggregates vs popularity.

    .venv/bin/python bench/bench_scenarios.py [--workspace bench_workspace/scenarios] [--reuse-foundation]

Runs extract, cache and foundation pretraining (or reuses the workspace's foundation with
--reuse-foundation), then fine-tunes all six scenarios with one featurisation pass (finetune_many), each with
its own early stopping, and evaluates every model and baseline on the test window (2017-11-15). Writes
bench/results/scenarios_completejourney.json and prints a Markdown table. bench/bench_quality.py measures the
same scenarios on three seeds and several test weeks (bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
from pathlib import Path

from basemodel_pipeline import pipeline
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.config import load_config
from basemodel_pipeline.demo.datasets import prepare_demo
from basemodel_pipeline.progress import NullProgress
from basemodel_pipeline.scenarios.finetune import finetune_many

COMMAND = "python bench/bench_scenarios.py"


def _fmt(v: object) -> str:
    return f"{v:.4f}" if isinstance(v, float) else "—" if v is None else str(v)


def _collected(cfg, name: str) -> dict:
    """What finetune_many returned, rebuilt from the latest checkpoint of a scenario (--collect)."""
    path = ws.latest_scenario_dir(cfg, name)
    m = json.loads((path / "metrics.json").read_text())
    return {
        "path": str(path),
        "report_path": str(path / "report.html"),
        "featurise_s": m["timing_s"]["featurise_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workspace", default="bench_workspace/scenarios")
    parser.add_argument("--reuse-foundation", action="store_true")
    parser.add_argument(
        "--only", nargs="*", default=None, help="rerun these scenarios; keep the others' rows of the last run"
    )
    parser.add_argument(
        "--results", default=str(Path(__file__).parent / "results" / "scenarios_completejourney.json")
    )
    parser.add_argument(
        "--collect", action="store_true", help="no training: tabulate the latest checkpoints' metrics.json"
    )
    args = parser.parse_args()
    cfg = load_config(prepare_demo(args.workspace, full=True))
    started = time.perf_counter()
    stages: dict[str, float] = {}
    for name, fn in (
        () if args.collect else (("extract", pipeline.run_extract), ("cache", pipeline.run_cache))
    ):
        t0 = time.perf_counter()
        fn(cfg)
        stages[f"{name}_s"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    if not args.collect and not (args.reuse_foundation and (ws.foundation_root(cfg) / "LATEST").exists()):
        pipeline.run_pretrain(cfg)
    stages["pretrain_s"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    chosen = [sc for sc in cfg.scenarios if args.only is None or sc.name in args.only]
    if args.collect:
        results = {sc.name: _collected(cfg, sc.name) for sc in chosen}
    else:
        results = finetune_many(cfg, chosen, NullProgress())
    stages["finetune_all_s"] = round(time.perf_counter() - t0, 1)
    path = Path(args.results)
    previous = json.loads(path.read_text()) if args.only is not None and path.exists() else {}
    rows = dict(previous.get("scenarios", {}))
    for sc in chosen:
        r = results[sc.name]
        m = json.loads((Path(r["path"]) / "metrics.json").read_text())
        t0 = time.perf_counter()
        pred = {} if args.collect else pipeline.run_predict(cfg, sc.name)
        rows[sc.name] = {
            "task": sc.task,
            "metric": m["metric"],
            "outputs": m["classes"],
            "ours": m["test"]["model"],
            "lightgbm_aggregates": m["test"].get("lightgbm_aggregates"),
            "popularity": m["test"]["popularity"],
            "repeat_purchases": m["test"].get("repeat_purchases"),
            "test_metrics": m["test_metrics"],
            "examples": m["examples"],
            "epochs": len(m["history"]),
            "timing_s": m["timing_s"],
            "predict_s": round(time.perf_counter() - t0, 1),
            "predict_entities_per_s": pred.get("inference_entities_per_s"),
            "report": r["report_path"],
            "run": time.strftime("%Y-%m-%d %H:%M"),
            "featurise_s_shared": r["featurise_s"],
        }
        print(
            sc.name,
            json.dumps({k: v for k, v in rows[sc.name].items() if k != "test_metrics"}),
            file=sys.stderr,
        )
    out = {
        "benchmark": "scenarios_completejourney",
        "date": time.strftime("%Y-%m-%d"),
        "command": COMMAND,
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} CPU cores (shared with other jobs)",
        "stages_s": stages,
        "total_s": round(time.perf_counter() - started, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "scenarios": rows,
    }
    if args.collect:  # the training run's stage times are in each row's timing_s
        out["command"] = f"{COMMAND} (training run; this file tabulated with --collect after it)"
        out.update(stages_s=None, total_s=None, peak_rss_mb=None)
    if previous:
        out["earlier_runs"] = [
            *previous.get("earlier_runs", []),
            {k: v for k, v in previous.items() if k != "scenarios"},
        ]
        out["command"] = (
            f"{COMMAND} --reuse-foundation --only {' '.join(args.only or [])} (other rows: earlier run)"
        )
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(
        "| scenario | task (outputs) | metric | ours | LightGBM on aggregates | popularity | ours train s | baselines s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in [sc.name for sc in cfg.scenarios if sc.name in rows]:
        r = rows[name]
        lgb = r["lightgbm_aggregates"] if r["task"] != "recommendation" else r["repeat_purchases"]
        lgb_cell = _fmt(lgb) + (" (repeat purchases)" if r["task"] == "recommendation" else "")
        t = r["timing_s"]
        print(
            f"| {name} | {r['task']} ({r['outputs']}) | {r['metric']} | {_fmt(r['ours'])} | {lgb_cell} | "
            f"{_fmt(r['popularity'])} | {t['train_s']} | {t['baselines_s']} |"
        )
    print(
        f"\nCommand: `{COMMAND}`; stages {stages}; total {out['total_s']} s; peak RSS {out['peak_rss_mb']} MB"
    )


if __name__ == "__main__":
    main()
