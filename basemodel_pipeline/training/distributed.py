"""Data-parallel training through torchrun (DDP). One process on CPU stays the default.

    torchrun --nproc_per_node 2 -m basemodel_pipeline.cli pretrain CONFIG          # 2 processes (CPU: gloo)
    torchrun --nproc_per_node 8 -m basemodel_pipeline.cli pretrain CONFIG          # 8 GPUs (nccl)
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d \\
        --rdzv_endpoint HOST:29500 -m basemodel_pipeline.cli pretrain CONFIG         # 2 nodes x 8 GPUs

Every rank draws the same epoch plan (same seeds), featurises only its share of each chunk and trains a DDP
replica; gradients are averaged, so the effective batch is batch_size x world size. Rank 0 alone writes the
resumable state and publishes the checkpoint (the workspace must be on a volume every node sees).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def device(self, device: torch.device) -> torch.device:
        """The rank's own GPU when training on CUDA."""
        return torch.device("cuda", self.local_rank) if device.type == "cuda" else device

    def shard(self, e: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """This rank's equal share of a chunk's queries (the remainder, < size queries, is dropped so that every
        rank takes the same number of steps, which DDP requires)."""
        if self.size == 1:
            return e, t
        n = len(e) // self.size * self.size
        return e[self.rank : n : self.size], t[self.rank : n : self.size]

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.size == 1:
            return model
        ids = [self.local_rank] if next(model.parameters()).is_cuda else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()


def init_world(device: torch.device) -> World:
    """Join the torchrun process group when WORLD_SIZE > 1 (nccl on CUDA, gloo on CPU)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    world = World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        torch.cuda.set_device(world.local_rank)
    return world


def shutdown(world: World) -> None:
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
