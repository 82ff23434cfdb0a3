"""Small, explicit training utilities shared by pretraining and fine-tuning."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn

from basemodel_pipeline.settings import setting


def pick_device(choice: str) -> torch.device:
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def set_threads() -> None:
    """All cores (up to 16), or BASEMODEL_TORCH_THREADS when several workers share the machine."""
    wanted = setting("BASEMODEL_TORCH_THREADS") or None
    torch.set_num_threads(int(wanted) if wanted else max(1, min(os.cpu_count() or 1, 16)))


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


def batches(n: int, size: int, rng: np.random.Generator | None = None) -> Iterator[np.ndarray]:
    idx = rng.permutation(n) if rng is not None else np.arange(n)
    for a in range(0, n, size):
        yield idx[a : a + size]


Array = np.ndarray | torch.Tensor


def take(X: Array, idx: np.ndarray, device: torch.device) -> torch.Tensor:
    """Rows idx of a numpy array or a tensor, as a tensor on device."""
    if isinstance(X, torch.Tensor):
        return X[torch.from_numpy(idx).to(X.device)].to(device)
    return torch.from_numpy(X[idx]).to(device)


def autocast(device: torch.device, amp: torch.dtype | None | str = "cuda-bf16"):
    """Mixed precision context: amp=None is fp32; the default keeps the old rule (bf16 on CUDA only)."""
    if amp == "cuda-bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    return torch.autocast(device.type, dtype=amp or torch.bfloat16, enabled=amp is not None)


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


@torch.no_grad()
def predict(
    model: nn.Module,
    X: Array,
    device: torch.device,
    batch_size: int = 4096,
    amp: torch.dtype | None | str = "cuda-bf16",
) -> np.ndarray:
    """Raw outputs (logits) of the model on X, as float32 numpy."""
    model.eval()
    outs = []
    for idx in batches(len(X), batch_size):
        with autocast(device, amp):
            outs.append(model(take(X, idx, device)).float().cpu().numpy())
    return np.concatenate(outs) if outs else np.zeros((0, 0), np.float32)
