"""Benchmark: event cache build and incremental append at scale, CPU.

    .venv/bin/python bench/bench_cache.py --events 50000000 --customers 500000 --workdir /work/scratch/cache/syn50
    .venv/bin/python bench/bench_cache.py --events 10000000 --customers 100000 --workdir /work/scratch/cache/syn10

Generates (or reuses) the synthetic dataset in --workdir (basemodel_pipeline.demo.synthetic_scale) and its extracts,
then in a scratch workspace beside it (the extracts hard-linked, so the dataset is never modified):
1. builds the cache from scratch: cache_events_per_s, peak_rss_mb / peak_anon_mb of the build;
2. writes one new day (the last day shifted by one day; --append-events resizes it) and appends it:
   append_s, append_events, with peak memory;
3. opens the cache once (the first reader merges base + append into the view): view_merge_s.
Writes bench/results/cache_<N>M.json (flat keys; `make results` renders it in bench/RESULTS.md) and prints a
Markdown row. The machine is
shared: os.getloadavg() is recorded before and after.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))
from bench_foundation import MemorySampler, dataset  # noqa: E402

from basemodel_pipeline import pipeline  # noqa: E402
from basemodel_pipeline import workspace as ws  # noqa: E402
from basemodel_pipeline.cache.store import EventCache  # noqa: E402
from basemodel_pipeline.config import load_config  # noqa: E402


def scratch_workspace(data: Path, config: Path) -> Path:
    """<data>/../<name>_cachebench/ with config.yaml (data paths absolute) and the extracts hard-linked."""
    work = data.parent / f"{data.name}_cachebench"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    subprocess.run(["cp", "-al", str(data / "extracts"), str(work / "extracts")], check=True)
    (work / "data").symlink_to(data / "data")
    shutil.copy(config, work / "config.yaml")
    return work / "config.yaml"


def write_new_day(extracts: Path, events: int | None) -> tuple[Path, int]:
    """Copy of the last day file shifted by one day (rows repeated or cut to `events`)."""
    last = sorted(extracts.glob("*.parquet"))[-1]
    table = pq.read_table(last)
    if events:
        reps = -(-events // table.num_rows)
        table = pa.concat_tables([table] * reps).slice(0, events)
    col = table.schema.names.index("transaction_timestamp")
    shifted = pc.add(table.column(col), pa.scalar(dt.timedelta(days=1)))
    table = table.set_column(col, "transaction_timestamp", shifted)
    out = extracts / f"{(dt.date.fromisoformat(last.stem) + dt.timedelta(days=1)).isoformat()}.parquet"
    pq.write_table(table, out)
    return out, table.num_rows


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process: the work done, whatever else loads the machine."""
    t = psutil.Process().cpu_times()
    return t.user + t.system


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=50_000_000)
    parser.add_argument("--customers", type=int, default=500_000)
    parser.add_argument(
        "--workdir", default=None, help="dataset directory (default: bench_workspace/synthetic_<events>)"
    )
    parser.add_argument(
        "--append-events", type=int, default=None, help="size of the appended day (default: as the last day)"
    )
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    data = Path(args.workdir or f"bench_workspace/synthetic_{args.events}").resolve()
    config = dataset(data, args.events, args.customers)
    if not (data / "extracts").exists():
        pipeline.run_extract(load_config(config))
    cfg = load_config(scratch_workspace(data, config))
    load_before = os.getloadavg()
    sampler = MemorySampler()
    sampler.start()

    def stage(name: str, fn):
        sampler.stage = name
        sampler.peak_rss = sampler.peak_anon = 0
        t0, cpu0 = time.perf_counter(), _cpu_s()
        result = fn()
        wall, cpu = round(time.perf_counter() - t0, 2), round(_cpu_s() - cpu0, 2)
        time.sleep(0.3)  # one more sample
        mem = {
            "s": wall,
            "cpu_s": cpu,
            "peak_rss_mb": round(sampler.peak_rss / 2**20, 1),
            "peak_anon_mb": round(sampler.peak_anon / 2**20, 1),
        }
        print(f"{name}: {mem}", file=sys.stderr, flush=True)
        return result, mem

    built, build_mem = stage("build", lambda: pipeline.run_cache(cfg))
    new_day, day_events = write_new_day(ws.extracts_dir(cfg, "transactions"), args.append_events)
    appended, append_mem = stage("append", lambda: pipeline.run_cache(cfg))
    assert appended.get("appended"), appended
    cache, view_mem = stage("view", lambda: EventCache(appended["path"]))
    reopen_t0 = time.perf_counter()
    EventCache(appended["path"])
    reopen_s = round(time.perf_counter() - reopen_t0, 3)
    sampler.stop.set()
    events = built["events"]
    result = {
        "benchmark": "cache",
        "dataset": f"synthetic_scale {events:,} events, {built['entities']:,} entities, 365 days",
        "machine": f"{platform.machine()} {psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB",
        "command": "python bench/bench_cache.py " + " ".join(sys.argv[1:]),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "events": events,
        "entities": built["entities"],
        "shards": built["shards"],
        "cache_bytes": built["bytes"],
        "cache_s": build_mem["s"],
        "cache_events_per_s": round(events / build_mem["s"], 1),
        "cache_cpu_s": build_mem["cpu_s"],
        "cache_events_per_cpu_s": round(events / build_mem["cpu_s"], 1),
        "peak_rss_mb": build_mem["peak_rss_mb"],
        "peak_anon_mb": build_mem["peak_anon_mb"],
        "append_events": appended["appended"]["events"],
        "append_new_entities": appended["appended"]["new_entities"],
        "append_s": append_mem["s"],
        "append_events_per_s": round(appended["appended"]["events"] / append_mem["s"], 1),
        "append_cpu_s": append_mem["cpu_s"],
        "append_peak_rss_mb": append_mem["peak_rss_mb"],
        "append_peak_anon_mb": append_mem["peak_anon_mb"],
        "view_merge_s": view_mem["s"],
        "view_merge_cpu_s": view_mem["cpu_s"],
        "view_peak_rss_mb": view_mem["peak_rss_mb"],
        "view_peak_anon_mb": view_mem["peak_anon_mb"],
        "reopen_s": reopen_s,
        "events_after_append": cache.source("transactions").n_events,
    }
    assert result["events_after_append"] == events + day_events
    tag = f"{round(events / 1e6)}M" + (f"_append{args.append_events // 1000}k" if args.append_events else "")
    out = Path(__file__).parent / "results" / f"cache_{tag}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(
        f"| {time.strftime('%Y-%m-%d')} | {result['machine']} (load {result['loadavg_before'][0]}) | {events:,} | "
        f"{result['cache_s']} | {result['cache_events_per_s']:,.0f} | {result['peak_rss_mb']:,.0f} / "
        f"{result['peak_anon_mb']:,.0f} | {result['append_events']:,} | {result['append_s']} | {result['view_merge_s']} |"
    )
    shutil.rmtree(Path(cfg.workspace), ignore_errors=True)


if __name__ == "__main__":
    main()
