"""Scenario fine-tuning from the foundation checkpoint, with per-scenario early stopping, and evaluation of
the model beside the popularity and hand-crafted-aggregates + LightGBM baselines on the same temporal split.

Modes: ``frozen`` (the trunk's outputs are computed once, then only the head trains: seconds per epoch even
with thousands of labels), ``full`` (everything trains), ``lora`` (low-rank adapters on the trunk's linear
layers + the head; merged into the weights before saving). ``finetune_many`` featurises the union of all
the scenarios' examples in one pass over the event cache, then trains each head with its own stopping point.
The baselines that need no network are read from the scenario's stage when its CPU step fitted them
(training/baselines.py, scenarios/staging.py), and fitted here otherwise: the same models either way.
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

from basemodel_pipeline import runtime
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.cache.versions import data_version as cache_data_version
from basemodel_pipeline.cache.windows import windows_metadata
from basemodel_pipeline.config import PipelineConfig, Scenario
from basemodel_pipeline.config.models import PythonTarget
from basemodel_pipeline.config.params import FinetuneParams
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.evaluation import metrics
from basemodel_pipeline.features.sketch import FeatureEncoder
from basemodel_pipeline.model.checkpoint import build_model, load_trunk_state, publish_checkpoint, read_meta
from basemodel_pipeline.model.trunk import TrunkWithHead
from basemodel_pipeline.progress import Progress
from basemodel_pipeline.scenarios import staging
from basemodel_pipeline.scenarios.candidates import Blend, Candidate, Context, LightGBM, Neural, Popularity
from basemodel_pipeline.scenarios.examples import (
    Examples,
    SparseLabels,
    TargetSpec,
    concat_examples,
    dense_labels,
)
from basemodel_pipeline.scenarios.heads import REPEAT_HALF_LIFE_DAYS, REPEAT_WEIGHTS, Head
from basemodel_pipeline.scenarios.inputs import Rows, RowView, _Embed
from basemodel_pipeline.scenarios.lora import add_lora, merge_lora
from basemodel_pipeline.scenarios.rerank import (
    RANKED_ITEMS,
    NeuralRanking,
    RecommendPopularity,
    RepeatPurchases,
    Reranker,
)
from basemodel_pipeline.scenarios.selection import Selection, choose, primary, split_validation
from basemodel_pipeline.scenarios.targets import build_examples, choose_classes
from basemodel_pipeline.training.splits import scenario_split_times
from basemodel_pipeline.training.work import WorkCounter
from basemodel_pipeline.workspace import cache_dir

SMALL_ENTITIES = 1000  # fewer entities: the "small" data regime (data_regime)
HURDLE_ZERO_SHARE = 0.1  # regression: a non-negative target zero in at least this share of rows -> hurdle
FEATURISE_BLOCK = 32768  # examples featurised (on the training device) and copied to host memory at a time
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
    E: np.ndarray | None = None  # frozen trunk embeddings (residual stream) of X
    regime: str = "standard"
    available: dict[str, dict[str, int]] = field(default_factory=dict)  # examples per split before the caps

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
        device = runtime.resolve_device(self.cfg.training_params.foundation.device)  # the GPU featurises too
        self.X = np.empty((len(self.keys), self.enc.dim), np.float32)  # filled block by block: one copy
        for a in range(0, len(self.keys), FEATURISE_BLOCK):
            k = self.keys[a : a + FEATURISE_BLOCK]
            block = self.enc.history_t(self.cache, k[:, 0], k[:, 1], FEATURISE_BLOCK, device)
            # rounded to float16 as the per-entity state stores features: training sees what scoring will see
            self.X[a : a + len(k)] = block.half().float().cpu().numpy()
        return time.perf_counter() - t0

    def trunk_outputs(self, device: torch.device) -> np.ndarray:
        if self.H is None:
            model = self.new_model(1).to(device)
            assert self.X is not None
            self.H = runtime.predict(model.trunk, self.X, device)
        return self.H

    def embeddings(self, device: torch.device) -> np.ndarray:
        if self.E is None:
            model = self.new_model(1).to(device)
            assert self.X is not None
            self.E = runtime.predict(_Embed(model), self.X, device)
        return self.E

    def rows_of(self, ex: Examples, model: TrunkWithHead, mode: str) -> Rows:
        """The candidates' view of examples: features, labels and the trained network. With a frozen trunk
        the network's outputs and the embeddings come from the shared trunk passes."""
        assert self.X is not None
        idx = self.rows(ex)
        device = runtime.resolve_device(self.cfg.training_params.foundation.device)
        rows = Rows(self.cache, self.enc, ex.entity, ex.time, RowView(self.X, idx), ex.labels, model, device)
        if mode == "frozen":
            rows.memo["logits"] = runtime.predict(model.head, self.trunk_outputs(device)[idx], device)
            rows.memo["embedding"] = self.embeddings(device)[idx]
        return rows

    def plain_rows(self, ex: Examples) -> Rows:
        """The candidates' view of examples without the network (aggregates, cache): the baselines'."""
        assert self.X is not None
        return Rows(self.cache, self.enc, ex.entity, ex.time, RowView(self.X, self.rows(ex)), ex.labels)

    def stage_key(self, scenario: Scenario) -> str:
        """The key of the scenario's staged baselines for this cache and encoder (scenarios/staging.py)."""
        version = cache_data_version(self.cache.manifest)
        return staging.stage_key(self.cfg, scenario, version, self.fmeta["encoder"])

    def new_model(self, out_dim: int) -> TrunkWithHead:
        model = build_model({**self.fmeta["arch"], "out_dim": out_dim})
        model.trunk.load_state_dict(load_trunk_state(self.foundation))
        return model


