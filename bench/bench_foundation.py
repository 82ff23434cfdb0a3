"""Benchmark: foundation training at scale on the synthetic generator, CPU or GPU.

    .venv/bin/python bench/bench_foundation.py --events 50000000 --customers 500000 [--device cuda]

Generates (or reuses) the synthetic dataset under --workdir, extracts it, builds the cache, trains the
foundation with the default config (all epochs, featurisation included), then times a full-history
featurisation pass and the embedding export. Writes bench/results/foundation_synthetic_<events>_<device>.json
(flat keys; `make results` renders it in bench/RESULTS.md) and prints a Markdown row. Peak memory is sampled every 0.2 s: peak_rss_mb
(resident, including the pages of the memory-mapped cache) and peak_anon_mb (anonymous memory: what the
process itself holds, which must not grow with the number of events).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import torch
import yaml

from basemodel_pipeline import pipeline
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import load_config
from basemodel_pipeline.config.params import FoundationParams
from basemodel_pipeline.features.sketch import FeatureEncoder
from basemodel_pipeline.model.checkpoint import load_checkpoint
from basemodel_pipeline.runtime import native_bf16, resolve_device
from basemodel_pipeline.workspace import cache_dir

REFERENCE_INFERENCE_ENTITIES_PER_S = 2_718  # BaseModel: per GPU


def commit() -> str:
    """The checkout's short commit, recorded in every results file."""
    git = ["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"]
    return subprocess.run(git, capture_output=True, text=True, check=False).stdout.strip()


def cpu_bf16() -> str:
    """Whether this CPU runs bf16 natively: it decides what `precision: auto` does, recorded with the machine."""
    return "native bf16" if native_bf16(torch.device("cpu")) else "no native bf16"


