"""Residual MLP trunk over sketch features, and the models built on it."""

from __future__ import annotations

import torch
from torch import nn


class ResidualBlock(nn.Module):
    def __init__(self, dim: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, D] -> [B, D]
        return x + self.drop(self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x)))))


class Trunk(nn.Module):
    """Standardise the input with stored statistics, project to `hidden`, apply residual blocks."""

    def __init__(self, in_dim: int, hidden: int, blocks: int, dropout: float) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(in_dim))
        self.register_buffer("std", torch.ones(in_dim))
        self.proj = nn.Linear(in_dim, hidden)
        self.blocks = nn.ModuleList(ResidualBlock(hidden, dropout) for _ in range(blocks))
        self.norm = nn.LayerNorm(hidden)

    def set_stats(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.mean.copy_(mean)
        self.std.copy_(std.clamp_min(1e-3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, F] -> [B, hidden]
        h = self.proj((x - self.mean) / self.std)
        for block in self.blocks:
            h = block(h)
        return self.norm(h)


class TrunkWithHead(nn.Module):
    """A trunk and a linear head: the foundation model (head = future-window targets) or a scenario model."""

    def __init__(self, trunk: Trunk, out_dim: int) -> None:
        super().__init__()
        self.trunk = trunk
        self.head = nn.Linear(trunk.norm.normalized_shape[0], out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, F] -> [B, out]
        return self.head(self.trunk(x))

    def embed(self, x: torch.Tensor) -> torch.Tensor:  # [B, F] -> [B, D]
        """The universal behavioural embedding of history features (what `basemodel embed` exports)."""
        return self.trunk(x)
