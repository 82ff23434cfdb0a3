"""LoRA adapters on the trunk's nn.Linear layers, merged into the base weights before saving.

Our own ~40 lines rather than peft: the trunk is a plain residual MLP (a handful of nn.Linear layers), peft
would add a dependency tree for one wrapper class, and merging W += (alpha / r) B A at the end gives a
checkpoint with exactly the TrunkWithHead layout, so loading and inference need no adapter code at all.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class LoRALinear(nn.Module):
    """y = base(x) + (alpha / r) * x A^T B^T, with the base frozen; B starts at zero (no change at step 0)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float | None = None) -> None:
        super().__init__()
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.scale = (alpha if alpha is not None else 2.0 * rank) / rank
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.t() @ self.lora_b.t()) * self.scale

    def merged(self) -> nn.Linear:
        with torch.no_grad():
            self.base.weight += (self.lora_b @ self.lora_a) * self.scale
        for p in self.base.parameters():
            p.requires_grad_(True)
        return self.base


def add_lora(module: nn.Module, rank: int) -> list[nn.Parameter]:
    """Freeze `module` and wrap each of its nn.Linear layers in a LoRALinear; returns the new parameters."""
    for p in module.parameters():
        p.requires_grad_(False)
    params: list[nn.Parameter] = []
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                wrapped = LoRALinear(child, rank)
                setattr(parent, name, wrapped)
                params += [wrapped.lora_a, wrapped.lora_b]
    return params


def merge_lora(module: nn.Module) -> None:
    """Fold every LoRALinear back into a plain nn.Linear (in place)."""
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, LoRALinear):
                setattr(parent, name, child.merged())
