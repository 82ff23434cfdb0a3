"""Training sizes chosen from the data, the model and the machine (each one overridable in the config)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass

import psutil
import torch

from basemodel_pipeline.config.params import FoundationParams
from basemodel_pipeline.runtime import native_bf16

MIN_CHUNK, MAX_CHUNK = 4096, 131072
# Of the machine's memory, for one featurised chunk (x2 with a prefetch worker). The chunk shapes the model (it
# groups the epoch's entities and sets the schedule's length), so it follows the machine, not the memory other
# processes leave free at the moment; less free than twice the chunk lowers it, with a line.
CHUNK_MEMORY_SHARE = 0.15


@dataclass(frozen=True)
class Sizes:
    split_points_per_entity: int
    entities_per_epoch: int
    batch_size: int
    chunk_examples: int  # examples featurised at a time
    loader_workers: int
    precision: str  # fp32 | bf16

    @property
    def examples_per_epoch(self) -> int:
        return self.split_points_per_entity * self.entities_per_epoch

    @property
    def amp_dtype(self) -> torch.dtype | None:
        return torch.bfloat16 if self.precision == "bf16" else None

    def to_dict(self) -> dict:
        return asdict(self)


def auto_batch(examples: int, cap: int, min_steps: int = 128) -> int:
    """An automatic batch size: 256, doubled up to `cap` while an epoch of `examples` keeps `min_steps`."""
    batch = 256
    while batch < cap and examples // (batch * 2) >= min_steps:
        batch *= 2
    return batch


def calibrate(
    p: FoundationParams,
    n_entities: int,
    in_dim: int,
    out_dim: int,
    device: torch.device,
    log: Callable[[str], None] | None = None,
) -> Sizes:
    spp = min(p.split_points_per_entity, max(1, p.max_examples_per_epoch // max(n_entities, 1)))
    entities = min(n_entities, max(1, p.max_examples_per_epoch // spp))
    per_epoch = spp * entities
    if p.batch_size != "auto":
        batch = int(p.batch_size)
    else:
        batch = auto_batch(per_epoch, 4096 if device.type == "cuda" else 1024)
    if p.loader_workers != "auto":
        workers = int(p.loader_workers)
    else:
        workers = 1 if device.type == "cuda" or (os.cpu_count() or 1) >= 4 else 0
    chunk = _chunk_examples((in_dim + out_dim) * 4 * 3, workers, batch, log)
    auto = "bf16" if native_bf16(device) else "fp32"
    precision = auto if p.precision == "auto" else p.precision
    return Sizes(spp, entities, batch, chunk, workers, precision)


def _chunk_examples(
    bytes_per_example: int, workers: int, batch: int, log: Callable[[str], None] | None
) -> int:
    """Examples featurised at a time (bytes_per_example: features, targets and featurisation temporaries)."""
    memory = psutil.virtual_memory()

    def fit(budget: float) -> int:
        chunk = int(min(MAX_CHUNK, max(MIN_CHUNK, budget / (1 + workers) // bytes_per_example)))
        return max(batch, chunk // batch * batch)

    chunk = fit(memory.total * CHUNK_MEMORY_SHARE)
    if chunk * bytes_per_example * (1 + workers) * 2 > memory.available:
        lowered = min(chunk, fit(memory.available / 2))
        if lowered < chunk and log is not None:
            log(
                f"featurisation chunk lowered from {chunk:,} to {lowered:,} examples: "
                f"{memory.available / 2**30:.1f} GiB free of {memory.total / 2**30:.0f} GiB; "
                "the epoch's example order then differs from a run with more memory free"
            )
        chunk = lowered
    return chunk
