"""Benchmark: what sets the peak memory of the extract and of the state build + scoring.

    .venv/bin/python bench/bench_stage_memory.py extract --workdir DIR --limits 2GB 1GB
    .venv/bin/python bench/bench_stage_memory.py predict --workdir DIR --scenario churn
    .venv/bin/python bench/bench_stage_memory.py finetune --workdir DIR --scenario churn [--key finetune]

The scaling curves (bench_scaling.py) run every stage in one process, one after the other, so a stage's peak
can include what an earlier stage left behind, and the state build and scoring share one sampled stage. Here
each measurement is its own fresh process on an existing workspace (DIR from synthetic_scale, with a
config.yaml; `predict` needs a fine-tuned scenario there), sampled by MemorySampler (anonymous memory: the
process's own pages, not the page cache of memory-mapped files):

- extract: the whole extract once per DuckDB memory limit (`cache.duckdb_memory_limit`), so one sees whether
  the peak follows the limit or the data;
- predict: the per-entity state is removed first, then built (one sampled stage) and every entity scored
  (another), in a process that has done nothing else;
- finetune: the scenario fine-tuned (featurisation, network, candidates, selection, publishing) on the
  workspace's foundation; `--key` names the result keys, so that two builds measured on the same workspace
  sit side by side (the measuring process imports basemodel_pipeline from PYTHONPATH when it is set: a
  worktree of an earlier commit measures that commit).

Writes bench/results/stage_memory_<name>.json (flat keys) and prints one line per measurement.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).parent))

CHILD = """
import json, shutil, sys, time
from pathlib import Path
sys.path.insert(0, {bench!r})
from bench_foundation import MemorySampler
from basemodel_pipeline import pipeline
from basemodel_pipeline.config import load_config

cfg = load_config({config!r})
sampler = MemorySampler()
sampler.start()
if {what!r} == "extract":
    shutil.rmtree(Path(cfg.workspace) / "extracts", ignore_errors=True)
    out = sampler.timed("extract_s", lambda: pipeline.run_extract(cfg))
elif {what!r} == "finetune":
    out = sampler.timed("finetune_s", lambda: pipeline.run_finetune(cfg, {scenario!r}))
    out["rows"] = out.get("train_examples")
else:
    from basemodel_pipeline import workspace as ws
    from basemodel_pipeline.cache.store import EventCache
    from basemodel_pipeline.inference.state import default_as_of, ensure_state, state_dir

    cache = EventCache(ws.cache_dir(cfg))
    meta = json.loads((ws.latest_scenario_dir(cfg, {scenario!r}) / "model.json").read_text())
    shutil.rmtree(state_dir(Path(cfg.workspace), meta["encoder"]), ignore_errors=True)
    sampler.timed("state_s", lambda: ensure_state(Path(cfg.workspace), cache, meta["encoder"], default_as_of(cache)))
    sampler.stage = "score"
    out = sampler.timed("score_s", lambda: pipeline.run_predict(cfg, {scenario!r}))
time.sleep(0.5)
sampler.stop.set()
print(json.dumps({{"times": sampler.times, "anon_mb": {{k: round(v / 2**20, 1) for k, v in sampler.stage_anon.items()}},
                  "rows": out.get("rows"), "entities": out.get("entities")}}, default=str))
"""


def child(what: str, config: Path, scenario: str) -> dict:
    code = CHILD.format(bench=str(Path(__file__).parent), config=str(config), what=what, scenario=scenario)
    # run in the workspace, not the repository root: `python -c` puts the working directory first on sys.path,
    # where it would shadow a PYTHONPATH naming another checkout
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=config.parent
    )
    if proc.returncode:
        raise SystemExit(f"{what}: the measuring process failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["extract", "predict", "finetune"])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--limits", nargs="+", default=["2GB", "1GB"], help="extract: DuckDB memory limits")
    parser.add_argument("--scenario", default="churn", help="predict: a fine-tuned scenario of the workspace")
    parser.add_argument("--config", default="config.yaml", help="the config's file name in --workdir")
    parser.add_argument("--name", default=None, help="results name (default: the workdir's name)")
    parser.add_argument("--key", default="finetune", help="finetune: the prefix of its result keys")
    args = parser.parse_args()
    workdir = Path(args.workdir).resolve()
    name = args.name or workdir.name
    out_path = Path(__file__).parent / "results" / f"stage_memory_{name}.json"
    result = json.loads(out_path.read_text()) if out_path.exists() else {}
    result.update(
        {
            "benchmark": f"stage_memory_{name}",
            "dataset": name,
            "machine": f"{platform.machine()} {psutil.cpu_count()} cores, "
            f"{psutil.virtual_memory().total / 2**30:.0f} GiB",
            "date": time.strftime("%Y-%m-%d"),
        }
    )
    command = "python bench/bench_stage_memory.py " + " ".join(sys.argv[1:])
    if args.what == "extract":
        for limit in args.limits:
            raw = yaml.safe_load((workdir / args.config).read_text())
            raw.setdefault("cache", {})["duckdb_memory_limit"] = limit
            config = workdir / f"config_memory_{limit}.yaml"
            config.write_text(yaml.safe_dump(raw, sort_keys=False))
            load = psutil.getloadavg()[0]
            got = child("extract", config, args.scenario)
            key = f"extract.limit_{limit}"
            result.update(
                {
                    f"{key}.s": got["times"]["extract_s"],
                    f"{key}.anon_mb": got["anon_mb"].get("extract", 0.0),
                    f"{key}.load_1min_before": round(load, 2),
                    f"{key}.command": command,
                }
            )
            print(f"extract, memory limit {limit}: {got['times']['extract_s']} s, "
                  f"peak anon {got['anon_mb'].get('extract')} MB (load {load:.1f})", flush=True)  # fmt: skip
            config.unlink()
    elif args.what == "finetune":
        load = psutil.getloadavg()[0]
        got = child("finetune", workdir / args.config, args.scenario)
        result.update(
            {
                f"{args.key}.s": got["times"]["finetune_s"],
                f"{args.key}.anon_mb": got["anon_mb"].get("finetune", 0.0),
                f"{args.key}.train_examples": got["rows"],
                f"{args.key}.load_1min_before": round(load, 2),
                f"{args.key}.command": command,
            }
        )
        print(f"finetune {args.scenario}: {got['times']['finetune_s']} s, peak anon "
              f"{got['anon_mb'].get('finetune')} MB ({got['rows']} training examples, load {load:.1f})", flush=True)  # fmt: skip
    else:
        load = psutil.getloadavg()[0]
        got = child("predict", workdir / args.config, args.scenario)
        result.update(
            {
                "predict.state_s": got["times"]["state_s"],
                "predict.state_anon_mb": got["anon_mb"].get("state", 0.0),
                "predict.score_s": got["times"]["score_s"],
                "predict.score_anon_mb": got["anon_mb"].get("score", 0.0),
                "predict.entities": got["entities"],
                "predict.load_1min_before": round(load, 2),
                "predict.command": command,
            }
        )
        print(f"predict: state {got['times']['state_s']} s, peak anon {got['anon_mb'].get('state')} MB; "
              f"scoring {got['times']['score_s']} s, peak anon {got['anon_mb'].get('score')} MB "
              f"({got['entities']} entities, load {load:.1f})", flush=True)  # fmt: skip
    out_path.parent.mkdir(exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