def open_shared(cfg: PipelineConfig, progress: Progress) -> Shared:
    """The cache and the latest foundation (its feature encoder), before any featurisation."""
    cache = EventCache(cache_dir(cfg))
    foundation = ws.latest_foundation_dir(cfg)
    fmeta = read_meta(foundation)
    shared = Shared(cfg, cache, fmeta, foundation, FeatureEncoder.from_dict(fmeta["encoder"]))
    shared.regime = data_regime(cache.n_entities)
    progress.log(f"data regime: {shared.regime}")
    return shared


def split_parts(ex: dict[str, Examples]) -> dict[str, Examples]:
    """train, stop (early stopping) and select (the comparison): the validation examples' two entity halves."""
    stop_idx, select_idx = split_validation(ex["val"].entity)
    return {"train": ex["train"], "stop": ex["val"].subset(stop_idx), "select": ex["val"].subset(select_idx)}


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
    shared.available[scenario.name] = {k: len(v) for k, v in ex.items()}
    ex = cap_examples(ex, shared.cfg.training_params.finetune)
    for k, v in ex.items():
        _check_split(scenario.name, k, v, scenario.task)
    if scenario.task == "regression":
        spec.extra.update(regression_extra(np.asarray(ex["train"].labels, np.float64)))
    return spec, ex


def cap_examples(ex: dict[str, Examples], p: FinetuneParams) -> dict[str, Examples]:
    """Each split at most its cap of examples (finetune.max_*_examples), drawn uniformly without replacement
    from (seed, split), in their original order; splits under their cap are returned as they are."""
    caps = {"train": p.max_train_examples, "val": p.max_validation_examples, "test": p.max_test_examples}
    out = {}
    for i, (k, v) in enumerate(ex.items()):
        cap = caps.get(k, len(v))
        if len(v) <= cap:
            out[k] = v
            continue
        out[k] = v.subset(np.sort(np.random.default_rng([p.seed, 11, i]).choice(len(v), cap, replace=False)))
    return out


def data_regime(entities: int) -> str:
    """How much a network can learn here, said in the log and the report. Below SMALL_ENTITIES entities the
    foundation sees too few histories to beat trees on aggregates reliably (the tiny test data set: 60
    households, the network's validation AUROC below 0.5); the selection then falls back to LightGBM, a blend
    or a baseline on validation windows, and never publishes the network on faith."""
    if entities < SMALL_ENTITIES:
        return (
            f"small ({entities:,} entities, fewer than {SMALL_ENTITIES:,}): the network may not learn enough; "
            "LightGBM, a blend or a baseline is published when validation says so"
        )
    return f"standard ({entities:,} entities)"


