"""Quality on real data sets, every task type, three seeds: the published model against every baseline.

    .venv/bin/python bench/bench_quality.py --dataset completejourney [--seeds 0 1 2] [--scenarios a,b]
    .venv/bin/python bench/bench_quality.py --dataset nycflights13
    .venv/bin/python bench/bench_quality.py --dataset completejourney --collect   # table from saved runs
    .venv/bin/python bench/bench_quality.py --dataset completejourney --scenarios churn --update  # re-run some

For each seed the foundation is retrained (training_params.foundation.seed and finetune.seed = the seed) and
every scenario of the data set's full demo config (basemodel_pipeline/demo/datasets.py, plus EXTRA_SCENARIOS for a task
type it lacks) is fine-tuned: each fits its
candidates, chooses on validation windows and scores the test window once (candidates/selection.py). What is
compared is what the scenario publishes ("model") against each baseline the pipeline computes (popularity,
hand-crafted aggregates + LightGBM, and for recommendation "repeat what they bought") and against the
network alone.

Intervals: the test rows are the same for every seed, so one paired bootstrap over them (1,000 resamples)
gives a 95% interval for the seed-averaged difference (model - baseline; for RMSE baseline - model, so a
positive difference is always a win). A win or a loss is an interval that excludes zero; the rest are ties.
The test rows are the windows of every test split point (data_params.test_split_points: up to 4 weekly points
from training_end_date whose windows end inside the data), so an entity has several rows: whole entities are
resampled, all their windows at once.
Each seed's run is saved under <workspace>/quality/seed<k>.npz so --collect can rebuild the table.

--reference KEY=VALUE[,KEY=VALUE]: each seed also fine-tunes the scenarios again with these scenario settings
(a dotted KEY is a config path instead, e.g. data_params.split_interval_days=1)
(for example ``lightgbm_max_rows=0``: the multilabel LightGBM on every row, as before the row bound), on the
same foundation and rows, and the table then compares this run with that reference: the published model and
each candidate (new - reference, the same paired bootstrap), and the LightGBM fit and network train seconds.

Writes bench/results/quality_<dataset>.json (flat keys; `make results` renders it in bench/RESULTS.md) and
prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import yaml

from basemodel_pipeline.cache.windows import resolve_windows
from basemodel_pipeline.config import load_config
from basemodel_pipeline.demo.datasets import prepare_demo
from basemodel_pipeline.evaluation import metrics
from basemodel_pipeline.evaluation.resampling import bootstrap_rounds, cluster_sampler
from basemodel_pipeline.pipeline import run_cache, run_extract, run_pretrain
from basemodel_pipeline.progress import NullProgress
from basemodel_pipeline.scenarios.finetune import finetune_many
from basemodel_pipeline.tasks import task_named

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_foundation import commit, cpu_bf16  # noqa: E402

RANKING_BASELINES = (
    "popularity",
    "recent_popularity",
    "cooccurrence",
    "lightgbm_aggregates",
    "repeat_purchases",
)
BASELINES = (*RANKING_BASELINES, "neural")
# task types a data set's full demo config lacks, added here so every task type is measured on both sets
EXTRA_SCENARIOS = {
    "completejourney": [
        {
            "name": "favourite_department",
            "task": "multiclass",
            "target": {
                "kind": "multiclass",
                "source": "transactions",
                "column": "department",
                "horizon_days": 14,
                "top_k": 20,
            },
        }
    ]
}
ROUNDS = 1000  # bootstrap resamples; fewer for hundreds of labels (bootstrap_rounds): each costs C AUROCs


class Log(NullProgress):
    def log(self, message: str) -> None:
        print(time.strftime("%H:%M:%S"), message, flush=True)


def row_metric(task: str, truth, out, k: int = 10) -> np.ndarray | None:
    """Per-row values whose mean is the primary metric (recommendation: NDCG@10), else None."""
    if not task_named(task).ranked:
        return None
    indptr, indices, n_items = truth
    hits = metrics.ranking_hits(out, indptr, indices, n_items)[:, :k].astype(np.float64)
    n_rel = np.diff(indptr).astype(np.float64)
    disc = 1.0 / np.log2(np.arange(k) + 2.0)
    ideal = np.cumsum(disc)[np.minimum(n_rel, k).astype(np.int64) - 1]
    return np.where(n_rel > 0, (hits * disc[: hits.shape[1]]).sum(1) / ideal, np.nan)


def metric_of(task: str, truth, out) -> float:
    rows = row_metric(task, truth, out)
    return float(np.nanmean(rows)) if rows is not None else float(task_named(task).primary(truth, out))


def paired_interval(task: str, truth, model_runs: list, base_runs: list, seed: int = 0, entity=None):
    """(mean difference, 2.5%, 97.5%) of the seed-averaged (model - baseline), signed so > 0 is a win. With
    `entity` (the entity of each test row) whole entities are resampled: the test windows of several test
    split points are not independent rows."""
    sign = 1.0 if task_named(task).higher_is_better() else -1.0
    n = len(model_runs[0]) if not task_named(task).ranked else len(truth[0]) - 1

    if task_named(task).ranked:  # per-row NDCG: resample rows of the per-row values
        model_runs = [row_metric(task, truth, m) for m in model_runs]
        base_runs = [row_metric(task, truth, b) for b in base_runs]

        def diff(idx):
            pairs = zip(model_runs, base_runs, strict=True)
            return float(np.mean([np.nanmean(a[idx]) - np.nanmean(b[idx]) for a, b in pairs]))

    elif task_named(task).primary_metric in ("auroc", "macro_auroc"):  # sort once, then weigh each resample
        sorted_pairs = [
            (metrics.ResampledAuroc(truth, a), metrics.ResampledAuroc(truth, b))
            for a, b in zip(model_runs, base_runs, strict=True)
        ]

        def diff(idx):
            w = np.bincount(idx, minlength=n)
            return float(np.mean([a.macro(w) - b.macro(w) for a, b in sorted_pairs]))

    else:

        def diff(idx):
            t, primary = truth[idx], task_named(task).primary
            pairs = zip(model_runs, base_runs, strict=True)
            return float(np.mean([primary(t, a[idx]) - primary(t, b[idx]) for a, b in pairs]))

    rng = np.random.default_rng(seed)
    point = diff(np.arange(n))
    sample = cluster_sampler(np.arange(n), None if entity is None else np.asarray(entity))
    draws = [
        diff(sample(rng))
        for _ in range(bootstrap_rounds(task_named(task).metric_width(model_runs[0]), ROUNDS, floor=100))
    ]
    draws = [d for d in draws if np.isfinite(d)]
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return sign * point, *(sorted([sign * lo, sign * hi]))


def _scenario_info(task: str, m: dict) -> dict:
    return {
        "task": task,
        "published": m["published"],
        "validation": m["selection"]["validation"],
        "test": m["test"],
        "timing_s": m["timing_s"],
        "candidates_fit_s": m["candidates_fit_s"],
        "examples": m["examples"],
        "lightgbm_rows": m.get("lightgbm_rows", {}),
        "test_split_points": m.get("test_split_points", [m.get("test_date")]),
        "amounts": m.get("amounts"),  # a log1p amount: the mean expected amount vs the mean amount (money)
        "fit_windows": m.get("fit_windows"),
    }


def _outputs(arrays: dict, name: str, prefix: str, r: dict) -> None:
    for cand, o in r["test_outputs"].items():
        arrays[f"{name}/{prefix}/{cand}"] = np.asarray(o)


def run_seed(
    dataset: str, workspace: Path, seed: int, names: list[str] | None, reference: dict | None = None
) -> Path:
    out = workspace / "quality" / f"seed{seed}.npz"
    if out.exists():
        return out
    config = prepare_demo(workspace, full=True, dataset=dataset)
    raw = yaml.safe_load(config.read_text())
    tp = raw.setdefault("training_params", {})
    tp.setdefault("foundation", {})["seed"] = seed
    tp.setdefault("finetune", {})["seed"] = seed
    raw["scenarios"] = raw["scenarios"] + EXTRA_SCENARIOS.get(dataset, [])
    seeded = workspace / f"config_seed{seed}.yaml"
    seeded.write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = load_config(seeded)
    run_extract(cfg)
    run_cache(cfg)
    t0 = time.perf_counter()
    run_pretrain(cfg, Log())
    pretrain_s = time.perf_counter() - t0
    cfg = resolve_windows(cfg)  # rolling windows (the demo configs' -47d ...) against the cache
    scenarios = [s for s in cfg.scenarios if names is None or s.name in names]
    results = finetune_many(cfg, scenarios, Log(), keep_outputs=True)
    arrays, info = {}, {"pretrain_s": pretrain_s, "scenarios": {}}
    ref_results = {}
    if reference:  # the same scenarios with the reference settings, on the same foundation and rows
        cfg_base = cfg
        dotted = {k: v for k, v in reference.items() if "." in k}  # config paths, e.g. data_params.x
        if dotted:
            for key, value in dotted.items():
                *parents, leaf = key.split(".")
                node = raw
                for part in parents:
                    node = node.setdefault(part, {})
                node[leaf] = value
            changed_path = workspace / f"config_seed{seed}_reference.yaml"
            changed_path.write_text(yaml.safe_dump(raw, sort_keys=False))
            cfg_base = resolve_windows(load_config(changed_path))
        plain = {k: v for k, v in reference.items() if "." not in k}
        ran = {s.name for s in scenarios}
        changed = {s.name: s.model_copy(update=plain) for s in cfg_base.scenarios if s.name in ran}
        cfg_ref = cfg_base.model_copy(
            update={"scenarios": [changed.get(s.name, s) for s in cfg_base.scenarios]}
        )
        ref_results = finetune_many(cfg_ref, list(changed.values()), Log(), keep_outputs=True)
        info["reference"] = reference
    for name, r in results.items():
        task = cfg.scenario(name).task
        m = json.loads((Path(r["path"]) / "metrics.json").read_text())
        info["scenarios"][name] = _scenario_info(task, m)
        if name in ref_results:
            ref = json.loads((Path(ref_results[name]["path"]) / "metrics.json").read_text())
            info["scenarios"][name]["reference"] = _scenario_info(task, ref)
            _outputs(arrays, name, "ref", ref_results[name])
        truth = r["test_truth"]
        if task_named(task).ranked:
            arrays[f"{name}/truth_indptr"], arrays[f"{name}/truth_indices"] = truth[0], truth[1]
            arrays[f"{name}/truth_n"] = np.array([truth[2]])
        else:
            arrays[f"{name}/truth"] = np.asarray(truth)
        _outputs(arrays, name, "out", r)
        arrays[f"{name}/test_entity"] = np.asarray(r["test_entity"])
        arrays[f"{name}/test_time"] = np.asarray(r["test_time"])
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out.with_suffix(".tmp.npz"), **arrays)
    os.replace(out.with_suffix(".tmp.npz"), out)
    out.with_suffix(".json").write_text(json.dumps(info, indent=2, default=str))
    return out


def collect(dataset: str, workspace: Path, seeds: list[int], names: list[str] | None = None) -> dict:
    runs = [
        (
            np.load(workspace / "quality" / f"seed{s}.npz"),
            json.loads((workspace / "quality" / f"seed{s}.json").read_text()),
        )
        for s in seeds
    ]
    flat: dict = {}
    rows = []
    for name, first in runs[0][1]["scenarios"].items():
        if names is not None and name not in names:
            continue
        task = first["task"]
        z0 = runs[0][0]
        truth = (
            (z0[f"{name}/truth_indptr"], z0[f"{name}/truth_indices"], int(z0[f"{name}/truth_n"][0]))
            if task_named(task).ranked
            else z0[f"{name}/truth"]
        )
        model = [z[f"{name}/out/model"] for z, _ in runs]
        entity = z0.get(f"{name}/test_entity")  # older runs have none: rows are resampled
        flat[f"{name}.task"] = task
        flat[f"{name}.test_split_points"] = ",".join(first.get("test_split_points", []))
        flat[f"{name}.test_rows"] = len(model[0]) if not task_named(task).ranked else len(truth[0]) - 1
        if entity is not None:
            flat[f"{name}.test_entities"] = len(np.unique(entity))
        flat[f"{name}.metric"] = task_named(task).primary_metric
        flat[f"{name}.published"] = ",".join(info["scenarios"][name]["published"] for _, info in runs)
        flat[f"{name}.model"] = round(float(np.mean([metric_of(task, truth, m) for m in model])), 4)
        for b in BASELINES:
            if f"{name}/out/{b}" not in z0:
                continue
            base = [z[f"{name}/out/{b}"] for z, _ in runs]
            flat[f"{name}.{b}"] = round(float(np.mean([metric_of(task, truth, x) for x in base])), 4)
            d, lo, hi = paired_interval(task, truth, model, base, entity=entity)
            verdict = "win" if lo > 0 else "loss" if hi < 0 else "tie"
            flat[f"{name}.vs_{b}"] = round(d, 4)
            flat[f"{name}.vs_{b}_lo"] = round(lo, 4)
            flat[f"{name}.vs_{b}_hi"] = round(hi, 4)
            flat[f"{name}.vs_{b}_verdict"] = verdict
        amounts = [info["scenarios"][name].get("amounts") for _, info in runs]
        if all(amounts):  # published in money: does the mean prediction hold on the test windows, per seed
            flat[f"{name}.mean_predicted"] = [round(a["mean_predicted"], 3) for a in amounts]
            flat[f"{name}.mean_actual"] = round(amounts[0]["mean_actual"], 3)
            flat[f"{name}.mean_actual_95"] = [round(v, 3) for v in amounts[0]["mean_actual_95"]]
            flat[f"{name}.mean_within_interval"] = all(a["mean_within_interval"] for a in amounts)
            naive = [float(np.mean(np.expm1(np.maximum(z[f"{name}/out/model"], 0)))) for z, _ in runs]
            flat[f"{name}.mean_expm1_of_log_prediction"] = [round(v, 3) for v in naive]
        t = [info["scenarios"][name]["timing_s"] for _, info in runs]
        fit = [info["scenarios"][name]["candidates_fit_s"] for _, info in runs]
        base_s = np.mean(
            [
                x.get("train_s", 0) + f.get("lightgbm_aggregates", 0) + f.get("popularity", 0)
                for x, f in zip(t, fit, strict=True)
            ]
        )
        total_s = np.mean(
            [
                x.get("train_s", 0) + x.get("candidates_fit_s", 0) + x.get("select_s", 0) + x.get("test_s", 0)
                for x in t
            ]
        )
        if f"{name}/ref/model" in z0:  # --reference: this run against the reference settings
            for cand in ("model", "lightgbm_aggregates", "neural"):
                if f"{name}/ref/{cand}" not in z0 or f"{name}/out/{cand}" not in z0:
                    continue
                new = [z[f"{name}/out/{cand}"] for z, _ in runs]
                ref = [z[f"{name}/ref/{cand}"] for z, _ in runs]
                flat[f"{name}.ref_{cand}"] = round(
                    float(np.mean([metric_of(task, truth, x) for x in ref])), 4
                )
                flat[f"{name}.new_{cand}"] = round(
                    float(np.mean([metric_of(task, truth, x) for x in new])), 4
                )
                d, lo, hi = paired_interval(task, truth, new, ref, entity=entity)
                flat[f"{name}.new_vs_ref_{cand}"] = [round(d, 4), round(lo, 4), round(hi, 4)]
            infos = [info["scenarios"][name] for _, info in runs]
            for side, get in (("new", lambda i: i), ("ref", lambda i: i["reference"])):
                flat[f"{name}.{side}_lightgbm_fit_s"] = [
                    get(i)["candidates_fit_s"].get("lightgbm_aggregates") for i in infos
                ]
                flat[f"{name}.{side}_network_train_s"] = [get(i)["timing_s"].get("train_s") for i in infos]
                flat[f"{name}.{side}_published"] = ",".join(get(i)["published"] for i in infos)
            flat[f"{name}.new_lightgbm_rows"] = infos[0].get("lightgbm_rows", {}).get("lightgbm_aggregates")
        flat[f"{name}.seconds_network_and_baselines"] = round(float(base_s), 1)
        flat[f"{name}.seconds_with_selection"] = round(float(total_s), 1)
        flat[f"{name}.selection_time_ratio"] = round(float(total_s / max(base_s, 1e-9)), 2)
        # the scenario's own share of the work both sides do: its targets and its featurisation (shared by the
        # scenarios of one finetune_many call, so counted once per scenario here, as a scenario run alone pays)
        prep = float(np.mean([x.get("targets_s", 0) + x.get("featurise_s", 0) for x in t]))
        flat[f"{name}.seconds_targets_and_features"] = round(prep, 1)
        flat[f"{name}.selection_time_ratio_with_features"] = round(
            (total_s + prep) / max(base_s + prep, 1e-9), 2
        )
        rows.append(name)
    return flat


def _cell(flat: dict, n: str, b: str) -> str:
    if f"{n}.vs_{b}" not in flat:
        return "-"
    d, lo, hi = (flat[f"{n}.vs_{b}{x}"] for x in ("", "_lo", "_hi"))
    return f"{d:+.4f} [{lo:+.4f}, {hi:+.4f}] **{flat[f'{n}.vs_{b}_verdict']}**"


def table(flat: dict, names: list[str]) -> str:
    lines = [
        "| scenario | metric | published (per seed) | model | best baseline | vs popularity | vs recent popularity | "
        "vs co-occurrence | vs LightGBM aggregates | vs repeat | vs network alone | time x |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in names:
        bases = [b for b in RANKING_BASELINES if f"{n}.{b}" in flat]
        hib = metrics.higher_is_better(flat[f"{n}.metric"])
        best = (max if hib else min)(bases, key=lambda b, n=n: flat[f"{n}.{b}"])
        cells = " | ".join(_cell(flat, n, b) for b in BASELINES)
        lines.append(
            f"| {n} | {flat[f'{n}.metric']} | {flat[f'{n}.published']} | {flat[f'{n}.model']:.4f} | "
            f"{best} {flat[f'{n}.{best}']:.4f} | {cells} | {flat[f'{n}.selection_time_ratio']} |"
        )
    return "\n".join(lines)


def reference_table(flat: dict, names: list[str]) -> str:
    """This run against the --reference settings: test metric and seconds, seed-averaged / per seed."""
    lines = [
        "| scenario | candidate | reference | this run | this run - reference [95%] |",
        "|---|---|---|---|---|",
    ]
    for n in names:
        for cand in ("model", "lightgbm_aggregates", "neural"):
            if f"{n}.new_vs_ref_{cand}" not in flat:
                continue
            d, lo, hi = flat[f"{n}.new_vs_ref_{cand}"]
            lines.append(
                f"| {n} | {cand} | {flat[f'{n}.ref_{cand}']:.4f} | {flat[f'{n}.new_{cand}']:.4f} | "
                f"{d:+.4f} [{lo:+.4f}, {hi:+.4f}] |"
            )
    lines += ["", "| scenario | LightGBM fit s (reference) | LightGBM fit s (this run) | network train s |"]
    lines.append("|---|---|---|---|")
    for n in names:
        if f"{n}.new_lightgbm_fit_s" in flat:
            lines.append(
                f"| {n} | {flat[f'{n}.ref_lightgbm_fit_s']} | {flat[f'{n}.new_lightgbm_fit_s']} | "
                f"{flat[f'{n}.new_network_train_s']} (reference run: {flat[f'{n}.ref_network_train_s']}) |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="completejourney")
    ap.add_argument("--workspace", type=Path, default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--scenarios", default=None, help="comma-separated subset of the full config's scenarios")
    ap.add_argument("--collect", action="store_true", help="only tabulate saved runs")
    ap.add_argument(
        "--reference",
        default=None,
        help="KEY=VALUE[,KEY=VALUE] scenario settings (or dotted config paths) of a reference run on the same foundation and rows "
        "(e.g. lightgbm_max_rows=0); the table compares this run with it",
    )
    ap.add_argument(
        "--update",
        action="store_true",
        help="replace only this run's scenarios in the existing results file (a partial re-run after a change "
        "that affects some scenarios); each scenario keeps the command and commit that measured it",
    )
    args = ap.parse_args()
    workspace = (args.workspace or Path(f"bench_workspace/quality_{args.dataset}")).resolve()
    names = args.scenarios.split(",") if args.scenarios else None
    load_before = os.getloadavg()
    started = time.perf_counter()
    if not args.collect:
        reference = (
            {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in args.reference.split(","))}
            if args.reference
            else None
        )
        for seed in args.seeds:
            run_seed(args.dataset, workspace, seed, names, reference)
    flat = collect(args.dataset, workspace, args.seeds, names)
    command = " ".join(["python bench/bench_quality.py", *sys.argv[1:]])
    at = commit()
    for name in dict.fromkeys(k.split(".")[0] for k in flat):
        flat[f"{name}.command"], flat[f"{name}.commit"] = command, at
    path = Path(__file__).parent / "results" / f"quality_{args.dataset}.json"
    if args.update and path.exists():
        old = json.loads(path.read_text())
        ran = dict.fromkeys(k.split(".")[0] for k in flat)
        # the old scenario order, then new ones; this run's keys for the scenarios it measured
        order = dict.fromkeys([*(k.split(".")[0] for k in old if "." in k), *ran])
        flat = {
            k: v
            for name in order
            for k, v in (flat if name in ran else old).items()
            if "." in k and k.split(".")[0] == name
        }
        command = f"{old.get('command', '')}; then {command}"
    scen = sorted(
        {k.split(".")[0] for k in flat}, key=list(dict.fromkeys(k.split(".")[0] for k in flat)).index
    )
    result = {
        "benchmark": f"quality_{args.dataset}",
        "date": time.strftime("%Y-%m-%d"),
        "dataset": args.dataset,
        "seeds": " ".join(map(str, args.seeds)),
        "command": command,
        "machine": f"{platform.machine()} {psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, {cpu_bf16()}",
        "loadavg_before": round(load_before[0], 2),
        "loadavg_after": round(os.getloadavg()[0], 2),
        "wall_s": round(time.perf_counter() - started, 1),
        "bootstrap_rounds": f"{ROUNDS} (100 to {ROUNDS} for multilabel with more than 50 labels)",
        **({"reference": args.reference} if args.reference else {}),
        **flat,
    }
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(table(flat, scen))
    if any(k.endswith(".new_lightgbm_fit_s") for k in flat):
        print()
        print(reference_table(flat, scen))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