class MemorySampler(threading.Thread):
    """Peak resident and anonymous memory of this process and its children, read every 0.2 s from statm (cheap:
    reading smaps takes the process's memory-map lock, which its page faults wait for)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_rss = self.peak_anon = 0
        self.stage = "start"
        self.stage_anon: dict[str, int] = {}  # peak anonymous memory per stage
        self.stop = threading.Event()
        self.times: dict[str, float] = {}  # seconds per timed stage

    def timed(self, name: str, fn):  # noqa: ANN001, ANN201
        """Run fn() as stage `name` (memory attributed to it), record and print its seconds."""
        self.stage = name.removesuffix("_s")
        t0 = time.perf_counter()
        result = fn()
        self.times[name] = round(time.perf_counter() - t0, 2)
        print(
            f"{name}: {self.times[name]} s {json.dumps(result, default=str)[:300]}",
            file=sys.stderr,
            flush=True,
        )
        return result

    def run(self) -> None:
        me = psutil.Process()
        while not self.stop.wait(0.2):
            rss = anon = 0
            for p in [me, *me.children(recursive=True)]:
                try:
                    info = p.memory_info()  # /proc/PID/statm: smaps (memory_full_info) would stall the run
                except psutil.Error:
                    continue
                rss += info.rss
                anon += info.rss - info.shared  # private pages: heap, not the page cache of mapped files
            self.peak_rss, self.peak_anon = max(self.peak_rss, rss), max(self.peak_anon, anon)
            self.stage_anon[self.stage] = max(self.stage_anon.get(self.stage, 0), anon)


def dataset(workdir: Path, events: int, customers: int) -> Path:
    config = workdir / "config.yaml"
    if not config.exists():
        subprocess.run(
            [sys.executable, "-m", "basemodel_pipeline.demo.synthetic_scale", "--out", str(workdir),
             "--customers", str(customers), "--events", str(events)],
            check=True,
        )  # fmt: skip
    return config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=50_000_000)
    parser.add_argument("--customers", type=int, default=500_000)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--workdir", default=None, help="default: bench_workspace/synthetic_<events>")
    parser.add_argument("--epochs", type=int, default=None, help="override the default epochs")
    parser.add_argument(
        "--examples-scale", type=int, default=1, help="max_examples_per_epoch x this (budget curve)"
    )
    args = parser.parse_args()
    workdir = Path(args.workdir or f"bench_workspace/synthetic_{args.events}")
    config = dataset(workdir, args.events, args.customers)
    raw = yaml.safe_load(config.read_text())
    raw["training_params"]["foundation"]["device"] = args.device
    if args.epochs:
        raw["training_params"]["foundation"]["epochs"] = args.epochs
    raw["training_params"]["foundation"].pop("max_examples_per_epoch", None)
    if args.examples_scale != 1:
        default = FoundationParams.model_fields["max_examples_per_epoch"].default
        raw["training_params"]["foundation"]["max_examples_per_epoch"] = default * args.examples_scale
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = load_config(config)
    sampler = MemorySampler()
    sampler.start()
    times, stage = sampler.times, sampler.timed

    stage("extract_s", lambda: pipeline.run_extract(cfg))
    built = stage("cache_s", lambda: pipeline.run_cache(cfg))
    pre = stage("pretrain_s", lambda: pipeline.run_pretrain(cfg))
    cache = EventCache(cache_dir(cfg))
    model, meta = load_checkpoint(ws.latest_foundation_dir(cfg))
    enc = FeatureEncoder.from_dict(meta.encoder)
    device = resolve_device(args.device).type
    entities = np.arange(min(cache.n_entities, 100_000))
    t_end = int(max(s.ts[-1] for s in cache.sources.values())) + 1
    src_rows = sum(int(s.offsets[len(entities)]) for s in cache.sources.values())
    sampler.stage = "featurise"
    t0 = time.perf_counter()
    enc.history(cache, entities, np.full(len(entities), t_end), device=device)
    featurise_s = time.perf_counter() - t0
    emb = stage("embed_s", lambda: pipeline.run_embed(cfg))
    sampler.stop.set()
    events = built["events"]
    result = {
        "benchmark": "foundation_synthetic",
        "dataset": f"synthetic_scale {events:,} events, {built['entities']:,} entities",
        "events": events,
        "entities": built["entities"],
        "device": device,
        "machine": f"{platform.machine()} {psutil.cpu_count()} cores, "
        + (torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"),
        "command": "python bench/bench_foundation.py " + " ".join(sys.argv[1:]),
        **times,
        "cache_events_per_s": round(events / max(times["cache_s"], 1e-9), 1),
        # the work done per second of the stage (training/work.py), featurisation included
        "train_examples_per_s": pre["train_examples_per_s"],
        "train_history_events_per_s": pre["train_history_events_per_s"],
        "train_events_scanned_per_s": pre["train_events_scanned_per_s"],
        "entities_covered_fraction": pre["work.entities_covered_fraction"],
        "pairs_covered_fraction": pre["work.pairs_covered_fraction"],
        "train_history_events": pre["work.history_events"],
        # "time to a foundation model for N events": not a throughput (the examples are capped per epoch)
        "time_to_foundation_s": pre["time_to_foundation_s"],
        "foundation_epochs": pre["epochs"],
        "foundation_examples": pre["examples"],
        "max_examples_per_epoch": cfg.training_params.foundation.max_examples_per_epoch,
        "foundation_featurise_s": pre["featurise_s"],
        "foundation_val_loss": pre["val_loss"],
        "input_dim": pre["input_dim"],
        **{k: v for k, v in pre.items() if k.startswith("sizes.")},
        "featurise_events_per_s": round(src_rows / featurise_s, 1),
        "inference_entities_per_s": emb["inference_entities_per_s"],
        "peak_rss_mb": round(sampler.peak_rss / 2**20, 1),
        "peak_anon_mb": round(sampler.peak_anon / 2**20, 1),
        **{f"peak_anon_mb_{k}": round(v / 2**20, 1) for k, v in sampler.stage_anon.items()},
    }
    scale = f"_x{args.examples_scale}" if args.examples_scale != 1 else ""
    out = (
        Path(__file__).parent
        / "results"
        / f"foundation_synthetic_{events // 1_000_000}M_{device}{scale}.json"
    )
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(
        f"| {time.strftime('%Y-%m-%d')} | {result['machine']} | {events:,} | {pre['epochs']} | "
        f"{times['pretrain_s']} | {pre['examples']:,} | {pre['train_examples_per_s']:,.0f} | "
        f"{pre['train_history_events_per_s']:,.0f} | {result['entities_covered_fraction']} | "
        f"{result['featurise_events_per_s']:,.0f} | "
        f"{result['inference_entities_per_s']} | {result['peak_rss_mb']:,.0f} / {result['peak_anon_mb']:,.0f} |"
    )


if __name__ == "__main__":
    main()
