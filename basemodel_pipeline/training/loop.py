"""The one step loop: an optimizer with its schedule, and an epoch of mini-batch steps. Pretraining
(training/pretrain.py) and the scenario networks (scenarios/network.py) both step through it, inside the one
epoch loop (training/fit.py); the device, threads, mixed precision and batched forward passes are
runtime.py's."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import torch
from torch import nn

from basemodel_pipeline.runtime import Array, autocast, batches, take

Batch = Callable[
    [np.ndarray], tuple[torch.Tensor, torch.Tensor]
]  # example indices -> (inputs, targets) on the device


def array_batch(X: Array, Y: Array, device: torch.device) -> Batch:
    """The Batch of two arrays (numpy or tensors) holding the same examples' inputs and targets."""
    return lambda idx: (take(X, idx, device), take(Y, idx, device))


def optimizer_and_schedule(
    params: Iterable[nn.Parameter], lr: float, weight_decay: float, warmup: int, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `params` (all of a model's, or only a head's and its LoRA adapters') with linear warmup
    then cosine decay to 10% of the peak rate."""
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(warmup, 1)
        progress = min(1.0, (step - warmup) / max(total_steps - warmup, 1))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def train_epoch(
    model: nn.Module,
    n: int,
    batch: Batch,
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
    """One pass over n examples in random mini-batches (`batch` gathers each one); returns the mean loss of
    the batches run. Parameters without a gradient (a frozen trunk) are neither clipped nor stepped.

    `skip_batches` resumes an interrupted epoch: the permutation is drawn as usual, the first batches skipped.
    `on_step(loss, batch_size)` is called after every optimizer step. `amp`: runtime.autocast (the default,
    bf16 on CUDA only)."""
    model.train()
    total, count = 0.0, 0
    for i, idx in enumerate(batches(n, batch_size, rng)):
        if i < skip_batches:
            continue
        xb, yb = batch(idx)
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
