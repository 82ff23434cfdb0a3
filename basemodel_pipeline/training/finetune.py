"""Scenario fine-tuning from the foundation checkpoint, with per-scenario early stopping, and evaluation of
the model beside the popularity and hand-crafted-aggregates + LightGBM baselines on the same temporal split.

Modes: ``frozen`` (the trunk's outputs are computed once, then only the head trains: seconds per epoch even
with thousands of labels), ``full`` (everything trains), ``lora`` (low-rank adapters on the trunk's linear
layers + the head; merged into the weights before saving). ``finetune_many`` featurises the union of all
the scenarios' examples in one pass over the event cache, then trains each head with its own stopping point.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.build import cache_dir
from basemodel_pipeline.cache.store import DAY, EventCache
from basemodel_pipeline.config import PipelineConfig, Scenario
from basemodel_pipeline.config.models import BinaryTarget, PythonTarget, RegressionTarget
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.evaluation import baselines, metrics
from basemodel_pipeline.evaluation.aggregates import aggregate_features
from basemodel_pipeline.features.sketch import FeatureEncoder
from basemodel_pipeline.model.checkpoint import build_model, load_trunk_state, publish_checkpoint
from basemodel_pipeline.model.trunk import TrunkWithHead
from basemodel_pipeline.progress import Progress
from basemodel_pipeline.scenarios.heads import REPEAT_HALF_LIFE_DAYS, REPEAT_WEIGHTS, Bonus, Head, own_history
from basemodel_pipeline.scenarios.lora import add_lora, merge_lora
from basemodel_pipeline.scenarios.targets import (
    Examples,
    SparseLabels,
    TargetSpec,
    build_examples,
    choose_classes,
    dense_labels,
    label_columns,
    regression_values,
)
from basemodel_pipeline.training import loop
from basemodel_pipeline.training.splits import scenario_split_times

RANKED_ITEMS = 100  # recommendation: items ranked per entity for the metrics (MRR over this list)
REPEAT_TUNE_EXAMPLES = 3000  # recommendation: validation examples used to weigh the own purchase history


@dataclass
class Shared:
    """What several scenarios share: the cache, the foundation, and features of (entity, time) pairs."""

    cfg: PipelineConfig
    cache: EventCache
    fmeta: dict
    foundation: Any
    enc: FeatureEncoder
    keys: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))
    X: np.ndarray | None = None
    H: np.ndarray | None = None  # frozen trunk outputs of X
    agg: np.ndarray | None = None

    def rows(self, ex: Examples) -> np.ndarray:
        """Row of each example in X (keys are sorted (entity, time) pairs)."""
        q = ex.entity * (1 << 40) + ex.time
        k = self.keys[:, 0] * (1 << 40) + self.keys[:, 1]
        return np.searchsorted(k, q)

    def featurise(self, examples: list[Examples]) -> float:
        """Features of every distinct (entity, time) pair of `examples` in one pass; returns seconds."""
        t0 = time.perf_counter()
        pairs = np.stack(
            [np.concatenate([x.entity for x in examples]), np.concatenate([x.time for x in examples])], 1
        )
        self.keys = np.unique(pairs, axis=0)
        self.X = self.enc.history(self.cache, self.keys[:, 0], self.keys[:, 1])
        return time.perf_counter() - t0

    def trunk_outputs(self, device: torch.device) -> np.ndarray:
        if self.H is None:
            model = self.new_model(1).to(device)
            assert self.X is not None
            self.H = loop.predict(model.trunk, self.X, device)
        return self.H

    def aggregates(self) -> np.ndarray:
        if self.agg is None:
            self.agg = aggregate_features(self.cache, self.keys[:, 0], self.keys[:, 1])[0]
        return self.agg

    def new_model(self, out_dim: int) -> TrunkWithHead:
        model = build_model({**self.fmeta["arch"], "out_dim": out_dim})
        model.trunk.load_state_dict(load_trunk_state(self.foundation))
        return model


def _check_split(name: str, part: str, ex: Examples, task: str) -> None:
    if len(ex) == 0:
        raise DataError(
            f"scenario '{name}': the {part} split has no examples; check data_params and the target"
        )
    if task == "binary" and len(np.unique(ex.labels)) < 2:
        raise DataError(
            f"scenario '{name}': the {part} split has only one label value ({ex.labels[0]:.0f}); "
            "the target never (or always) happens there"
        )


def prepare(shared: Shared, scenario: Scenario) -> tuple[TargetSpec, dict[str, Examples]]:
    times = scenario_split_times(
        shared.cfg.data_params, scenario.target.horizon_days, f"scenario '{scenario.name}'"
    )
    spec = choose_classes(shared.cache, scenario, times["train"])
    ex = {k: build_examples(shared.cache, scenario, spec, v) for k, v in times.items()}
    for k, v in ex.items():
        _check_split(scenario.name, k, v, scenario.task)
    if scenario.task == "regression":
        y = np.asarray(ex["train"].labels, np.float64)
        spec.extra.update(mean=float(y.mean()), std=float(y.std() + 1e-6))
    return spec, ex


# ---- evaluation ------------------------------------------------------------------------------------
def _truth(task: str, ex: Examples) -> Any:
    if task == "recommendation":
        lab = ex.labels
        assert isinstance(lab, SparseLabels)
        return (lab.indptr, lab.indices, lab.n_cols)
    return dense_labels(ex.labels) if task == "multilabel" else ex.labels


def _outputs(
    head: Head, logits: np.ndarray, history: Bonus | None = None, weight: float | None = None
) -> np.ndarray:
    if head.task == "recommendation":
        return head.top_items(logits, RANKED_ITEMS, history=history, weight=weight)[0]
    return head.scores(logits)


def _tune_repeat_weight(
    shared: Shared, head: Head, net: nn.Module, inputs: np.ndarray, rows: np.ndarray, val: Examples, device
) -> float:
    """The weight of the entity's own history in recommendation scores that maximises validation NDCG@10."""
    rng = np.random.default_rng(0)
    idx = np.sort(rng.choice(len(val), min(len(val), REPEAT_TUNE_EXAMPLES), replace=False))
    part = val.subset(idx)
    logits = loop.predict(net, inputs[rows[idx]], device)
    history, truth = own_history(shared.cache, head.spec, part), _truth("recommendation", part)
    score = {
        w: metrics.primary_metric("recommendation", truth, _outputs(head, logits, history, w))
        for w in REPEAT_WEIGHTS
    }
    return max(score, key=lambda w: (score[w], -w))


