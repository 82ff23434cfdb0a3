"""Foundation model, self-supervised: from an entity's history before a split point, predict its future.

Targets per event source over the horizon after the split: any activity (BCE), log event count and signed
log sums of numeric columns (MSE), and the distribution of each categorical column's channels (soft
cross-entropy per value block or per sketch partition), counted only where the entity was active.

An epoch draws random split points (whole days) for a sample of entities (training/calibrate.py sizes it),
featurises them chunk by chunk (features/kernels.py; optionally one chunk ahead in a background thread) and
takes optimizer steps on each chunk. Everything random in an epoch derives from (seed, epoch[, chunk]), so a
run resumed from its last saved state replays exactly what the interrupted run would have done.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from basemodel_pipeline import locks, runtime
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.store import EventCache, expand_ranges_t
from basemodel_pipeline.cache.versions import data_version as cache_data_version
from basemodel_pipeline.cache.windows import windows_metadata
from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.config.params import FoundationParams
from basemodel_pipeline.dates import DAY, epoch_seconds
from basemodel_pipeline.errors import ConfigError
from basemodel_pipeline.features.kernels import new_day, source_tensors
from basemodel_pipeline.features.sketch import FeatureEncoder
from basemodel_pipeline.model.checkpoint import CheckpointMeta, TrunkConfig, build_model, publish_checkpoint
from basemodel_pipeline.progress import NullProgress, Progress
from basemodel_pipeline.training import fit, loop, promotion, resume
from basemodel_pipeline.training.calibrate import Sizes, calibrate
from basemodel_pipeline.training.distributed import World, init_world, shutdown
from basemodel_pipeline.training.epochs import EpochRunner
from basemodel_pipeline.workspace import cache_dir

FIELD = "training_params.foundation"
ACTIVITY_DAYS = (7, 14)  # "any event within N days" targets besides the horizon
FEATURISE_CHUNK = 16384  # queries featurised at a time inside a chunk: bounds the temporaries


@dataclass
class TargetLayout:
    """Column ranges of the target vector: bce (active), mse (count, numeric sums), softmax blocks."""

    bce: list[int]
    mse: list[int]
    blocks: list[tuple[int, int, int]]  # (first column, partitions P, width W): P distributions over W values
    width: int

    @property
    def n_groups(self) -> int:
        return sum(p for _, p, _ in self.blocks)


def activity_days(p: FoundationParams) -> tuple[int, ...]:
    """The "any event within N days" targets of a foundation's params: ACTIVITY_DAYS and the points of the
    time-to-next-event curve it asks for (``next_event_days``), each shorter than the horizon."""
    days = set(ACTIVITY_DAYS) | set(p.next_event_days)
    return tuple(sorted(d for d in days if d < p.horizon_days))


def target_layout(enc: FeatureEncoder, days: tuple[int, ...] = ACTIVITY_DAYS) -> TargetLayout:
    bce, mse, blocks, off = [], [], [], 0
    for plan in enc.sources:
        bce.append(off)
        n_num = len(plan.numeric_channels())  # count + numeric columns
        mse.extend(range(off + 1, off + 1 + n_num))
        base = off + 1 + n_num
        for col in plan.columns:
            if col.kind in ("direct", "weekday", "hour"):
                blocks.append((base + col.offset, 1, col.width))
            elif col.kind == "hashed":
                blocks.append((base + col.offset, col.partitions, col.buckets))
        off = base + plan.channels
    for _ in enc.sources:  # activity targets (see activity_targets), appended after every source's block
        n_short = len(days)
        bce.extend(range(off, off + n_short))
        mse.append(off + n_short)
        off += n_short + 1
    return TargetLayout(bce, mse, blocks, off)


def activity_targets(
    enc: FeatureEncoder,
    cache: EventCache,
    e: torch.Tensor,
    t: torch.Tensor,
    horizon_s: int,
    days: tuple[int, ...] = ACTIVITY_DAYS,
) -> torch.Tensor:
    """Per source: any event within each of `days` (BCE) and log1p(distinct active days in the horizon)
    (MSE). "Whether and how often" the entity comes back: what churn-like scenarios need from the trunk. The
    indicators are points of the time-to-next-event distribution, P(T <= d), censored at the horizon: more
    points (``next_event_days``) make it a discrete-time survival curve."""
    parts = []
    for plan in enc.sources:
        st = source_tensors(cache.source(plan.name), e.device)
        lo, hi = st.positions(e, t), st.positions(e, t + horizon_s)
        for d in days:
            parts.append((st.positions(e, t + d * DAY) > lo).float().unsqueeze(1))
        owner, rows = expand_ranges_t(lo, hi)
        active_days = torch.zeros(len(e), device=e.device).index_add_(0, owner, new_day(st, rows, lo[owner]))
        parts.append(torch.log1p(active_days).unsqueeze(1))
    return torch.cat(parts, 1)


def future_targets(
    enc: FeatureEncoder,
    cache: EventCache,
    e: torch.Tensor,
    t: torch.Tensor,
    horizon_s: int,
    days: tuple[int, ...] = ACTIVITY_DAYS,
) -> torch.Tensor:
    """Targets [n, layout.width]: per source [active, log count, numeric..., channel distributions...]."""
    parts = []
    for plan in enc.sources:
        w = enc.window_channels_t(cache, plan, e, t, t + horizon_s)  # [n, channels]
        numeric = [c for c in plan.numeric_channels() if c != 0]
        dist = torch.zeros_like(w)
        for col in plan.columns:
            if not col.is_numeric:  # a distribution block: per value, per sketch partition, per weekday...
                p = col.partitions if col.kind == "hashed" else 1
                block = w[:, col.offset : col.offset + col.width].reshape(len(w), p, -1)
                total = block.sum(2, keepdim=True)
                dist[:, col.offset : col.offset + col.width] = (block / total.clamp_min(1e-12)).reshape(
                    len(w), -1
                )
        count = w[:, :1]
        sums = torch.sign(w[:, numeric]) * torch.log1p(w[:, numeric].abs())
        parts += [(count > 0).float(), torch.log1p(count), sums, dist]
    return torch.cat([*parts, activity_targets(enc, cache, e, t, horizon_s, days)], 1)


def make_loss(layout: TargetLayout, activity_weight: float = 1.0):
    bce_idx, mse_idx = torch.tensor(layout.bce), torch.tensor(layout.mse)

    def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        bce = nn.functional.binary_cross_entropy_with_logits(out[:, bce_idx], y[:, bce_idx])
        loss = activity_weight * bce
        loss = loss + nn.functional.mse_loss(out[:, mse_idx], y[:, mse_idx])
        if layout.blocks:
            ce = 0.0
            for a, p, w in layout.blocks:
                o = out[:, a : a + p * w].reshape(-1, p, w)
                target = y[:, a : a + p * w].reshape(-1, p, w)
                ce = ce - (target * torch.log_softmax(o, 2)).sum((1, 2))
            active = y[:, layout.bce[0]]
            loss = loss + (ce * active).sum() / active.sum().clamp_min(1.0) / layout.n_groups
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
        sketch=p.sketch_method,
        fourier_scales=p.fourier_scales,
        calendar=p.calendar_features,
        embedding={
            "dim": p.embedding_dim,
            "iterations": p.embedding_iterations,
            "max_events": p.embedding_max_events,
        },
    )


class PretrainBatches:
    """(entity, split time) queries -> (features, targets) tensors, on the training device."""

    def __init__(
        self,
        cache: EventCache,
        enc: FeatureEncoder,
        horizon_s: int,
        device: torch.device,
        days: tuple[int, ...] = ACTIVITY_DAYS,
    ) -> None:
        self.cache, self.enc, self.horizon_s, self.device, self.days = cache, enc, horizon_s, device, days

    def with_history(self, e: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Mask of the queries whose entity has at least one event before the split time."""
        keep = np.zeros(len(e), bool)
        for plan in self.enc.sources:
            src = self.cache.source(plan.name)
            keep |= src.positions(e, t) > src.offsets[e]
        return keep

    def __call__(self, e: np.ndarray, t: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        order = np.lexsort((t, e))  # sorted queries: the incremental pass reads each event once
        e, t = e[order], t[order]
        X = self.enc.history_t(self.cache, e, t, chunk=FEATURISE_CHUNK, device=self.device)
        et, tt = (torch.from_numpy(a).to(self.device) for a in (e, t))
        return X, future_targets(self.enc, self.cache, et, tt, self.horizon_s, self.days)


def _windows(cfg: PipelineConfig) -> tuple[int, int, np.ndarray]:
    """Training split-time range [lo, hi] and the validation split times; errors name the field to fix."""
    p, dp = cfg.training_params.foundation, cfg.data_params
    horizon = p.horizon_days * DAY
    lo, hi = epoch_seconds(dp.first_split), epoch_seconds(dp.validation_start) - horizon
    if hi < lo:
        raise ConfigError(
            f"{FIELD}.horizon_days: {p.horizon_days} days do not fit between training_start_date "
            f"({dp.first_split}) and validation_start_date ({dp.validation_start}); shorten it"
        )
    val_end = epoch_seconds(dp.test_date) - horizon
    if val_end < epoch_seconds(dp.validation_start):
        raise ConfigError(f"{FIELD}.horizon_days: {p.horizon_days} days do not fit in the validation period")
    return lo, hi, np.arange(epoch_seconds(dp.validation_start), val_end + 1, 7 * DAY)


def epoch_chunks(
    n_entities: int, sizes: Sizes, lo: int, hi: int, seed: int, epoch: int, ex: PretrainBatches
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The epoch's (entity, split time) queries with history, in chunks of random entities."""
    rng = np.random.default_rng([seed, epoch])
    if sizes.entities_per_epoch < n_entities:
        ents = np.sort(rng.choice(n_entities, sizes.entities_per_epoch, replace=False))
    else:
        ents = np.arange(n_entities)
    e = np.repeat(ents, sizes.split_points_per_entity)
    t = lo + rng.integers(0, (hi - lo) // DAY + 1, size=len(e)) * DAY
    keep = ex.with_history(e, t)
    e, t = e[keep], t[keep]
    if len(e) == 0:
        raise ConfigError(
            f"{FIELD}: the training window is empty (no entity has events before its split points)"
        )
    per_chunk = max(1, sizes.chunk_examples // sizes.split_points_per_entity)  # entities per chunk
    n_chunks = -(-len(ents) // per_chunk)
    chunk_of = np.empty(n_entities, np.int64)
    chunk_of[ents[rng.permutation(len(ents))]] = np.arange(len(ents)) // per_chunk
    by_chunk = np.argsort(chunk_of[e], kind="stable")
    bounds = np.searchsorted(chunk_of[e][by_chunk], np.arange(n_chunks + 1))
    return [(e[by_chunk[a:b]], t[by_chunk[a:b]]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def pretrain(cfg: PipelineConfig, progress: Progress) -> dict[str, Any]:
    p = cfg.training_params.foundation
    cache = EventCache(cache_dir(cfg))
    lo, hi, val_times = _windows(cfg)
    started = time.perf_counter()
    torch.manual_seed(p.seed)
    runtime.set_threads()
    world = init_world(runtime.resolve_device(p.device))
    device = world.device(runtime.resolve_device(p.device))
    if not world.main:
        progress = NullProgress()  # rank 0 reports
    # one pretrain at a time (rank 0 holds it for the world): a second one would share the resume state
    lock = (
        locks.training_lock(ws.foundation_root(cfg), "pretrain", progress.log)
        if world.main
        else contextlib.nullcontext()
    )
    try:
        with lock:
            return _pretrain(cfg, cache, lo, hi, val_times, started, world, device, progress)
    finally:
        shutdown(world)


def _pretrain(
    cfg: PipelineConfig,
    cache: EventCache,
    lo: int,
    hi: int,
    val_times: np.ndarray,
    started: float,
    world: World,
    device: torch.device,
    progress: Progress,
) -> dict[str, Any]:
    """Read top to bottom: encoder and sizes, validation set, model, optimizer, resume, epochs, publish."""
    p = cfg.training_params.foundation
    enc = fit_encoder(cache, cfg)
    days = activity_days(p)
    layout = target_layout(enc, days)
    sizes = calibrate(p, cache.n_entities, enc.dim, layout.width, device, progress.log)
    progress.log(
        "training sizes: "
        + ", ".join(f"{k}={v}" for k, v in sizes.to_dict().items())
        + f", world={world.size}"
    )
    ex = PretrainBatches(cache, enc, p.horizon_days * DAY, device, days)
    Xv, Yv = _validation_set(cache, ex, val_times, p.validation_entities, p.seed)  # [n_val, in], [n_val, out]
    arch = TrunkConfig(
        in_dim=enc.dim,
        hidden_dim=p.hidden_dim,
        num_blocks=p.num_blocks,
        dropout=p.dropout,
        out_dim=layout.width,
    )
    model = build_model(arch).to(device)
    model.trunk.input_dropout = p.input_dropout
    model.trunk.set_stats(Xv.mean(0).to(device), Xv.std(0).to(device))  # the same on every rank
    loss_fn = make_loss(layout, p.activity_loss_weight)
    n_chunks = -(-sizes.entities_per_epoch // max(1, sizes.chunk_examples // sizes.split_points_per_entity))
    per_rank = -(-sizes.examples_per_epoch // world.size)
    total_steps = p.epochs * (-(-per_rank // sizes.batch_size) + n_chunks)
    opt, sched = loop.optimizer_and_schedule(
        model.parameters(), p.learning_rate, p.weight_decay, p.warmup_steps, total_steps
    )
    progress.start("pretrain", total_steps)
    saver = _saver(cfg, cache, sizes, world, model, opt, sched)
    run = saver.resume(progress)
    epochs = EpochRunner(ex, world, world.wrap(model), loss_fn, opt, sched, sizes, device, p.seed, progress)
    stopping = fit.Stopping("val_loss", patience=p.patience)

    def validate(epoch: int) -> float:  # the loss on the fixed validation set
        with torch.no_grad():
            out = torch.from_numpy(runtime.predict(model, Xv, device, amp=sizes.amp_dtype))
            return float(loss_fn(out, Yv.cpu()))

    def train(run: resume.RunState, epoch: int) -> None:
        epochs.train(run, epoch, epoch_chunks(cache.n_entities, sizes, lo, hi, p.seed, epoch, ex), saver)

    try:
        fit.fit(run, p.epochs, train, validate, model, stopping, progress.log, saver)
    finally:
        epochs.close()
    assert run.best_state is not None
    model.load_state_dict(run.best_state)
    if not world.main:
        world.barrier()  # wait for rank 0 to publish
        return {"rank": world.rank, "val_loss": run.best, "epochs": len(run.history)}
    wall = time.perf_counter() - started
    meta = CheckpointMeta(
        kind="foundation",
        arch=arch,
        encoder=enc.to_dict(),
        horizon_days=p.horizon_days,
        input_dropout=p.input_dropout,
        cache_fingerprint=cache.manifest["fingerprint"],
        history=run.history,
        best_val_loss=run.best,
        training_sizes=sizes.to_dict(),
        world_size=world.size,
    )
    version, final = publish_checkpoint(ws.foundation_root(cfg), model, meta, promote=False)
    verdict = promotion.judge(cfg, ws.foundation_root(cfg), version, by="pretrain")
    saver.clear()
    world.barrier()
    out = _summary(cfg, cache, final, version, run, enc, sizes, wall, epochs, saver.resumed, world, lo, hi)
    return {**out, **promotion.summary(verdict)}


def _saver(
    cfg: PipelineConfig,
    cache: EventCache,
    sizes: Sizes,
    world: World,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    sched: Any,
) -> resume.Saver:
    """The run's resumable state, keyed by everything that shapes the run: another config, cache or world
    size starts afresh."""
    p = cfg.training_params.foundation
    key = resume.state_key(
        p.model_dump(mode="json"),
        cfg.data_params.model_dump(mode="json"),
        sizes.to_dict(),
        world.size,
        cache.manifest["fingerprint"],
        cache.manifest["created"],  # a rebuilt cache (new data) starts afresh
    )
    every = p.checkpoint_every_steps if world.main else 0  # and at each epoch's end
    return resume.Saver(ws.foundation_root(cfg) / ".resume", key, model, opt, sched, every, int(every > 0))


def _validation_set(
    cache: EventCache, ex: PretrainBatches, val_times: np.ndarray, entities: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed sample of entities at every validation split point, those with history before it."""
    n_val = min(cache.n_entities, entities)
    val_entities = np.sort(np.random.default_rng([seed, 7]).choice(cache.n_entities, n_val, replace=False))
    ve, vt = np.repeat(val_entities, len(val_times)), np.tile(val_times, n_val)
    keep = ex.with_history(ve, vt)
    if not keep.any():
        raise ConfigError(
            f"{FIELD}: no entity has history before the validation split points; check data_params"
        )
    return ex(ve[keep], vt[keep])


def _summary(
    cfg: PipelineConfig,
    cache: EventCache,
    final: Any,
    version: str,
    run: resume.RunState,
    enc: FeatureEncoder,
    sizes: Sizes,
    wall: float,
    epochs: EpochRunner,
    resumed: bool,
    world: World,
    lo: int,
    hi: int,
) -> dict[str, Any]:
    """What pretraining returns (and Dagster shows): the checkpoint, the losses, the work done."""
    events = sum(s.n_events for s in cache.sources.values())
    done_work = epochs.work.summary(wall, lo, hi)
    return {
        "path": str(final),
        "version": version,
        "train_loss": run.history[-1]["train_loss"],
        "val_loss": run.best,
        "epochs": len(run.history),
        "examples": run.n_examples,
        "input_dim": enc.dim,
        "wall_s": round(wall, 2),
        "featurise_s": round(epochs.featurise_s, 2),
        # the work done (training/work.py), per second of the stage's wall time, featurisation included
        "train_examples_per_s": done_work["examples_per_s"],
        "train_history_events_per_s": done_work["history_events_per_s"],
        "train_events_scanned_per_s": done_work["events_scanned_per_s"],
        **{f"work.{k}": v for k, v in done_work.items() if not k.endswith("_per_s")},
        "resumed": resumed,  # work counts cover this process only
        # the data set's size over the wall time: "time to a foundation model for N events", not throughput
        "time_to_foundation_s": round(wall, 2),
        "dataset_events": events,
        "world_size": world.size,
        **{f"sizes.{k}": v for k, v in sizes.to_dict().items()},
        **{f"windows.{k}": v for k, v in windows_metadata(cfg).items()},
        "cache_data_version": cache_data_version(cache.manifest),
    }
