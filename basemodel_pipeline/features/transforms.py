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
    """log1p for counts; signed log1p for numeric sums (channel 0 is the event count). x [..., C] float32 is
    overwritten (callers pass sums they no longer need: no [n, H, C] temporaries); the result goes to `out`
    (x's shape, any float dtype, e.g. a strided block of fine-tuning's float16 matrix) when given."""
    num = [c for c in numeric if c != 0]
    if num:  # the few numeric channels first, before x's counts are squashed in place
        idx = torch.tensor(num, device=x.device)
        v = x.index_select(-1, idx)
        signed = torch.sign(v) * torch.log1p(v.abs())
    y = x.clamp_(min=0.0).log1p_()
    if num:
        y.index_copy_(-1, idx, signed)
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