def _popularity(shared: Shared, scenario: Scenario, spec: TargetSpec, ex: dict[str, Examples]) -> np.ndarray:
    cache, target, test = shared.cache, scenario.target, ex["test"]
    task = scenario.task
    if isinstance(target, PythonTarget):
        if task == "binary":  # recent activity, its direction chosen on validation
            val = ex["val"]
            sign_val = baselines.popularity_scores("binary", cache, val.entity, val.time, target.source)
            sign = 1.0 if metrics.auroc(val.labels, sign_val) >= 0.5 else -1.0
            return sign * baselines.popularity_scores("binary", cache, test.entity, test.time, target.source)
        if task == "regression":
            return np.full(len(test), float(np.mean(ex["train"].labels)))
        y = dense_labels(ex["train"].labels)
        prior = np.bincount(y, minlength=len(spec.classes)) / len(y) if task == "multiclass" else y.mean(0)
        return np.tile(prior, (len(test), 1))
    if task == "binary":
        pop = baselines.popularity_scores("binary", cache, test.entity, test.time, target.source)
        return -pop if isinstance(target, BinaryTarget) and target.event == "none" else pop
    if task in ("multilabel", "multiclass"):
        pop = baselines.popularity_scores(
            task,
            cache,
            test.entity,
            test.time,
            target.source,
            column=target.column,
            class_codes=np.array(spec.class_codes),
        )
        if task == "multiclass":
            if len(spec.classes) > pop.shape[1]:  # the "(other)" class: the rest of the entity's events
                pop = np.c_[pop, np.clip(1.0 - pop.sum(1), 0.0, None)]
            pop = pop / np.maximum(pop.sum(1, keepdims=True), 1e-12)
        return pop
    if task == "regression":  # the same quantity over the window of the same length before the split
        assert isinstance(target, RegressionTarget)
        return regression_values(cache, scenario, test.entity, test.time - target.horizon_days * DAY)
    return baselines.recommendation_topk(
        "popularity", cache, test.entity, test.time, target.source, target.column, RANKED_ITEMS
    )