def regression_extra(y: np.ndarray) -> dict[str, Any]:
    """What a regression head needs from its training labels: mean/std, the range its outputs keep to, and
    whether to use the hurdle (a non-negative target that is zero in at least HURDLE_ZERO_SHARE of rows)."""
    out: dict[str, Any] = {
        "mean": float(y.mean()),
        "std": float(y.std() + 1e-6),
        "min": float(y.min()),
        "max": float(y.max()),
    }
    pos = y[y > 0]
    if y.min() >= 0 and np.mean(y == 0) >= HURDLE_ZERO_SHARE and len(pos) >= 2:
        out.update(
            hurdle=True,
            positive_share=float(len(pos) / len(y)),
            positive_mean=float(pos.mean()),
            positive_std=float(pos.std() + 1e-6),
        )
    return out


# ---- evaluation ------------------------------------------------------------------------------------
def _truth(task: str, ex: Examples) -> Any:
    if task == "recommendation":
        lab = ex.labels
        assert isinstance(lab, SparseLabels)
        return (lab.indptr, lab.indices, lab.n_cols)
    return dense_labels(ex.labels) if task == "multilabel" else ex.labels


def _network_outputs(head: Head, logits: np.ndarray) -> np.ndarray:
    """The network's metric-ready outputs (early stopping): scores, or its top items for recommendation."""
    if head.task == "recommendation":
        return head.top_items(logits, RANKED_ITEMS)[0]
    return head.scores(logits)


def _tune_repeat_weight(ctx: Context, rows: Rows) -> float:
    """The weight of the entity's own history in the network's recommendation scores that maximises NDCG@10
    on (a sample of) the early-stopping rows."""
    rng = np.random.default_rng(0)
    part = rows.subset(np.sort(rng.choice(len(rows), min(len(rows), REPEAT_TUNE_EXAMPLES), replace=False)))
    score = {
        w: primary("recommendation", part.labels, NeuralRanking(ctx, w).predict(part)) for w in REPEAT_WEIGHTS
    }
    return max(score, key=lambda w: (score[w], -w))


def candidate_models(ctx: Context, names: list[str] | None) -> dict[str, Candidate]:
    """The candidates a scenario fits (scenarios/candidates.py, scenarios/rerank.py), the baselines included."""
    if ctx.task == "recommendation":
        pool: dict[str, Candidate] = {
            "neural": NeuralRanking(ctx),
            "repeat_purchases": RepeatPurchases(ctx),
            "popularity": RecommendPopularity(ctx),
            "reranker": Reranker(ctx),
        }
    else:
        pool = {
            "neural": Neural(ctx),
            "lightgbm_hybrid": LightGBM(ctx, "hybrid"),
            "lightgbm_aggregates": LightGBM(ctx, "aggregates"),
            "popularity": Popularity(ctx),
        }
    baseline = set(staging.BASELINES)
    if names is None and ctx.task in ("multilabel", "multiclass"):
        # a LightGBM per label (or a softmax over 20 classes) twice doubles or triples the scenario's time, and
        # on aggregates + embedding it tied LightGBM on aggregates (nycflights13 destinations: 0.8487 both;
        # CJ favourite department); list it in `candidates:` to fit it
        names = ["neural"]
    return {k: v for k, v in pool.items() if names is None or k in names or k in baseline}


