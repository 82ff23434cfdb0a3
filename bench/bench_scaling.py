"""Benchmark: how each stage's time and memory grow with the data.

    .venv/bin/python bench/bench_scaling.py --events 1000000 5000000 10000000 50000000 [--device cuda]

For each size, a synthetic data set of that many events (100 events per household on average; generated once
under --root) goes through extract, cache build, foundation training, fine-tuning of the churn scenario
(its baselines included), the per-entity state build and scoring of every household. Each stage records its
wall time and its peak anonymous memory (the process's own pages, not the page cache of the memory-mapped
event store). The log-log slope of time and of memory against events is fitted over the sizes: 1 means linear,
0 means flat (foundation training is capped per epoch, so it should be near 0 in the examples and grow only
through longer histories). A slope above ~1.15, or memory that grows with the events where it should not, is a
finding. Only the generated data are reused between runs: the workspace's extracts, cache, checkpoints and
outputs are removed first, so every stage does its whole work. Records the machine load before and after.

Writes bench/results/scaling_<device>.json (flat keys) and bench/results/scaling_<device>.png (the curves).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import torch
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from bench_foundation import MemorySampler, dataset  # noqa: E402

from basemodel_pipeline import pipeline  # noqa: E402
from basemodel_pipeline.config import load_config  # noqa: E402

STAGES = ("extract", "cache", "pretrain", "finetune", "state", "score")


def run_size(events: int, root: Path, device: str) -> dict[str, float]:
    """Every stage on one data set: {stage.s, stage.anon_mb, ...} plus the work counts."""
    workdir = root / f"synthetic_{events}"
    config = dataset(workdir, events, max(1000, events // 100))
    raw = yaml.safe_load(config.read_text())
    raw["training_params"]["foundation"]["device"] = device
    raw["scenarios"] = [s for s in raw["scenarios"] if s["name"] == "churn"]
    config = workdir / "config_scaling.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = load_config(config)
    for stale in ("extracts", "cache", "staging", "checkpoints", "predictions", "embeddings", "state"):
        shutil.rmtree(workdir / stale, ignore_errors=True)  # every stage does its work: nothing reused
    sampler = MemorySampler()
    sampler.start()
    stage = sampler.timed
    stage("extract_s", lambda: pipeline.run_extract(cfg))
    built = stage("cache_s", lambda: pipeline.run_cache(cfg))
    pre = stage("pretrain_s", lambda: pipeline.run_pretrain(cfg))
    fine = stage("finetune_s", lambda: pipeline.run_finetune(cfg, "churn"))
    pred = stage("predict_s", lambda: pipeline.run_predict(cfg, "churn"))
    sampler.stop.set()
    anon = {k: round(v / 2**20, 1) for k, v in sampler.stage_anon.items()}
    return {
        "events": built["events"],
        "entities": built["entities"],
        "extract.s": sampler.times["extract_s"],
        "cache.s": sampler.times["cache_s"],
        "pretrain.s": sampler.times["pretrain_s"],
        "finetune.s": sampler.times["finetune_s"],
        "state.s": pred.get("state_s", 0.0),  # the state build (inside predict: the first scoring builds it)
        "score.s": pred["scoring_s"],
        "extract.anon_mb": anon.get("extract", 0.0),
        "cache.anon_mb": anon.get("cache", 0.0),
        "pretrain.anon_mb": anon.get("pretrain", 0.0),
        "finetune.anon_mb": anon.get("finetune", 0.0),
        "state.anon_mb": anon.get("predict", 0.0),  # state build and scoring share one sampled stage
        "score.anon_mb": anon.get("predict", 0.0),
        "pretrain.examples": pre["examples"],
        "pretrain.history_events": pre["work.history_events"],
        "pretrain.train_examples_per_s": pre["train_examples_per_s"],
        "finetune.featurise_examples": fine["featurise_examples"],
        "finetune.train_examples": fine["train_examples"],
        "state.events_read_per_s": pred.get("state_events_read_per_s", 0.0),
        "score.entities_per_s": pred["inference_entities_per_s"],
    }


def size_label(events: int) -> str:
    return f"{events / 1e6:g}M"


def slope(x: list[float], y: list[float]) -> float:
    """Least-squares slope of log y on log x (NaN with fewer than two positive points)."""
    pts = [(a, b) for a, b in zip(x, y, strict=True) if a > 0 and b > 0]
    if len(pts) < 2:
        return float("nan")
    lx, ly = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.polyfit(lx, ly, 1)[0])


def plot(result: dict, sizes: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    ev = [result[f"{n}.events"] for n in sizes]
    for s in STAGES:
        a.plot(
            ev, [result[f"{n}.{s}.s"] for n in sizes], "o-", label=f"{s} ({result[f'{s}.slope_time']:.2f})"
        )
        b.plot(
            ev,
            [result[f"{n}.{s}.anon_mb"] for n in sizes],
            "o-",
            label=f"{s} ({result[f'{s}.slope_anon']:.2f})",
        )
    for ax, title in ((a, "wall time, s (log-log slope)"), (b, "peak anonymous memory, MB (slope)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("events")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle(f"{result['machine']} ({result['device']})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--events", type=int, nargs="+", default=[1_000_000, 5_000_000, 10_000_000, 50_000_000]
    )
    parser.add_argument("--root", default="bench_workspace/scaling")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    result: dict = {
        "benchmark": "scaling",
        "dataset": "synthetic_scale, 100 events per household on average, seed 0",
        "device": args.device,
        "machine": f"{platform.machine()} {psutil.cpu_count()} cores, "
        + (torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu"),
        "command": "python bench/bench_scaling.py " + " ".join(sys.argv[1:]),
        "load_1min_before": round(psutil.getloadavg()[0], 2),
    }
    out = Path(__file__).parent / "results" / f"scaling_{args.device}.json"
    done: list[int] = []
    for n in args.events:
        label = size_label(n)
        t0 = time.perf_counter()
        for k, v in run_size(n, Path(args.root), args.device).items():
            result[f"{label}.{k}"] = v
        result[f"{label}.load_1min_after"] = round(psutil.getloadavg()[0], 2)
        print(f"{label}: {time.perf_counter() - t0:.0f} s", flush=True)
        done.append(n)
        labels = [size_label(m) for m in done]
        ev = [result[f"{m}.events"] for m in labels]
        for s in STAGES:
            result[f"{s}.slope_time"] = round(slope(ev, [result[f"{m}.{s}.s"] for m in labels]), 3)
            result[f"{s}.slope_anon"] = round(slope(ev, [result[f"{m}.{s}.anon_mb"] for m in labels]), 3)
        out.write_text(json.dumps(result, indent=2) + "\n")
    if len(done) >= 2:
        plot(result, [size_label(m) for m in done], out.with_suffix(".png"))
    rows = [f"| {s} | " + " | ".join(
        f"{result[f'{size_label(m)}.{s}.s']} s / {result[f'{size_label(m)}.{s}.anon_mb']:,.0f} MB" for m in done
    ) + f" | {result[f'{s}.slope_time']} | {result[f'{s}.slope_anon']} |" for s in STAGES]  # fmt: skip
    print("\n".join(rows))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