def _lightgbm(shared: Shared, scenario: Scenario, ex: dict[str, Examples], pop: np.ndarray) -> np.ndarray:
    task = scenario.task
    agg = shared.aggregates()
    feats = {k: agg[shared.rows(v)] for k, v in ex.items()}
    if task == "multilabel":  # one-vs-rest for the most frequent labels, popularity for the tail
        lab = ex["train"].labels
        freq = (
            np.bincount(lab.indices, minlength=lab.n_cols)
            if isinstance(lab, SparseLabels)
            else (lab > 0).sum(0)
        )
        top = np.sort(np.argsort(-freq, kind="stable")[: scenario.lightgbm_top_labels])
        out = pop.astype(np.float64).copy()
        if len(top):
            Ytr, Yva = (label_columns(ex[k].labels, top) for k in ("train", "val"))
            out[:, top] = baselines.lightgbm_scores(
                "multilabel", feats["train"], Ytr, feats["val"], Yva, feats["test"]
            )
        return out
    out = baselines.lightgbm_scores(
        task, feats["train"], ex["train"].labels, feats["val"], ex["val"].labels, feats["test"]
    )
    if task == "multiclass" and out.shape[1] < pop.shape[1]:
        out = np.c_[out, np.zeros((len(out), pop.shape[1] - out.shape[1]))]
    return out


def evaluate_baselines(
    shared: Shared, scenario: Scenario, spec: TargetSpec, ex: dict[str, Examples]
) -> dict[str, np.ndarray]:
    """Test outputs of the baselines on the same split: {name: scores or ranked items}."""
    pop = _popularity(shared, scenario, spec, ex)
    if scenario.task == "recommendation":
        t = scenario.target
        test = ex["test"]
        repeat = baselines.recommendation_topk(
            "repeat", shared.cache, test.entity, test.time, t.source, t.column, RANKED_ITEMS
        )
        return {"repeat_purchases": repeat, "popularity": pop}
    return {"lightgbm_aggregates": _lightgbm(shared, scenario, ex, pop), "popularity": pop}


