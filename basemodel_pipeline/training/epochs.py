"""Pretraining's epochs: each chunk of (entity, split point) examples is featurised (the next one in a
background thread when loader workers are configured) and stepped through the one training loop
(training/loop.py); the featurisation time and the work done (training/work.py) are counted on the way."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.features.sketch import FeatureEncoder
from basemodel_pipeline.progress import Progress
from basemodel_pipeline.training import loop
from basemodel_pipeline.training.calibrate import Sizes
from basemodel_pipeline.training.distributed import World
from basemodel_pipeline.training.resume import RunState, Saver
from basemodel_pipeline.training.work import WorkCounter


class Featuriser(Protocol):
    """Examples -> (inputs, targets): training/pretrain.PretrainBatches."""

    cache: EventCache
    enc: FeatureEncoder

    def __call__(self, e: np.ndarray, t: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]: ...


class Prefetcher:
    """Featurise chunk i+1 in a background thread while chunk i trains (workers >= 1), else inline."""

    def __init__(self, make, workers: int) -> None:
        self.make = make
        self.pool = ThreadPoolExecutor(workers) if workers > 0 else None
        self.pending: dict[int, Future] = {}

    def get(self, chunks: list, i: int, prefetch_next: bool = True):
        job = self.pending.pop(i, None)
        result = job.result() if job is not None else self.make(*chunks[i])
        if self.pool is not None and prefetch_next and i + 1 < len(chunks):
            self.pending[i + 1] = self.pool.submit(self.make, *chunks[i + 1])
        return result

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


class EpochRunner:
    """One epoch's training: its chunks featurised (one ahead in a background thread when configured) and
    stepped through training/loop.py; counts the featurisation time and the work done."""

    def __init__(
        self,
        ex: Featuriser,
        world: World,
        replica: nn.Module,
        loss_fn: Any,
        opt: torch.optim.Optimizer,
        sched: Any,
        sizes: Sizes,
        device: torch.device,
        seed: int,
        progress: Progress,
    ) -> None:
        self.replica, self.loss_fn, self.opt, self.sched = replica, loss_fn, opt, sched
        self.sizes, self.device, self.seed, self.progress = sizes, device, seed, progress
        self.ex, self.world, self.featurise_s = ex, world, 0.0
        self.prefetch = Prefetcher(self._make, sizes.loader_workers)
        # counted on every rank over all ranks' examples (the epoch's chunks are the same before sharding)
        self.work = WorkCounter(ex.cache, [plan.name for plan in ex.enc.sources])

    def _make(self, e: np.ndarray, t: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, float]:
        t0 = time.perf_counter()
        X, Y = self.ex(e, t)
        return X, Y, time.perf_counter() - t0

    def train(self, run: RunState, epoch: int, drawn: list, saver: Saver) -> None:
        """The epoch's chunks (this rank's shard of each), skipping the batches a resumed run already did."""
        chunks = [self.world.shard(*c) for c in drawn]
        done = 0
        for ci, (ce, _) in enumerate(chunks):
            n_batches = -(-len(ce) // self.sizes.batch_size)
            if run.batch >= done + n_batches:  # finished before an interruption
                done += n_batches
                continue
            X, Y, feat_s = self.prefetch.get(chunks, ci)  # [chunk, in_dim], [chunk, out_dim]
            self.featurise_s += feat_s

            def on_step(loss: float, n: int, epoch: int = epoch) -> None:
                run.stepped(epoch, loss, n)
                self.progress.advance("pretrain", 1, loss=loss)
                saver.step(run)

            loop.train_epoch(
                self.replica, len(X), loop.array_batch(X, Y, self.device), self.loss_fn, self.opt, self.sched,
                self.sizes.batch_size, np.random.default_rng([self.seed, epoch, ci]), self.device,
                on_step=on_step, skip_batches=run.batch - done, amp=self.sizes.amp_dtype,
            )  # fmt: skip
            done += n_batches
            run.n_examples += len(ce)
            self.work.add(*drawn[ci])
            del X, Y

    def close(self) -> None:
        self.prefetch.close()
