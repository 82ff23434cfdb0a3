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
    """Standardise the input with stored statistics, project to `hidden`, apply residual blocks.

    `input_dropout` zeroes standardised inputs (i.e. sets them to their mean) while training. Pretraining
    sets it (training_params.foundation.input_dropout); it is not part of the checkpoint, so a trunk loaded
    for fine-tuning or inference has none."""

    def __init__(self, in_dim: int, hidden: int, blocks: int, dropout: float) -> None:
        super().__init__()
        self.input_dropout = 0.0
        self.register_buffer("mean", torch.zeros(in_dim))
        self.register_buffer("std", torch.ones(in_dim))
        self.proj = nn.Linear(in_dim, hidden)
        self.blocks = nn.ModuleList(ResidualBlock(hidden, dropout) for _ in range(blocks))
        self.norm = nn.LayerNorm(hidden)

    def set_stats(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.mean.copy_(mean)
        self.std.copy_(std.clamp_min(1e-3))

    def residual(self, x: torch.Tensor) -> torch.Tensor:  # [B, F] -> [B, hidden]
        """The residual stream after the last block, before the final LayerNorm."""
        if (self.training and self.input_dropout > 0) or not isinstance(self.proj, nn.Linear):
            z = (x - self.mean) / self.std  # with dropout, or a projection with adapters (model/lora.py)
            h = self.proj(nn.functional.dropout(z, self.input_dropout) if self.training else z)
        elif torch.is_autocast_enabled(x.device.type):
            h = self._centred_projection(x)
        else:  # the standardisation folded into the projection: W((x - m) / s) + b = (W / s) x + b - (W / s) m
            w = self.proj.weight / self.std
            h = nn.functional.linear(x.to(w.dtype), w, self.proj.bias - w @ self.mean)
        for block in self.blocks:
            h = block(h)
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, F] -> [B, hidden]
        return self.norm(self.residual(x))

    def _centred_projection(self, x: torch.Tensor) -> torch.Tensor:
        """The projection under autocast: W((x - m) / s) + b = (W / s)(x - m) + b with x centred before its
        bf16 rounding, the scale folded into W. Folding m into the bias as well (the fp32 path) would cancel
        (W / s) x in bf16 wherever a feature's mean is large against its spread. Half-precision features
        (fine-tuning's matrix, the scoring state) are centred on m rounded to their precision, m', in one
        half-precision pass, the difference exact but for one rounding: (W / s)(x - m') + b + (W / s)(m' - m)."""
        w = self.proj.weight / self.std
        if x.dtype == torch.float16:
            m = self.mean.to(torch.float16)
            return nn.functional.linear(x - m, w, self.proj.bias + w @ (m.float() - self.mean))
        low = torch.get_autocast_dtype(x.device.type)  # fp32 features: centred and rounded in one pass
        z = torch.sub(x, self.mean, out=torch.empty(x.shape, dtype=low, device=x.device))
        return nn.functional.linear(z, w, self.proj.bias)


class TrunkWithHead(nn.Module):
    """A trunk and a linear head: the foundation model (head = future-window targets) or a scenario model."""

    def __init__(self, trunk: Trunk, out_dim: int) -> None:
        super().__init__()
        self.trunk = trunk
        self.head = nn.Linear(trunk.norm.normalized_shape[0], out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, F] -> [B, out]
        return self.head(self.trunk(x))

    def embed(self, x: torch.Tensor) -> torch.Tensor:  # [B, F] -> [B, D]
        """The universal behavioural embedding of history features (what `basemodel embed` exports): the
        trunk's residual stream before its final LayerNorm. The LayerNorm rescales every row to unit variance
        and so drops each entity's overall magnitude, which carries how active it is: on The Complete Journey
        the fixed probe scores churn 0.840-0.844 on this vs 0.830-0.836 on the normalised output (department
        propensity 0.818 both)."""
        return self.trunk.residual(x)