# ---- training --------------------------------------------------------------------------------------
def _train(
    shared: Shared, scenario: Scenario, spec: TargetSpec, ex: dict[str, Examples], progress: Progress
) -> tuple[TrunkWithHead, Head, list[dict], float, np.ndarray]:
    """Train one scenario's model; returns (model with the best epoch's weights, head, history, best val, test logits)."""
    p = shared.cfg.training_params.finetune
    mode = scenario.mode or p.mode
    epochs = scenario.epochs or p.epochs
    lr = scenario.learning_rate or p.learning_rate
    torch.manual_seed(p.seed)
    loop.set_threads()
    device = loop.pick_device(shared.cfg.training_params.foundation.device)
    head = Head(spec)
    model = shared.new_model(spec.out_dim)
    head.init_bias(model.head, ex["train"].labels)
    model.to(device)
    rows = {k: shared.rows(v) for k, v in ex.items()}
    if mode == "frozen":
        inputs = shared.trunk_outputs(device)
        net: nn.Module = model.head
        params = list(model.head.parameters())
    else:
        assert shared.X is not None
        inputs, net = shared.X, model
        params = (
            list(model.parameters())
            if mode == "full"
            else add_lora(model.trunk, scenario.lora_rank) + list(model.head.parameters())
        )
        model.to(device)
    n = len(ex["train"])
    steps = epochs * -(-n // p.batch_size)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=p.weight_decay)
    warmup = min(100, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            (s + 1) / max(warmup, 1)
            if s < warmup
            else 0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * min(1.0, (s - warmup) / max(steps - warmup, 1))))
        ),
    )
    rng = np.random.default_rng(p.seed)
    primary = metrics.PRIMARY_METRIC[scenario.task]
    sign = 1.0 if metrics.higher_is_better(primary) else -1.0
    val_truth = _truth(scenario.task, ex["val"])
    progress.start(f"finetune {scenario.name}", steps)
    best, best_state, history, bad = -np.inf, None, [], 0
    for epoch in range(epochs):
        net.train()
        total, started = 0.0, time.perf_counter()
        for idx in loop.batches(n, p.batch_size, rng):
            xb = torch.from_numpy(inputs[rows["train"][idx]]).to(device)
            yb = head.targets(ex["train"].labels, idx).to(device)
            loss = head.loss(net(xb).float(), yb)
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"scenario '{scenario.name}': training loss is not finite; lower the learning rate"
                )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
            progress.advance(f"finetune {scenario.name}", 1, loss=float(loss.detach()))
        val_logits = loop.predict(net, inputs[rows["val"]], device)
        val_metric = float(metrics.primary_metric(scenario.task, val_truth, _outputs(head, val_logits)))
        history.append(
            {
                "epoch": epoch + 1,
                "train_loss": total / n,
                "val_metric": val_metric,
                "seconds": round(time.perf_counter() - started, 2),
            }
        )
        progress.log(
            f"{scenario.name} epoch {epoch + 1}: train_loss={total / n:.4f} val_{primary}={val_metric:.4f}"
        )
        score = sign * val_metric if np.isfinite(val_metric) else -np.inf
        if best_state is None or score > best:
            best, best_state, bad = score, copy.deepcopy(net.state_dict()), 0
        else:
            bad += 1
            if bad >= p.patience:
                break
    assert best_state is not None
    net.load_state_dict(best_state)
    if spec.task == "recommendation":
        spec.extra["repeat_weight"] = _tune_repeat_weight(
            shared, head, net, inputs, rows["val"], ex["val"], device
        )
        spec.extra["repeat_half_life_days"] = REPEAT_HALF_LIFE_DAYS
        progress.log(f"{scenario.name}: weight of the own purchase history {spec.extra['repeat_weight']}")
    test_logits = loop.predict(net, inputs[rows["test"]], device)
    if mode == "lora":
        merge_lora(model.trunk)
    return model.cpu(), head, history, sign * best, test_logits


def finetune_many(
    cfg: PipelineConfig, scenarios: list[Scenario], progress: Progress
) -> dict[str, dict[str, Any]]:
    """Fine-tune several scenarios with one featurisation pass; each stops on its own validation metric."""
    cache = EventCache(cache_dir(cfg))
    foundation = ws.latest_foundation_dir(cfg)
    fmeta = json.loads((foundation / "model.json").read_text())
    shared = Shared(cfg, cache, fmeta, foundation, FeatureEncoder.from_dict(fmeta["encoder"]))
    prepared = {}
    for sc in scenarios:
        t0 = time.perf_counter()
        prepared[sc.name] = (*prepare(shared, sc), time.perf_counter() - t0)
        progress.log(
            f"{sc.name}: {', '.join(f'{k}={len(v)}' for k, v in prepared[sc.name][1].items())} examples"
        )
    featurise_s = shared.featurise([x for _, ex, _ in prepared.values() for x in ex.values()])
    out = {}
    for sc in scenarios:
        spec, ex, targets_s = prepared[sc.name]
        out[sc.name] = _finish(
            shared, sc, spec, ex, progress, {"targets_s": targets_s, "featurise_s": featurise_s}
        )
    return out