# ---- training --------------------------------------------------------------------------------------
def _train(
    shared: Shared,
    scenario: Scenario,
    spec: TargetSpec,
    ex: dict[str, Examples],
    progress: Progress,
    fixed_epochs: int | None = None,
) -> tuple[TrunkWithHead, Head, list[dict], float]:
    """Train one scenario's network, early-stopped on ex["val"]; returns (model with the best epoch's weights,
    head, history, best validation metric). ``fixed_epochs``: exactly that many epochs, the last one kept
    (a refit on more windows for the epochs early stopping chose)."""
    p = shared.cfg.training_params.finetune
    mode = scenario.mode or p.mode
    epochs = fixed_epochs or scenario.epochs or p.epochs
    lr = scenario.learning_rate or p.learning_rate
    torch.manual_seed(p.seed)
    runtime.set_threads()
    device = runtime.resolve_device(shared.cfg.training_params.foundation.device)
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
        for idx in runtime.batches(n, p.batch_size, rng):
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
        val_logits = runtime.predict(net, inputs[rows["val"]], device)
        val_metric = float(
            metrics.primary_metric(scenario.task, val_truth, _network_outputs(head, val_logits))
        )
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
        if best_state is None or score > best or fixed_epochs is not None:
            best, best_state, bad = score, copy.deepcopy(net.state_dict()), 0
        else:
            bad += 1
            if bad >= p.patience:
                break
    assert best_state is not None
    net.load_state_dict(best_state)
    if mode == "lora":
        merge_lora(model.trunk)
    return model.cpu(), head, history, sign * best


