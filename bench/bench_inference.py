"""Benchmark: batch scoring — throughput at scale and the quality cost of each precision.

    .venv/bin/python bench/bench_inference.py quality --workspace demo_workspace [--scenario churn]
    .venv/bin/python bench/bench_inference.py throughput --data /path/to/synthetic_scale_dir --workdir W

quality: on a trained workspace (The Complete Journey after `make demo`), scores the scenario's test examples
with fp32, bf16 and int8 and reports the metric of each and the forward-pass speed (the median of --repeats
passes over the test features repeated to --speed-rows rows). Writes
bench/results/inference_precision_<scenario>.json.

throughput: on a synthetic_scale dataset (its config.yaml, data read in place; the workspace goes to --workdir):
extract, cache, a short foundation + churn fine-tune (epochs reduced: scoring speed depends on the model's
shape, not on its quality), then times
  - building the per-entity state from the whole history (once per foundation model),
  - advancing it by the last 7 days (what a nightly refresh costs),
  - scoring every entity as of the latest date from the state (a forward pass),
  - scoring every entity as of an earlier date (replay from the cache),
with peak memory. Writes bench/results/inference_synthetic_<events>M.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
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
from bench_foundation import MemorySampler, commit, cpu_bf16  # noqa: E402

from basemodel_pipeline import (
    pipeline,  # noqa: E402
    runtime,  # noqa: E402
)
from basemodel_pipeline import workspace as ws  # noqa: E402
from basemodel_pipeline.cache.store import EventCache  # noqa: E402
from basemodel_pipeline.cache.windows import resolve_windows
from basemodel_pipeline.config import load_config  # noqa: E402
from basemodel_pipeline.features.sketch import FeatureEncoder  # noqa: E402
from basemodel_pipeline.inference.options import ScoringOptions  # noqa: E402
from basemodel_pipeline.inference.predict import Scorer, default_as_of  # noqa: E402
from basemodel_pipeline.inference.state import ensure_state  # noqa: E402
from basemodel_pipeline.model.checkpoint import read_meta  # noqa: E402
from basemodel_pipeline.scenarios.targets import build_examples, choose_classes  # noqa: E402
from basemodel_pipeline.tasks import task_named  # noqa: E402
from basemodel_pipeline.training.splits import scenario_split_times  # noqa: E402
from basemodel_pipeline.workspace import cache_dir  # noqa: E402

REFERENCE_INFERENCE_ENTITIES_PER_S = 2_718  # BaseModel: clients/s per GPU
RESULTS = Path(__file__).parent / "results"


def machine() -> str:
    return f"{platform.machine()} {psutil.cpu_count()} cores ({cpu_bf16()}), load {os.getloadavg()[0]:.1f}"


def quality(args: argparse.Namespace) -> dict:
    cfg = load_config(Path(args.workspace) / "config.yaml")
    cache = EventCache(cache_dir(cfg))
    sc = cfg.scenario(args.scenario)
    checkpoint = ws.latest_scenario_dir(cfg, sc.name)
    times = scenario_split_times(resolve_windows(cfg).data_params, sc.target.horizon_days, sc.name)
    spec = choose_classes(cache, sc, times["train"])
    test = build_examples(cache, sc, spec, times["test"])
    X = FeatureEncoder.from_dict(read_meta(checkpoint).encoder).history(cache, test.entity, test.time)
    runtime.set_threads()
    result: dict = {
        "benchmark": "inference_precision",
        "dataset": f"{args.workspace} scenario {sc.name}, {len(test.entity):,} test examples",
        "machine": machine(),
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d"),
        "command": "python bench/bench_inference.py " + " ".join(sys.argv[1:]),
    }
    # the speed: the test rows' features repeated to --speed-rows rows (a forward pass over a few thousand rows
    # is a few milliseconds, mostly per-call overhead), the median of --repeats passes
    timed = np.resize(X, (max(args.speed_rows, len(X)), X.shape[1]))
    result["speed_rows"] = len(timed)
    for precision in ("fp32", "bf16", "int8"):
        scorer = Scorer.load(checkpoint, precision)
        scorer.outputs(cache, X[:256], test.entity[:256], dt.date.today(), 10)  # warm-up
        scores = scorer.task.scores(runtime.predict(scorer.model, X, scorer.device, amp=scorer.amp))
        result[f"{precision}_{_metric(sc.task)}"] = round(
            float(task_named(sc.task).primary(test.labels, scores)), 5
        )
        walls = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            runtime.predict(scorer.model, timed, scorer.device, amp=scorer.amp)
            walls.append(time.perf_counter() - t0)
        result[f"{precision}_forward_entities_per_s"] = round(len(timed) / float(np.median(walls)), 1)
    m = _metric(sc.task)
    result["int8_metric_change"] = round(result[f"int8_{m}"] - result[f"fp32_{m}"], 5)
    result["bf16_metric_change"] = round(result[f"bf16_{m}"] - result[f"fp32_{m}"], 5)
    for precision in ("bf16", "int8"):
        result[f"{precision}_speedup_over_fp32"] = round(
            result[f"{precision}_forward_entities_per_s"] / result["fp32_forward_entities_per_s"], 2
        )
    out = RESULTS / f"inference_precision_{sc.name}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def _metric(task: str) -> str:
    return "auroc" if task == "binary" else "metric"


def head_only_scenario(cfg, name: str) -> dict:  # noqa: ANN001
    """A binary scenario checkpoint of the production shape (the foundation trunk + a fresh 1-output head),
    published without training: scoring speed depends on the model's shape, not on its weights."""
    from basemodel_pipeline.model.checkpoint import (
        CheckpointMeta,
        build_model,
        load_checkpoint,
        publish_checkpoint,
    )
    from basemodel_pipeline.targets.labels import TargetSpec

    foundation, fmeta = load_checkpoint(ws.latest_foundation_dir(cfg))
    model = build_model(fmeta.arch.with_out_dim(1))
    model.trunk.load_state_dict(foundation.trunk.state_dict())
    meta = CheckpointMeta(
        kind="scenario",
        scenario=cfg.scenario(name).model_dump(mode="json"),
        target=TargetSpec("binary", [], []).to_dict(),
        arch=fmeta.arch.with_out_dim(1),
        encoder=fmeta.encoder,
        published={"name": "neural", "kind": "neural"},
        note="bench/bench_inference.py --head-only: untrained head, for throughput only",
    )
    version, path = publish_checkpoint(ws.scenario_root(cfg, name), model, meta, promote=True)
    return {"version": version, "path": str(path)}


