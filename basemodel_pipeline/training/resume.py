"""Resumable training state without pickle: tensors in safetensors, the rest in JSON.

A run writes <dir>/state.safetensors + state.json every N steps (atomically: the JSON, written last, names the
step the tensors belong to). A run started again with the same key continues from there; a different key
(another config or cache) ignores and replaces the state.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from basemodel_pipeline import workspace as ws

TENSORS = "state.safetensors"
META = "state.json"


def state_key(*parts: Any) -> str:
    """Identity of a training run: a saved state is resumed only by a run with the same key."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def new_run_info() -> dict[str, Any]:
    """Progress counters saved with the state (JSON)."""
    return {
        "epoch": 0,
        "batch": 0,
        "step": 0,
        "loss_sum": 0.0,
        "loss_count": 0,
        "history": [],
        "best": float("inf"),
        "n_examples": 0,
    }


def _flatten_optimizer(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    sd = opt.state_dict()
    tensors = {
        f"opt.{i}.{name}": (v if torch.is_tensor(v) else torch.tensor(v)).detach().cpu().contiguous()
        for i, state in sd["state"].items()
        for name, v in state.items()
    }
    return tensors, sd["param_groups"]


def save_state(
    directory: Path,
    key: str,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    best_state: dict[str, torch.Tensor] | None,
    info: dict[str, Any],
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if best_state is not None:
        tensors.update({f"best.{k}": v.detach().cpu().contiguous() for k, v in best_state.items()})
    opt_tensors, groups = _flatten_optimizer(opt)
    tensors.update(opt_tensors)
    tensors["torch_rng"] = torch.get_rng_state()
    tmp = directory / f".{TENSORS}.tmp"
    save_file(tensors, str(tmp))
    tmp.replace(directory / TENSORS)
    meta = {
        "key": key,
        "info": info,
        "param_groups": groups,
        "sched_last_epoch": sched.last_epoch,
        "has_best": best_state is not None,
    }
    ws.atomic_write_text(directory / META, json.dumps(meta))


def load_state(
    directory: Path,
    key: str,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
) -> tuple[dict[str, Any], dict[str, torch.Tensor] | None] | None:
    """Restore model/optimizer/scheduler/torch RNG; returns (info, best_state) or None."""
    meta_file = directory / META
    if not meta_file.exists() or not (directory / TENSORS).exists():
        return None
    meta = json.loads(meta_file.read_text())
    if meta.get("key") != key:
        return None
    tensors = load_file(str(directory / TENSORS))
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, v in tensors.items():
        if name.startswith("opt."):
            _, idx, field = name.split(".", 2)
            state.setdefault(int(idx), {})[field] = v
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    sched.last_epoch = meta["sched_last_epoch"]
    torch.set_rng_state(tensors["torch_rng"])
    best = {k[5:]: v for k, v in tensors.items() if k.startswith("best.")} if meta["has_best"] else None
    return meta["info"], best


def clear_state(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