def finetune(cfg: PipelineConfig, scenario: Scenario, progress: Progress) -> dict[str, Any]:
    return finetune_many(cfg, [scenario], progress)[scenario.name]


def _finish(
    shared: Shared,
    scenario: Scenario,
    spec: TargetSpec,
    ex: dict[str, Examples],
    progress: Progress,
    timing: dict,
) -> dict[str, Any]:
    from basemodel_pipeline.inference.explain import add_report_explanation
    from basemodel_pipeline.reports.html import scenario_report

    cfg, task = shared.cfg, scenario.task
    t0 = time.perf_counter()
    model, head, history, best, test_logits = _train(shared, scenario, spec, ex, progress)
    timing["train_s"] = time.perf_counter() - t0
    outputs = {"model": _outputs(head, test_logits, own_history(shared.cache, spec, ex["test"]))}
    t0 = time.perf_counter()
    outputs.update(evaluate_baselines(shared, scenario, spec, ex))
    timing["baselines_s"] = time.perf_counter() - t0
    truth = _truth(task, ex["test"])
    all_metrics = {name: metrics.evaluate(task, truth, o, scenario.k) for name, o in outputs.items()}
    for name in ("popularity",):  # popularity scores rank but are not probabilities: no log-loss
        all_metrics[name] = {
            k: (float("nan") if "log_loss" in k else v) for k, v in all_metrics[name].items()
        }
    metric_name = metrics.PRIMARY_METRIC[task]
    test = {name: m[metric_name] for name, m in all_metrics.items()}
    if task == "recommendation":
        test.setdefault("lightgbm_aggregates", None)  # no LightGBM baseline for ranking the catalogue
    mode = scenario.mode or cfg.training_params.finetune.mode
    result = {
        "metric": metric_name,
        "task": task,
        "mode": mode,
        "test": test,
        "test_metrics": all_metrics,
        "best_val": best,
        "examples": {k: len(v) for k, v in ex.items()},
        "classes": len(spec.classes) or spec.extra.get("n_items", 1),
        "repeat_weight": spec.extra.get("repeat_weight"),
        "history": history,
        "timing_s": {k: round(v, 2) for k, v in timing.items()},
        "test_date": cfg.data_params.test_date.isoformat(),
    }
    big = {k: spec.extra[k] for k in ("items", "popularity") if k in spec.extra}
    small_spec = {k: v for k, v in spec.to_dict().items() if k not in big}
    meta = {
        "kind": "scenario",
        "scenario": scenario.model_dump(mode="json"),
        "target": small_spec,
        "arch": {**shared.fmeta["arch"], "out_dim": spec.out_dim},
        "encoder": shared.fmeta["encoder"],
        "foundation_version": shared.fmeta["version"],
        "metrics": {k: v for k, v in result.items() if k != "history"},
    }
    extra = {
        "metrics.json": json.dumps(result, indent=2),
        "report.html": scenario_report(scenario, result, truth, outputs),
    }
    t0 = time.perf_counter()
    # "what drives the model" in the report, explanation.json beside it
    add_report_explanation(extra, shared, model, head, ex["test"])
    timing["explain_s"] = time.perf_counter() - t0
    if big:
        extra["target.json"] = json.dumps(big)
    if isinstance(scenario.target, PythonTarget):
        from basemodel_pipeline.scenarios.python_target import function_source

        source = function_source(scenario)
        if source is not None:
            extra["target_function.py"] = source
    version, final = publish_checkpoint(ws.scenario_root(cfg, scenario.name), model, meta, extra)
    out = {
        "path": str(final),
        "version": version,
        "report_path": str(final / "report.html"),
        "metric": metric_name,
        "mode": mode,
        **{f"test_{k}": v for k, v in test.items() if v is not None},
        "best_val": best,
        "epochs": len(history),
        "train_examples": len(ex["train"]),
        "classes": result["classes"],
        **{k: round(v, 2) for k, v in timing.items()},
    }
    return out