def throughput(args: argparse.Namespace) -> dict:
    data = Path(args.data).resolve()
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load((data / "config.yaml").read_text())
    raw["workspace"] = str(workdir)
    for src in raw["data_sources"]:
        loc = src["data_location"]
        if loc.get("database_type") == "parquet" and not Path(loc["path"]).is_absolute():
            loc["path"] = str(data / loc["path"])
    raw["training_params"]["foundation"].update({"epochs": 1, "max_examples_per_epoch": 65536})
    raw["training_params"]["finetune"].update({"epochs": 1, "patience": 1})
    raw["scenarios"] = [s for s in raw["scenarios"] if s["name"] == args.scenario]
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = load_config(config)
    sampler = MemorySampler()
    sampler.start()
    times, stage = sampler.times, sampler.timed

    if not (workdir / "extracts").exists():
        stage("extract_s", lambda: pipeline.run_extract(cfg))
    built = stage("cache_s", lambda: pipeline.run_cache(cfg))
    if not ws.has_scenario(cfg, args.scenario):
        stage("pretrain_s", lambda: pipeline.run_pretrain(cfg))
        if args.head_only:
            stage("finetune_s", lambda: head_only_scenario(cfg, args.scenario))
        else:
            stage("finetune_s", lambda: pipeline.run_finetune(cfg, args.scenario))
    cache = EventCache(cache_dir(cfg))
    latest = default_as_of(cache)
    encoder = json.loads((ws.latest_scenario_dir(cfg, args.scenario) / "model.json").read_text())["encoder"]
    shutil.rmtree(workdir / "state", ignore_errors=True)
    week_ago = latest - dt.timedelta(days=7)
    build, _ = stage("state_build_s", lambda: ensure_state(workdir, cache, encoder, week_ago))
    _, adv = stage("state_advance_7d_s", lambda: ensure_state(workdir, cache, encoder, latest))
    sampler.peak_anon = 0
    state_run = stage("score_latest_s", lambda: pipeline.run_predict(cfg, args.scenario))
    replay_day = latest - dt.timedelta(days=args.replay_days_back)
    n_replay = min(cache.n_entities, args.replay_entities)
    ids = workdir / "replay_ids.txt"
    ids.write_text("".join(f"{i}\n" for i in cache.entity_ids[:n_replay]))
    replay_options = ScoringOptions(as_of=replay_day, entities=ids)
    replay = stage("score_replay_s", lambda: pipeline.run_predict(cfg, args.scenario, replay_options))
    sampler.stop.set()
    events = built["events"]
    n = cache.n_entities
    result = {
        "benchmark": "inference_synthetic",
        "dataset": f"synthetic_scale {events:,} events, {n:,} entities",
        "events": events,
        "entities": n,
        "machine": machine(),
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d"),
        "command": "python bench/bench_inference.py " + " ".join(sys.argv[1:]),
        **times,
        "precision": state_run["precision"],
        "state_build_entities_per_s": round(n / times["state_build_s"], 1),
        "state_advance_7d_new_events": adv["new_events"],
        "state_bytes": sum(f.stat().st_size for f in Path(build.path).glob("*.npy")),
        "inference_entities_per_s": state_run["inference_entities_per_s"],
        "inference_latest_end_to_end_entities_per_s": round(n / times["score_latest_s"], 1),
        "inference_replay_entities_per_s": replay["inference_entities_per_s"],
        "replay_entities": n_replay,
        "replay_as_of": replay_day.isoformat(),
        "latest_over_reference": round(
            state_run["inference_entities_per_s"] / REFERENCE_INFERENCE_ENTITIES_PER_S, 2
        ),
        "replay_over_reference": round(
            replay["inference_entities_per_s"] / REFERENCE_INFERENCE_ENTITIES_PER_S, 2
        ),
        "peak_rss_mb": round(sampler.peak_rss / 2**20, 1),
        **{f"peak_anon_mb_{k}": round(v / 2**20, 1) for k, v in sampler.stage_anon.items()},
        "torch_threads": torch.get_num_threads(),
    }
    out = RESULTS / f"inference_synthetic_{events // 1_000_000}M.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--workspace", default="demo_workspace")
    q.add_argument("--scenario", default="churn")
    q.add_argument("--repeats", type=int, default=5)
    q.add_argument("--speed-rows", type=int, default=100_000, help="rows of the timed forward passes")
    t = sub.add_parser("throughput")
    t.add_argument("--data", required=True, help="a synthetic_scale output directory (has config.yaml)")
    t.add_argument("--workdir", required=True)
    t.add_argument("--scenario", default="churn")
    t.add_argument("--replay-days-back", type=int, default=30)
    t.add_argument("--replay-entities", type=int, default=100_000)
    t.add_argument(
        "--head-only",
        action="store_true",
        help="skip fine-tuning: publish the foundation trunk + a fresh head",
    )
    args = parser.parse_args()
    result = quality(args) if args.cmd == "quality" else throughput(args)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
