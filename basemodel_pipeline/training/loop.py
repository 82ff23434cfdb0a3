"""Small, explicit training utilities shared by pretraining and fine-tuning (the device, threads, mixed
precision and batched forward passes are runtime.py's)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from basemodel_pipeline.runtime import Array, autocast, batches, take


def optimizer_and_schedule(
    model: nn.Module, lr: float, weight_decay: float, warmup: int, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW with linear warmup then cosine decay to 10% of the peak rate."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(warmup, 1)
        progress = min(1.0, (step - warmup) / max(total_steps - warmup, 1))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def train_epoch(
    model: nn.Module,
    X: Array,
    Y: Array,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LambdaLR,
    batch_size: int,
    rng: np.random.Generator,
    device: torch.device,
    on_step: Callable[[float, int], None] | None = None,
    skip_batches: int = 0,
    amp: torch.dtype | None | str = "cuda-bf16",
) -> float:
    """One pass over (X, Y) in random mini-batches; returns the mean loss of the batches run.

    `skip_batches` resumes an interrupted epoch: the permutation is drawn as usual, the first batches skipped.
    `on_step(loss, batch_size)` is called after every optimizer step."""
    model.train()
    total, count = 0.0, 0
    for i, idx in enumerate(batches(len(X), batch_size, rng)):
        if i < skip_batches:
            continue
        xb, yb = take(X, idx, device), take(Y, idx, device)
        with autocast(device, amp):
            out = model(xb)
        loss = loss_fn(out.float(), yb)
        if not torch.isfinite(loss):
            raise FloatingPointError("training loss is not finite; lower the learning rate")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        total += float(loss.detach()) * len(idx)
        count += len(idx)
        if on_step is not None:
            on_step(float(loss.detach()), len(idx))
    return total / max(count, 1)