def finetune_many(
    cfg: PipelineConfig, scenarios: list[Scenario], progress: Progress, keep_outputs: bool = False
) -> dict[str, dict[str, Any]]:
    """Fine-tune several scenarios with one featurisation pass; each stops on its own validation metric.
    ``keep_outputs``: each result also holds "test_outputs" (every candidate's test outputs) and "test_truth"
    (bench/bench_quality.py computes paired intervals from them)."""
    shared = open_shared(cfg, progress)
    prepared = {}
    for sc in scenarios:
        t0 = time.perf_counter()
        prepared[sc.name] = (*prepare(shared, sc), time.perf_counter() - t0)
        sizes = ", ".join(
            f"{k}={len(v):,}"
            + (f" (of {shared.available[sc.name][k]:,})" if len(v) < shared.available[sc.name][k] else "")
            for k, v in prepared[sc.name][1].items()
        )
        progress.log(f"{sc.name}: {sizes} examples")
    featurise_s = shared.featurise([x for _, ex, _ in prepared.values() for x in ex.values()])
    counter = WorkCounter(shared.cache, [plan.name for plan in shared.enc.sources])
    # every distinct (entity, time) example, featurised once
    counter.add(shared.keys[:, 0], shared.keys[:, 1])
    done = counter.summary(featurise_s)
    work = {
        "featurise_examples": done["examples"],
        "featurise_history_events": done["history_events"],
        "featurise_examples_per_s": done["examples_per_s"],
        "featurise_history_events_per_s": done["history_events_per_s"],
    }
    out = {}
    for sc in scenarios:
        spec, ex, targets_s = prepared[sc.name]
        timing = {"targets_s": targets_s, "featurise_s": featurise_s}
        out[sc.name] = _finish(shared, sc, spec, ex, progress, timing, dict(work), keep_outputs)
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
    work: dict,
    keep_outputs: bool = False,
) -> dict[str, Any]:
    """Train the network, fit the other candidates, choose on validation, score the test window once,
    publish the checkpoint with the chosen candidate and write the report."""
    from basemodel_pipeline.reports.explanations import add_report_explanation
    from basemodel_pipeline.reports.html import scenario_report

    cfg, task = shared.cfg, scenario.task
    parts = split_parts(ex)
    t0 = time.perf_counter()
    model, head, history, best = _train(
        shared, scenario, spec, {"train": parts["train"], "val": parts["stop"]}, progress
    )
    timing["train_s"] = time.perf_counter() - t0
    # examples the network trained on, all epochs (features come from the shared featurisation pass)
    work["train_examples_per_s"] = round(len(parts["train"]) * len(history) / max(timing["train_s"], 1e-9), 1)
    ctx = Context(scenario, spec, head, cfg.training_params.finetune.seed, progress)
    mode = scenario.mode or cfg.training_params.finetune.mode
    model.to(runtime.resolve_device(cfg.training_params.foundation.device))
    rows = {k: shared.rows_of(v, model, mode) for k, v in {**parts, "test": ex["test"]}.items()}
    candidates = candidate_models(ctx, scenario.candidates)
    if task == "recommendation":
        spec.extra["repeat_half_life_days"] = REPEAT_HALF_LIFE_DAYS
        weight = _tune_repeat_weight(ctx, rows["stop"])
        spec.extra["repeat_weight"] = weight
        candidates["neural"] = NeuralRanking(ctx, weight)
        progress.log(f"{scenario.name}: weight of the own purchase history {weight}")
    stage, stage_info = _staged_baselines(shared, scenario, rows, progress)
    if stage is not None:  # fitted by the scenario's CPU step (run_baselines): read, not fitted again
        candidates.update({k: v for k, v in stage.candidates(ctx).items() if k in candidates})
    staged = stage.select if stage is not None else {}
    fit_s: dict[str, float] = {}
    for name, cand in candidates.items():
        if name == "neural" or name in staged:
            continue
        t0 = time.perf_counter()
        progress.log(f"{scenario.name}: fitting candidate {name} on {len(rows['train']):,} training examples")
        cand.fit(rows["train"], rows["stop"])
        fit_s[name] = round(time.perf_counter() - t0, 2)
        progress.log(f"{scenario.name}: {name} fitted in {fit_s[name]} s")
    t0 = time.perf_counter()
    select = rows["select"]
    y_select = select.labels if task == "recommendation" else _truth(task, parts["select"])
    val_out = {
        name: staged[name] if name in staged else cand.predict(select) for name, cand in candidates.items()
    }
    fitted = [n for n in ("neural", "lightgbm_hybrid", "lightgbm_aggregates") if n in candidates]
    if task in ("multilabel", "multiclass") and len(fitted) > 2:
        # one weight per model, thousands of labels: the blend joins the network and the better LightGBM. For
        # binary and regression all three (CJ, 3 seeds: churn 0.8554 vs 0.8544 AUROC with two, spend 1.4293 vs
        # 1.4363 RMSE: the two LightGBMs err differently enough to help)
        gbm = [n for n in fitted if n != "neural"]
        scores = {n: primary(task, y_select, val_out[n]) for n in gbm}
        fitted = ["neural", max(gbm, key=lambda n: scores[n] if np.isfinite(scores[n]) else -np.inf)]
    members = [] if task == "recommendation" else fitted
    selection, published = choose(
        ctx, candidates, val_out, y_select, select.entity, members, scenario.publish
    )
    timing["select_s"] = time.perf_counter() - t0
    progress.log(f"{scenario.name}: published {selection.published}: {selection.reason}")
    # the test window, scored once, after the choice
    t0 = time.perf_counter()
    staged_test = stage.test if stage is not None else {}
    outputs = {
        name: staged_test[name] if name in staged_test else cand.predict(rows["test"])
        for name, cand in candidates.items()
    }
    if "blend" in selection.validation:  # reported even when another candidate is published
        blend = published if selection.published == "blend" else _blend_of(ctx, candidates, selection)
        outputs["blend"] = blend.predict(rows["test"])
    outputs = {"model": outputs[selection.published], **outputs}
    timing["test_s"] = time.perf_counter() - t0
    timing["candidates_fit_s"] = sum(fit_s.values())
    refit_info: dict[str, Any] = {}
    if cfg.training_params.finetune.refit_on_validation:
        t0 = time.perf_counter()
        model, outputs["model"] = _refit(
            shared, scenario, spec, parts, ex["test"], model, history, published, progress
        )
        timing["refit_s"] = time.perf_counter() - t0
        refit_info = {"refit_on_validation": True, "windows": "training + validation"}
    truth = _truth(task, ex["test"])
    log1p = bool(spec.extra.get("log1p"))
    all_metrics = {name: metrics.evaluate(task, truth, o, scenario.k, log1p) for name, o in outputs.items()}
    for name in ("popularity",):  # popularity scores rank but are not probabilities: no log-loss
        if name in all_metrics:
            all_metrics[name] = {
                k: (float("nan") if "log_loss" in k else v) for k, v in all_metrics[name].items()
            }
    metric_name = metrics.PRIMARY_METRIC[task]
    test = {name: m[metric_name] for name, m in all_metrics.items()}
    if task == "recommendation":
        test.setdefault("lightgbm_aggregates", None)  # no LightGBM on aggregates for ranking the catalogue
    result = {
        "metric": metric_name,
        "task": task,
        "mode": mode,
        "published": selection.published,
        "selection": selection.to_dict(),
        "test": test,
        "test_metrics": all_metrics,
        "best_val": best,
        "examples": {
            "train": len(ex["train"]),
            "stop": len(parts["stop"]),
            "select": len(parts["select"]),
            "test": len(ex["test"]),
            "available": shared.available.get(scenario.name, {}),  # before finetune.max_*_examples
        },
        "classes": len(spec.classes) or spec.extra.get("n_items", 1),
        "repeat_weight": spec.extra.get("repeat_weight"),
        "regime": shared.regime,
        **({"refit": refit_info} if refit_info else {}),
        "history": history,
        "candidates_fit_s": fit_s,
        # multilabel LightGBM: the row bound and the rows each per-label booster trained on
        "lightgbm_rows": {
            name: cand.gbm.sampling()
            for name, cand in candidates.items()
            if task == "multilabel" and isinstance(cand, LightGBM) and cand.gbm is not None
        },
        "baselines": stage_info,
        "timing_s": {k: round(v, 2) for k, v in timing.items()},
        "work": work,  # training/work.py
        "test_date": cfg.data_params.test_date.isoformat(),
        "windows": windows_metadata(cfg),
        "foundation_version": shared.fmeta["version"],
        "cache_data_version": cache_data_version(shared.cache.manifest),
    }
    if cfg.training_params.finetune.refit_on_all:  # after the test measurement: the newest weeks too
        t0 = time.perf_counter()
        model, _ = _refit(
            shared,
            scenario,
            spec,
            {**parts, "test": ex["test"]},
            ex["test"],
            model,
            history,
            published,
            progress,
        )
        result["timing_s"]["refit_all_s"] = round(time.perf_counter() - t0, 2)
        result["refit"] = {
            **result.get("refit", {}),
            "refit_on_all": True,
            "windows": "training + validation + test",
            "test_metrics": "of the model before this refit (the refitted model has seen the test window)",
        }
    big = {k: spec.extra[k] for k in ("items", "popularity") if k in spec.extra}
    small_spec = {k: v for k, v in spec.to_dict().items() if k not in big}
    published_meta, published_files = published.save()
    meta = {
        "kind": "scenario",
        "scenario": scenario.model_dump(mode="json"),
        "target": small_spec,
        "arch": {**shared.fmeta["arch"], "out_dim": spec.out_dim},
        "encoder": shared.fmeta["encoder"],
        "foundation_version": shared.fmeta["version"],
        "cache_fingerprint": shared.cache.manifest["fingerprint"],
        "published": {"name": selection.published, **published_meta},
        "metrics": {k: v for k, v in result.items() if k != "history"},
    }
    extra: dict[str, str | bytes] = {
        "metrics.json": json_dumps(result),
        "report.html": scenario_report(scenario, result, truth, outputs),
        **{f"candidates/{k}": v for k, v in published_files.items()},
    }
    t0 = time.perf_counter()
    # "what drives the model" in the report (the network's view), explanation.json beside it
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
    kept = {"test_outputs": outputs, "test_truth": truth} if keep_outputs else {}
    return {
        **kept,
        "path": str(final),
        "version": version,
        "report_path": str(final / "report.html"),
        "metric": metric_name,
        "mode": mode,
        "published": selection.published,
        **{f"test_{k}": v for k, v in test.items() if v is not None},
        **{f"val_{k}": v for k, v in selection.validation.items()},
        "best_val": best,
        "epochs": len(history),
        "train_examples": len(ex["train"]),
        "classes": result["classes"],
        **{k: round(v, 2) for k, v in timing.items()},
        **work,
        **{f"windows.{k}": v for k, v in result["windows"].items()},
        "foundation_version": result["foundation_version"],
        "cache_data_version": result["cache_data_version"],
        "baselines_reused": stage_info["reused"],
    }


