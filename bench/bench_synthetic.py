"""Benchmark: the scalable synthetic generator (basemodel_pipeline.demo.synthetic_scale).

    .venv/bin/python bench/bench_synthetic.py [--events 50000000] [--customers N] [--out /tmp/bench_synth]

Generates the dataset (100 events per customer unless --customers is given), records wall time, events/s
and peak RSS, and writes bench/results/synthetic_generator.json (flat keys). The data is not committed.
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

from basemodel_pipeline.demo.synthetic_scale import generate_dataset

RESULT = Path(__file__).parent / "results" / "synthetic_generator.json"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=50_000_000)
    parser.add_argument("--customers", type=int, default=None, help="default: events / 100")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_synth"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--result", type=Path, default=RESULT)
    args = parser.parse_args()
    customers = args.customers or max(1, args.events // 100)

    def progress(done: int, total: int, events: int) -> None:
        print(f"\r{done}/{total} customers, {events:,} events", end="", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    result = generate_dataset(args.out, customers, args.events, seed=args.seed, progress=progress)
    wall = time.perf_counter() - t0
    print(file=sys.stderr)
    out = {
        "events": result["events"],
        "customers": result["customers"],
        "wall_s": round(wall, 2),
        "events_per_s": round(result["events"] / wall),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "bytes": result["bytes"],
        "files": result["files"],
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, {platform.processor() or 'cpu'}",
        "command": f"python bench/bench_synthetic.py --events {args.events} --customers {customers}",
    }
    args.result.parent.mkdir(parents=True, exist_ok=True)
    args.result.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
