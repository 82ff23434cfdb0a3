"""How decayed sums become trunk inputs: log-squashing (and its inverse) and each source's extras.

Part of what every trained model saw: changing any of this changes the features of a stored encoder.
"""

from __future__ import annotations

import torch

from basemodel_pipeline.dates import DAY
from basemodel_pipeline.features.kernels import SourceTensors

# Recency (days) of an entity with no event before the split, in the trunk's sketch input. Not the aggregate
# features' AGGREGATE_NO_HISTORY_DAYS (features/aggregates.py): each is part of what its trained models saw.
SKETCH_NO_HISTORY_DAYS = 3650.0


def squash(x: torch.Tensor, numeric: list[int], out: torch.Tensor | None = None) -> torch.Tensor:
    """log1p for counts; signed log1p for numeric sums (channel 0 is the event count). x [..., C]; the
    result goes to `out` (x's shape) when given."""
    y = x.clamp_min(0.0).log1p_()
    num = [c for c in numeric if c != 0]
    if num:
        y[..., num] = torch.sign(x[..., num]) * torch.log1p(x[..., num].abs())
    return y if out is None else out.copy_(y)


def unsquash(y: torch.Tensor, numeric: list[int]) -> torch.Tensor:
    """Inverse of squash."""
    out = torch.expm1(y)
    num = [c for c in numeric if c != 0]
    if num:
        out[..., num] = torch.sign(y[..., num]) * torch.expm1(y[..., num].abs())
    return out


def history_extras(st: SourceTensors, e: torch.Tensor, t: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    lo = st.offsets[e]
    count = pos - lo
    has = count > 0
    n_rows = max(len(st.ts) - 1, 0)
    last = st.ts[(pos - 1).clamp(0, n_rows)]
    first = st.ts[lo.clamp(0, n_rows)]
    recency = torch.where(
        has, (t - last).double() / DAY, torch.full_like(t, SKETCH_NO_HISTORY_DAYS, dtype=torch.float64)
    )
    tenure = torch.where(has, (t - first).double() / DAY, torch.zeros_like(t, dtype=torch.float64))
    return torch.stack(
        [
            torch.log1p(count.to(torch.float32)),
            torch.log1p(recency.float()),
            torch.log1p(tenure.float()),
            has.float(),
        ],
        1,
    )