def _staged_baselines(
    shared: Shared, scenario: Scenario, rows: dict[str, Rows], progress: Progress
) -> tuple[staging.Stage | None, dict[str, Any]]:
    """The scenario's staged baselines for exactly these inputs and rows, or None (then fitted inline)."""
    key = shared.stage_key(scenario)
    path = staging.stage_path(shared.cfg, scenario.name, key)
    stage = staging.read(path, staging.rows_digest(rows))
    if stage is None:
        progress.log(f"{scenario.name}: no staged baselines for key {key}: fitting them here")
        return None, {"reused": False, "key": key}
    progress.log(f"{scenario.name}: baselines {', '.join(stage.saved)} read from {path}")
    return stage, {"reused": True, "key": key, "fit_s": stage.fit_s}  # no path: checkpoints stay movable


def _uses_network(cand: Candidate) -> bool:
    if isinstance(cand, Blend):
        return any(_uses_network(m) for m in cand.members)
    return isinstance(cand, (Neural, NeuralRanking, Reranker))


def _refit(
    shared: Shared,
    scenario: Scenario,
    spec: TargetSpec,
    parts: dict[str, Examples],
    test: Examples,
    model: TrunkWithHead,
    history: list[dict],
    published: Candidate,
    progress: Progress,
) -> tuple[TrunkWithHead, Any]:
    """The published candidate trained again on the training and validation windows together (and the test
    window when `parts` holds "test": finetune.refit_on_all), for the epochs / rounds early stopping chose
    (finetune.refit_on_validation). Returns (network, its test outputs)."""
    mode = scenario.mode or shared.cfg.training_params.finetune.mode
    labelled = [parts["train"], parts["stop"], parts["select"], *([parts["test"]] if "test" in parts else [])]
    everything = concat_examples(labelled)
    if _uses_network(published):
        sign = 1.0 if metrics.higher_is_better(metrics.PRIMARY_METRIC[scenario.task]) else -1.0
        scores = [sign * h["val_metric"] if np.isfinite(h["val_metric"]) else -np.inf for h in history]
        epochs = int(np.argmax(scores)) + 1
        progress.log(
            f"{scenario.name}: refitting the network on {len(everything):,} examples for {epochs} epochs"
        )
        model = _train(
            shared, scenario, spec, {"train": everything, "val": parts["select"]}, progress, epochs
        )[0]
        model.to(runtime.resolve_device(shared.cfg.training_params.foundation.device))
    # the re-ranker learns from validation windows only (rerank.Reranker.fit): all of them now
    windows = concat_examples(labelled[1:]) if scenario.task == "recommendation" else everything
    progress.log(f"{scenario.name}: refitting {type(published).__name__} on {len(windows):,} examples")
    published.refit(shared.rows_of(windows, model, mode))
    rows = shared.rows_of(test, model, mode)
    return model, (published.rank(rows)[0] if scenario.task == "recommendation" else published.predict(rows))


def _blend_of(ctx: Context, candidates: dict[str, Candidate], selection: Selection) -> Blend:
    """The blend the selection fitted (for the report when another candidate is published)."""
    info = selection.blend
    blend = Blend(ctx, [candidates[m] for m in info["members"]])
    blend.weights = np.asarray(info["weights"], np.float64)
    blend.scale, blend.intercept = float(info.get("scale", 1.0)), float(info["intercept"])
    return blend


def json_dumps(obj: Any) -> str:
    """JSON with NaN and infinities written as null (strict JSON: other tools refuse bare NaN)."""
    return json.dumps(_finite(obj), indent=2, allow_nan=False)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    if isinstance(obj, np.floating | np.integer):
        return _finite(obj.item())
    return obj
