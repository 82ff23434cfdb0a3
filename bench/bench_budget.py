"""Benchmark: downstream quality against the foundation's training budget.

    .venv/bin/python bench/bench_budget.py --dataset completejourney --scales 1 4 16
    .venv/bin/python bench/bench_budget.py --workdir DIR --scales 1 4 16 [--device cuda] [--deadline-s 420]

DIR holds a synthetic data set (python -m basemodel_pipeline.demo.synthetic_scale --out DIR ...; bench_foundation.py
makes one). For each scale s the foundation is trained with s x the default budget (same seed, same cache):
--by examples (max_examples_per_epoch x s, the default; it binds on large data), split_points (split points per
entity x s, for small data where the cap does not bind) or epochs and the same scenarios are fine-tuned on it. Recorded per scale: foundation
wall time, peak anonymous memory, the work done (examples, history events featurised, coverage: see
basemodel_pipeline/training/work.py), and per scenario the test metric of the network alone ("neural") and of
the published model, each with a 95% bootstrap interval over the test rows, plus the paired difference to
scale 1 (same test rows). The scenarios' baselines are fitted and staged once (as the Dagster
`scenario_baselines` step does) and reused at every scale (same cache and encoder), so each row also shows
LightGBM on aggregates. Results are written after every scale, so a run
stopped by --deadline-s (a scale whose extrapolated time does not fit is skipped) still leaves its rows.

Writes bench/results/budget_<dataset>[_<device>].json (flat keys; `make results` renders it in
bench/RESULTS.md) and prints Markdown rows.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import torch
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from bench_foundation import MemorySampler  # noqa: E402
from bench_quality import Log, metric_of, paired_interval  # noqa: E402

from basemodel_pipeline.config import load_config  # noqa: E402
from basemodel_pipeline.config.params import FoundationParams  # noqa: E402
from basemodel_pipeline.demo.datasets import prepare_demo  # noqa: E402
from basemodel_pipeline.pipeline import run_baselines, run_cache, run_extract, run_pretrain  # noqa: E402
from basemodel_pipeline.runtime import resolve_device  # noqa: E402
from basemodel_pipeline.scenarios.finetune import finetune_many  # noqa: E402
from basemodel_pipeline.tasks import task_named  # noqa: E402

DEFAULT_CAP = FoundationParams.model_fields["max_examples_per_epoch"].default
SPLIT_POINTS = FoundationParams.model_fields["split_points_per_entity"].default
EPOCHS = FoundationParams.model_fields["epochs"].default
ROUNDS = 300


def interval(task: str, truth, out, seed: int = 0) -> tuple[float, float, float]:
    """(metric, 2.5%, 97.5%) over test rows resampled with replacement."""
    rng = np.random.default_rng(seed)
    n = len(out)
    draws = []
    for _ in range(ROUNDS):
        idx = rng.integers(0, n, n)
        try:
            draws.append(float(task_named(task).primary(np.asarray(truth)[idx], np.asarray(out)[idx])))
        except ValueError:  # a resample with one class
            continue
    lo, hi = np.nanpercentile(draws, [2.5, 97.5])
    return metric_of(task, truth, out), float(lo), float(hi)


def base_config(args: argparse.Namespace) -> tuple[Path, str]:
    if args.dataset:
        workdir = Path(args.workdir or f"bench_workspace/budget_{args.dataset}")
        return prepare_demo(workdir, full=False, dataset=args.dataset), args.dataset
    if not args.workdir or not (Path(args.workdir) / "config.yaml").exists():
        raise SystemExit("--workdir DIR with DIR/config.yaml (a synthetic data set), or --dataset NAME")
    return Path(args.workdir) / "config.yaml", Path(args.workdir).name


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", default=None, help="a demo data set (completejourney, ...)")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--scenarios", default="churn", help="comma-separated scenario names")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument(
        "--by",
        default="examples",
        choices=["examples", "split_points", "epochs"],
        help="examples: max_examples_per_epoch x s (binds on large data); split_points: split points per "
        "entity x s (small data, where the cap does not bind); epochs: epochs x s",
    )
    parser.add_argument("--deadline-s", type=float, default=0, help="skip scales that would end after it")
    parser.add_argument("--name", default=None, help="results name (default: the data set's)")
    args = parser.parse_args()
    started = time.perf_counter()
    config, name = base_config(args)
    name = args.name or name
    names = args.scenarios.split(",")
    device = resolve_device(args.device).type
    result: dict = {
        "benchmark": "budget",
        "dataset": name,
        "device": device,
        "machine": f"{platform.machine()} {psutil.cpu_count()} cores, "
        + (torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"),
        "load_1min_at_start": round(psutil.getloadavg()[0], 2),
        "command": "python bench/bench_budget.py " + " ".join(sys.argv[1:]),
        "default_max_examples_per_epoch": DEFAULT_CAP,
        "budget_by": args.by,
    }
    out_path = Path(__file__).parent / "results" / f"budget_{name}{'_cuda' if device == 'cuda' else ''}.json"
    # scales measured before and not run now keep their keys: a later point joins an earlier curve
    earlier = json.loads(out_path.read_text()) if out_path.exists() else {}
    ran = tuple(f"x{s}." for s in args.scales)
    result = {
        **{k: v for k, v in earlier.items() if k.startswith("x") and not k.startswith(ran)},
        **result,
    }
    runs: dict[int, dict] = {}
    rows = []
    for scale in args.scales:
        elapsed = time.perf_counter() - started
        if args.deadline_s and runs:
            first = next(iter(runs))  # pretraining grows with the budget, fine-tuning does not
            pretrain_s, rest_s = runs[first]["pretrain_s"], runs[first]["total_s"] - runs[first]["pretrain_s"]
            if elapsed + pretrain_s * scale / first + rest_s > args.deadline_s:
                print(f"scale {scale}: skipped (would end after --deadline-s {args.deadline_s})", flush=True)
                result[f"x{scale}.skipped"] = True
                continue
        raw = yaml.safe_load(config.read_text())
        fp = raw.setdefault("training_params", {}).setdefault("foundation", {})
        fp["max_examples_per_epoch"] = DEFAULT_CAP * (1 if args.by == "epochs" else scale)
        if args.by == "split_points":
            fp["split_points_per_entity"] = SPLIT_POINTS * scale
        if args.by == "epochs":
            fp["epochs"] = EPOCHS * scale
        fp["device"] = args.device
        raw["scenarios"] = [
            {**s, "candidates": ["neural"]} for s in raw["scenarios"] if s["name"] in names
        ]  # the network and the baselines
        scaled = config.parent / f"config_budget_x{scale}.yaml"
        scaled.write_text(yaml.safe_dump(raw, sort_keys=False))
        cfg = load_config(scaled)
        run_extract(cfg)
        run_cache(cfg)
        sampler = MemorySampler()
        sampler.start()
        t0 = time.perf_counter()
        pre = sampler.timed("pretrain_s", lambda cfg=cfg: run_pretrain(cfg, Log()))
        sampler.stage = "finetune"
        for sc in cfg.scenarios:  # staged once (the same at every scale: they do not use the foundation)
            run_baselines(cfg, sc.name, Log())
        fine = finetune_many(cfg, list(cfg.scenarios), Log(), keep_outputs=True)
        total_s = time.perf_counter() - t0
        sampler.stop.set()
        runs[scale] = {"total_s": total_s, "pretrain_s": sampler.times["pretrain_s"], "fine": fine}
        k = f"x{scale}"
        result.update(
            {
                f"{k}.load_1min_at_end": round(psutil.getloadavg()[0], 2),
                f"{k}.max_examples_per_epoch": fp["max_examples_per_epoch"],
                f"{k}.split_points_per_entity": fp.get("split_points_per_entity", SPLIT_POINTS),
                f"{k}.epochs_max": fp.get("epochs", EPOCHS),
                f"{k}.pretrain_s": sampler.times["pretrain_s"],
                f"{k}.epochs": pre["epochs"],
                f"{k}.val_loss": round(pre["val_loss"], 5),
                f"{k}.examples": pre["examples"],
                f"{k}.train_examples_per_s": pre["train_examples_per_s"],
                f"{k}.train_history_events_per_s": pre["train_history_events_per_s"],
                f"{k}.history_events": pre["work.history_events"],
                f"{k}.entities_covered_fraction": pre["work.entities_covered_fraction"],
                f"{k}.pairs_covered_fraction": pre["work.pairs_covered_fraction"],
                f"{k}.peak_anon_mb_pretrain": round(sampler.stage_anon.get("pretrain", 0) / 2**20, 1),
                f"{k}.peak_anon_mb": round(sampler.peak_anon / 2**20, 1),
            }
        )
        for sc_name, r in fine.items():
            task = cfg.scenario(sc_name).task
            truth, outs = r["test_truth"], r["test_outputs"]
            cells = []
            for cand in ("neural", "model", "lightgbm_aggregates"):
                if cand not in outs:
                    continue
                m, lo, hi = interval(task, truth, outs[cand])
                result[f"{k}.{sc_name}.{cand}"] = round(m, 4)
                result[f"{k}.{sc_name}.{cand}_ci95"] = f"{lo:.4f}..{hi:.4f}"
                cells.append(f"{m:.4f} [{lo:.4f}, {hi:.4f}]")
            base = min(runs)
            if scale != base:  # same test rows: the paired difference to the smallest budget
                d, dlo, dhi = paired_interval(
                    task, truth, [outs["neural"]], [runs[base]["fine"][sc_name]["test_outputs"]["neural"]]
                )
                result[f"{k}.{sc_name}.neural_minus_x{base}"] = round(d, 4)
                result[f"{k}.{sc_name}.neural_minus_x{base}_ci95"] = f"{dlo:.4f}..{dhi:.4f}"
                cells.append(f"{d:+.4f} [{dlo:+.4f}, {dhi:+.4f}]")
            else:
                cells.append("-")
            rows.append(
                f"| {name} | {device} | x{scale} ({args.by}) | {pre['examples']:,} | "
                f"{result[f'{k}.pairs_covered_fraction']} | {result[f'{k}.pretrain_s']} | "
                f"{result[f'{k}.peak_anon_mb_pretrain']:,.0f} | {sc_name} | " + " | ".join(cells) + " |"
            )
        result["wall_s"] = round(time.perf_counter() - started, 1)
        out_path.parent.mkdir(exist_ok=True)
        out_path.write_text(json.dumps(result, indent=2) + "\n")
        print("\n".join(r for r in rows if f"| x{scale} (" in r), flush=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
