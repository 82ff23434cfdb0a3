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
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from basemodel_pipeline import files as fs
from basemodel_pipeline import manifests
from basemodel_pipeline.progress import Progress

TENSORS = "state.safetensors"
META = "state.json"
FORMAT = 2  # state.json's "format": 2 is RunState's record (earlier states, without it, are ignored)


def state_key(*parts: Any) -> str:
    """Identity of a training run: a saved state is resumed only by a run with the same key."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class RunState:
    """Where a training run stands: the one record of pretraining, a scenario network and the probe
    (training/fit.py moves it on). Saved with the weights (state.json's "info", best_state as tensors) every
    few steps or epochs, so a killed run resumes at the batch or epoch it reached."""

    epoch: int = 0  # the epoch in progress
    batch: int = 0  # batches done in it
    step: int = 0  # optimizer steps, all epochs
    loss_sum: float = 0.0  # this epoch's training loss, summed over its examples
    loss_count: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)  # one record per finished epoch
    best: float = float("nan")  # the validation value of the kept epoch (NaN: none yet)
    bad: int = 0  # epochs since the validation value last improved
    n_examples: int = 0  # training examples seen, all epochs
    best_state: dict[str, torch.Tensor] | None = None  # the kept epoch's weights

    def info(self) -> dict[str, Any]:
        """The counters, for state.json."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "best_state"}

    @classmethod
    def from_info(cls, info: dict[str, Any], best_state: dict[str, torch.Tensor] | None) -> RunState:
        known = {f.name for f in fields(cls)} - {"best_state"}
        return cls(**{k: v for k, v in info.items() if k in known}, best_state=best_state)

    def stepped(self, epoch: int, loss: float, examples: int) -> None:
        """One optimizer step of `examples` examples with this mean loss."""
        self.epoch, self.batch, self.step = epoch, self.batch + 1, self.step + 1
        self.loss_sum += loss * examples
        self.loss_count += examples


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
    staging = fs.staging_dir(directory)
    try:
        save_file(tensors, str(staging / TENSORS))
        meta = {
            "format": FORMAT,
            "key": key,
            "tensors_sha256": manifests.sha256_file(staging / TENSORS),
            "info": info,
            "param_groups": groups,
            "sched_last_epoch": sched.last_epoch,
            "has_best": best_state is not None,
        }
        fs.atomic_write_text(staging / META, json.dumps(manifests.signed(meta)))
        fs.publish_dir(staging, directory)
    except BaseException:
        fs.discard_dir(staging)  # the files and the directory's claim: nothing left beside the state
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
    if signature := manifests.signature_problem(meta, META):
        raise _Unusable(signature)
    if meta.get("format") != FORMAT:
        raise _Unusable(
            f"it was saved by another version (format {meta.get('format', 1)}, this one reads {FORMAT})"
        )
    try:
        if manifests.sha256_file(directory / TENSORS) != meta["tensors_sha256"]:
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


class Saver:
    """A run's resumable state: restored once at the start, saved every `every_steps` optimizer steps and
    every `every_epochs` epochs (0: never; a rank other than 0 saves nothing), removed once the checkpoint is
    published. `rng`: a numpy generator the run draws from across epochs, saved and restored with the state.
    `bar`: the progress bar the resumed steps advance; `label`: what the resume line names (pretraining's
    line names the step)."""

    def __init__(
        self,
        directory: Path,
        key: str,
        model: torch.nn.Module,
        opt: Any,
        sched: Any,
        every_steps: int = 0,
        every_epochs: int = 0,
        rng: np.random.Generator | None = None,
        bar: str = "pretrain",
        label: str = "",
    ) -> None:
        self.directory, self.key, self.model, self.opt, self.sched = directory, key, model, opt, sched
        self.every_steps, self.every_epochs, self.rng, self.bar, self.label = (
            every_steps, every_epochs, rng, bar, label,
        )  # fmt: skip
        self.resumed = False

    def resume(self, progress: Progress) -> RunState:
        found = load_state(self.directory, self.key, self.model, self.opt, self.sched, warn=progress.log)
        if found is None:
            return RunState()
        run = RunState.from_info(*found)
        if self.rng is not None:
            self.rng.bit_generator.state = found[0]["numpy_rng"]
        self.resumed = True
        if self.label:
            progress.log(f"resuming {self.label} after epoch {run.epoch} ({self.directory})")
        else:
            progress.log(f"resuming from step {run.step} (epoch {run.epoch + 1}, batch {run.batch})")
        progress.advance(self.bar, run.step)
        return run

    def step(self, run: RunState) -> None:
        """After each optimizer step: saves every `every_steps` steps."""
        if self.every_steps and run.step % self.every_steps == 0:
            self.save(run)

    def epoch_end(self, run: RunState) -> None:
        """After each epoch (run.epoch epochs done): saves every `every_epochs` epochs."""
        if self.every_epochs and run.epoch % self.every_epochs == 0:
            self.save(run)

    def save(self, run: RunState) -> None:
        info = run.info()
        if self.rng is not None:
            info["numpy_rng"] = self.rng.bit_generator.state
        save_state(self.directory, self.key, self.model, self.opt, self.sched, run.best_state, info)

    def clear(self) -> None:
        clear_state(self.directory)
