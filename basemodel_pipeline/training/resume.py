"""Resumable training state without pickle: tensors in safetensors, the rest in JSON.

A run writes <dir>/state.safetensors + state.json every N steps. Both are written into a staging directory
beside <dir> which is then renamed into place, so a kill at any point leaves either the previous complete
state or none (never the tensors of one step with the counters of another); state.json also records the
sha256 of the tensors file. A run started again with the same key continues from there; a different key
(another config or cache) ignores and replaces the state; an unreadable or inconsistent state is reported
through `warn` and ignored (the run starts afresh).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from copy import deepcopy
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
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
    """Replace the state in `directory` by this one in a single rename (see the module docstring)."""
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if best_state is not None:
        tensors.update({f"best.{k}": v.detach().cpu().contiguous() for k, v in best_state.items()})
    opt_tensors, groups = _flatten_optimizer(opt)
    tensors.update(opt_tensors)
    tensors["torch_rng"] = torch.get_rng_state()
    staging = ws.staging_dir(directory)
    try:
        save_file(tensors, str(staging / TENSORS))
        meta = {
            "key": key,
            "tensors_sha256": ws.sha256_file(staging / TENSORS),
            "info": info,
            "param_groups": groups,
            "sched_last_epoch": sched.last_epoch,
            "has_best": best_state is not None,
        }
        ws.atomic_write_text(staging / META, json.dumps(meta))
        ws.publish_dir(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


class _Unusable(Exception):
    """The saved state cannot be used (unreadable, inconsistent or not this run's shape)."""


def _read_state(directory: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(meta, tensors) of a saved state whose files agree with each other, else _Unusable."""
    try:
        meta = json.loads((directory / META).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _Unusable(f"{META} is unreadable ({exc})") from None
    needed = ("key", "tensors_sha256", "info", "param_groups", "sched_last_epoch", "has_best")
    if not isinstance(meta, dict) or any(k not in meta for k in needed):
        raise _Unusable(f"{META} lacks {', '.join(k for k in needed if k not in (meta or {}))}")
    try:
        if ws.sha256_file(directory / TENSORS) != meta["tensors_sha256"]:
            raise _Unusable(f"{TENSORS} does not match the checksum in {META}")
        return meta, load_file(str(directory / TENSORS))
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
        raise _Unusable(f"{TENSORS} is unreadable ({exc})") from None


def _apply_state(
    meta: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
) -> tuple[dict[str, Any], dict[str, torch.Tensor] | None]:
    """Load a read state into model/optimizer/scheduler/torch RNG; returns (info, best_state)."""
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


def load_state(
    directory: Path,
    key: str,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    warn: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any], dict[str, torch.Tensor] | None] | None:
    """Restore model/optimizer/scheduler/torch RNG; returns (info, best_state), or None to start afresh.

    A state saved under another key is ignored silently; an unusable one is reported through `warn`,
    removed, and leaves model/optimizer/scheduler/RNG as they were."""
    if not (directory / META).exists() and not (directory / TENSORS).exists():
        return None
    before = (
        deepcopy(model.state_dict()),
        deepcopy(opt.state_dict()),
        sched.last_epoch,
        torch.get_rng_state(),
    )
    try:
        meta, tensors = _read_state(directory)
        if meta["key"] != key:
            return None
        try:
            return _apply_state(meta, tensors, model, opt, sched)
        except (KeyError, ValueError, RuntimeError, TypeError) as exc:
            raise _Unusable(f"it does not fit this run ({type(exc).__name__}: {exc})") from None
    except _Unusable as exc:
        model.load_state_dict(before[0])
        opt.load_state_dict(before[1])
        sched.last_epoch = before[2]
        torch.set_rng_state(before[3])
        if warn is not None:
            warn(f"warning: ignoring the saved training state in {directory}: {exc}; starting afresh")
        clear_state(directory)
        return None


def clear_state(directory: Path) -> None:
    """Remove a saved state (once its run has published a checkpoint, or when it is unusable)."""
    shutil.rmtree(directory, ignore_errors=True)
