"""Foundation model, self-supervised: from an entity's history before a split point, predict its future.

Targets per event source over the horizon after the split: any activity (BCE), log event count and signed
log sums of numeric columns (MSE), and the distribution of each categorical column's channels (soft
cross-entropy, per value or per hash partition), counted only where the entity was active.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.build import cache_dir
from basemodel_pipeline.cache.store import DAY, EventCache
from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.errors import ConfigError
from basemodel_pipeline.features.sketch import FeatureEncoder, SourcePlan
from basemodel_pipeline.model.checkpoint import build_model, publish_checkpoint
from basemodel_pipeline.progress import Progress
from basemodel_pipeline.training import loop, resume
from basemodel_pipeline.training.splits import epoch_seconds, random_split_times

FIELD = "training_params.foundation"
CHUNK_EXAMPLES = 131072  # examples featurised at a time: bounds memory whatever the number of entities


@dataclass
class TargetLayout:
    """Column ranges of the target vector: bce (active), mse (count, numeric sums), softmax groups."""

    bce: list[int]
    mse: list[int]
    groups: list[tuple[int, int]]
    width: int


def target_layout(enc: FeatureEncoder) -> TargetLayout:
    bce, mse, groups, off = [], [], [], 0
    for plan in enc.sources:
        bce.append(off)
        n_num = len(plan.numeric_channels())  # count + numeric columns
        mse.extend(range(off + 1, off + 1 + n_num))
        base = off + 1 + n_num
        for col in plan.columns:
            for a, b in col.groups():
                groups.append((base + a, base + b))
        off = base + plan.channels
    return TargetLayout(bce, mse, groups, off)


def future_targets(
    enc: FeatureEncoder, cache: EventCache, e: np.ndarray, t: np.ndarray, horizon_s: int
) -> np.ndarray:
    """Targets [n, layout.width]: per source [active, log count, numeric..., channel distributions...]."""
    parts = []
    for plan in enc.sources:
        w = enc.window_channels(cache, plan, e, t, t + horizon_s)  # [n, channels]
        count = w[:, 0]
        numeric = [c for c in plan.numeric_channels() if c != 0]
        dist = _normalise_groups(w, plan)
        sums = np.sign(w[:, numeric]) * np.log1p(np.abs(w[:, numeric]))
        parts.append(np.column_stack([(count > 0), np.log1p(count), sums, dist]))
    return np.concatenate(parts, 1).astype(np.float32)


def _normalise_groups(w: np.ndarray, plan: SourcePlan) -> np.ndarray:
    dist = np.zeros_like(w)
    for col in plan.columns:
        for a, b in col.groups():
            total = w[:, a:b].sum(1, keepdims=True)
            dist[:, a:b] = np.divide(w[:, a:b], total, out=np.zeros_like(w[:, a:b]), where=total > 0)
    return dist


def make_loss(layout: TargetLayout):
    bce_idx, mse_idx = torch.tensor(layout.bce), torch.tensor(layout.mse)

    def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.binary_cross_entropy_with_logits(out[:, bce_idx], y[:, bce_idx])
        loss = loss + nn.functional.mse_loss(out[:, mse_idx], y[:, mse_idx])
        active = y[:, layout.bce[0]]
        if layout.groups:
            ce = 0.0
            for a, b in layout.groups:
                ce = ce + -(y[:, a:b] * torch.log_softmax(out[:, a:b], 1)).sum(1)
            loss = loss + (ce * active).sum() / active.sum().clamp_min(1.0) / len(layout.groups)
        return loss

    return loss_fn


def fit_encoder(cache: EventCache, cfg: PipelineConfig) -> FeatureEncoder:
    p = cfg.training_params.foundation
    return FeatureEncoder.fit(
        cache,
        p.half_lives_days,
        p.max_direct_vocab,
        p.sketch_partitions,
        p.sketch_width,
        p.seed,
        p.aggregate_features,
    )


def _has_history(cache: EventCache, enc: FeatureEncoder, e: np.ndarray, t: np.ndarray) -> np.ndarray:
    keep = np.zeros(len(e), bool)
    for plan in enc.sources:
        src = cache.source(plan.name)
        keep |= src.positions(e, t) > src.offsets[e]
    return keep


def pretrain(cfg: PipelineConfig, progress: Progress) -> dict[str, Any]:
    p, dp = cfg.training_params.foundation, cfg.data_params
    cache = EventCache(cache_dir(cfg))
    horizon = p.horizon_days * DAY
    lo, hi = epoch_seconds(dp.first_split), epoch_seconds(dp.validation_start_date) - horizon
    if hi < lo:
        raise ConfigError(
            f"{FIELD}.horizon_days: {p.horizon_days} days do not fit between training_start_date "
            f"({dp.first_split}) and validation_start_date ({dp.validation_start_date}); shorten it"
        )
    val_end = epoch_seconds(dp.training_end_date) - horizon
    if val_end < epoch_seconds(dp.validation_start_date):
        raise ConfigError(f"{FIELD}.horizon_days: {p.horizon_days} days do not fit in the validation period")
    started = time.perf_counter()
    torch.manual_seed(p.seed)
    loop.set_threads()
    device = loop.pick_device(p.device)
    enc = fit_encoder(cache, cfg)
    layout = target_layout(enc)

    def examples(e: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keep = _has_history(cache, enc, e, t)
        e, t = e[keep], t[keep]
        return enc.history(cache, e, t), future_targets(enc, cache, e, t, horizon)

    val_times = np.arange(epoch_seconds(dp.validation_start_date), val_end + 1, 7 * DAY)
    n_val = min(cache.n_entities, p.validation_entities)
    val_entities = np.sort(np.random.default_rng([p.seed, 7]).choice(cache.n_entities, n_val, replace=False))
    Xv, Yv = examples(np.repeat(val_entities, len(val_times)), np.tile(val_times, n_val))
    if len(Xv) == 0:
        raise ConfigError(
            f"{FIELD}: no entity has history before the validation split points; check data_params"
        )
    arch = {
        "in_dim": enc.dim,
        "hidden_dim": p.hidden_dim,
        "num_blocks": p.num_blocks,
        "dropout": p.dropout,
        "out_dim": layout.width,
    }
    model = build_model(arch).to(device)
    loss_fn = make_loss(layout)
    per_epoch = cache.n_entities * p.split_points_per_entity
    chunk_entities = max(1, CHUNK_EXAMPLES // p.split_points_per_entity)
    n_chunks = -(-cache.n_entities // chunk_entities)
    total_steps = p.epochs * (-(-per_epoch // p.batch_size) + n_chunks)
    opt, sched = loop.optimizer_and_schedule(
        model, p.learning_rate, p.weight_decay, p.warmup_steps, total_steps
    )
    progress.start("pretrain", total_steps)
    state_dir = ws.foundation_root(cfg) / ".resume"
    key = resume.state_key(
        p.model_dump(mode="json"),
        cfg.data_params.model_dump(mode="json"),
        cache.manifest["fingerprint"],
        cache.manifest["created"],  # a rebuilt cache (new data) starts afresh
    )
    run = resume.new_run_info()
    kept: dict[str, Any] = {"best_state": None}  # best weights so far (read by the step callback)
    resumed = resume.load_state(state_dir, key, model, opt, sched)
    if resumed is not None:
        run, kept["best_state"] = resumed
        progress.log(f"resuming from step {run['step']} (epoch {run['epoch'] + 1}, batch {run['batch']})")
        progress.advance("pretrain", run["step"])
    feat_s = 0.0
    for epoch in range(run["epoch"], p.epochs):
        # everything random in an epoch derives from (seed, epoch[, chunk]): a resumed run replays it exactly
        erng = np.random.default_rng([p.seed, epoch])
        e_all, t_all = random_split_times(cache.n_entities, p.split_points_per_entity, lo, hi, erng)
        keep = _has_history(cache, enc, e_all, t_all)
        e_all, t_all = e_all[keep], t_all[keep]
        if len(e_all) == 0:
            raise ConfigError(
                f"{FIELD}: the training window is empty (no entity has events before its split points)"
            )
        chunk_of = np.empty(cache.n_entities, np.int64)
        chunk_of[erng.permutation(cache.n_entities)] = np.arange(cache.n_entities) // chunk_entities
        by_chunk = np.argsort(chunk_of[e_all], kind="stable")
        bounds = np.searchsorted(chunk_of[e_all][by_chunk], np.arange(n_chunks + 1))
        done = 0
        for ci in range(n_chunks):
            sel = by_chunk[bounds[ci] : bounds[ci + 1]]
            n_batches = -(-len(sel) // p.batch_size)
            if run["batch"] >= done + n_batches:  # finished before an interruption
                done += n_batches
                continue
            t0 = time.perf_counter()
            X, Y = examples(e_all[sel], t_all[sel])
            feat_s += time.perf_counter() - t0
            if run["step"] == 0:
                model.trunk.set_stats(
                    torch.from_numpy(X.mean(0)).to(device), torch.from_numpy(X.std(0)).to(device)
                )

            def on_step(loss: float, n: int, epoch: int = epoch) -> None:
                run.update(
                    epoch=epoch,
                    batch=run["batch"] + 1,
                    step=run["step"] + 1,
                    loss_sum=run["loss_sum"] + loss * n,
                    loss_count=run["loss_count"] + n,
                )
                progress.advance("pretrain", 1, loss=loss)
                if p.checkpoint_every_steps and run["step"] % p.checkpoint_every_steps == 0:
                    resume.save_state(state_dir, key, model, opt, sched, kept["best_state"], run)

            loop.train_epoch(
                model,
                X,
                Y,
                loss_fn,
                opt,
                sched,
                p.batch_size,
                np.random.default_rng([p.seed, epoch, ci]),
                device,
                on_step=on_step,
                skip_batches=run["batch"] - done,
            )
            done += n_batches
            run["n_examples"] += len(sel)
            del X, Y
        train_loss = run["loss_sum"] / max(run["loss_count"], 1)
        with torch.no_grad():
            val_loss = float(loss_fn(torch.from_numpy(loop.predict(model, Xv, device)), torch.from_numpy(Yv)))
        run["history"].append({"epoch": epoch + 1, "train_loss": train_loss, "val_loss": val_loss})
        progress.log(f"epoch {epoch + 1}: train_loss={train_loss:.4f} val_loss={val_loss:.4f}")
        if val_loss < run["best"]:
            run["best"], kept["best_state"] = val_loss, copy.deepcopy(model.state_dict())
        run.update(epoch=epoch + 1, batch=0, loss_sum=0.0, loss_count=0)
        if p.checkpoint_every_steps:
            resume.save_state(state_dir, key, model, opt, sched, kept["best_state"], run)
    history, best, n_examples, best_state = run["history"], run["best"], run["n_examples"], kept["best_state"]
    assert best_state is not None
    model.load_state_dict(best_state)
    wall = time.perf_counter() - started
    meta = {
        "kind": "foundation",
        "arch": arch,
        "encoder": enc.to_dict(),
        "horizon_days": p.horizon_days,
        "cache_fingerprint": cache.manifest["fingerprint"],
        "history": history,
        "best_val_loss": best,
    }
    version, final = publish_checkpoint(ws.foundation_root(cfg), model, meta)
    resume.clear_state(state_dir)
    events = sum(s.n_events for s in cache.sources.values())
    return {
        "path": str(final),
        "version": version,
        "train_loss": history[-1]["train_loss"],
        "val_loss": best,
        "epochs": len(history),
        "examples": n_examples,
        "input_dim": enc.dim,
        "wall_s": round(wall, 2),
        "featurise_s": round(feat_s, 2),
        "train_events_per_s": round(events * len(history) / wall, 1),
    }
