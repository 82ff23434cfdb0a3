"""Training a scenario's network (the trunk and its head) with per-scenario early stopping; modes in
scenarios/finetune.py."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from basemodel_pipeline import runtime
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.config import PipelineConfig, Scenario
from basemodel_pipeline.model.trunk import TrunkWithHead
from basemodel_pipeline.progress import Progress
from basemodel_pipeline.scenarios.lora import add_lora, merge_lora
from basemodel_pipeline.scenarios.shared import Shared
from basemodel_pipeline.targets.labels import Examples, TargetSpec
from basemodel_pipeline.tasks import Task, task_for
from basemodel_pipeline.training import loop, resume

RESUME = ".resume"  # under the scenario's checkpoint root, beside its versions


def train_network(
    shared: Shared,
    scenario: Scenario,
    spec: TargetSpec,
    ex: dict[str, Examples],
    progress: Progress,
    fixed_epochs: int | None = None,
) -> tuple[TrunkWithHead, Task, list[dict], float]:
    """Train one scenario's network, early-stopped on ex["val"]; returns (model with the best epoch's weights,
    its task (the head's loss and decoding), history, best validation metric). ``fixed_epochs``: exactly that many epochs, the last one kept
    (a refit on more windows for the epochs early stopping chose)."""
    p = shared.cfg.training_params.finetune
    mode = scenario.mode or p.mode
    epochs = fixed_epochs or scenario.epochs or p.epochs
    lr = scenario.learning_rate or p.learning_rate
    torch.manual_seed(p.seed)
    runtime.set_threads()
    device = runtime.resolve_device(shared.cfg.training_params.foundation.device)
    head = task_for(spec)
    model = shared.new_model(head.out_dim)
    head.init_bias(model.head, ex["train"].labels)
    model.to(device)
    rows = {k: shared.rows(v) for k, v in ex.items()}
    inputs, net, params = _trainable(shared, model, mode, scenario.lora_rank, device)
    n = len(ex["train"])
    steps = epochs * -(-n // p.batch_size)
    opt, sched = loop.optimizer_and_schedule(params, lr, p.weight_decay, min(100, steps // 10), steps)
    rng = np.random.default_rng(p.seed)
    primary = head.primary_metric
    sign = 1.0 if head.higher_is_better() else -1.0
    val_truth = head.truth(ex["val"].labels)
    bar = f"finetune {scenario.name}"
    progress.start(bar, steps)

    def batch(idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:  # [b, in_dim or hidden], head targets
        xb = torch.from_numpy(inputs[rows["train"][idx]]).to(device)
        return xb, head.targets(ex["train"].labels, idx).to(device)

    def on_step(loss: float, size: int) -> None:
        progress.advance(bar, 1, loss=loss)

    run = _Resumable(
        _resume_dir(shared, scenario, fixed_epochs), _run_key(shared, scenario, spec, ex, fixed_epochs)
    )
    run.restore(net, opt, sched, rng, p.checkpoint_every_epochs, progress)
    progress.advance(bar, run.epoch * -(-n // p.batch_size))
    for epoch in range(run.epoch, epochs):
        if run.bad >= p.patience:  # early stopping (a resumed run may have stopped already)
            break
        started = time.perf_counter()
        try:  # the shared loop (training/loop.py): bf16 autocast on CUDA, fp32 on the CPU
            train_loss = loop.train_epoch(
                net, n, batch, head.loss, opt, sched, p.batch_size, rng, device, on_step
            )
        except FloatingPointError as exc:
            raise FloatingPointError(f"scenario '{scenario.name}': {exc}") from None
        val_logits = runtime.predict(net, inputs[rows["val"]], device)
        val_metric = float(head.primary(val_truth, head.network_outputs(val_logits)))
        run.history.append(
            {
                "epoch": epoch + 1,
                "train_loss": train_loss,
                "val_metric": val_metric,
                "seconds": round(time.perf_counter() - started, 2),
            }
        )
        progress.log(
            f"{scenario.name} epoch {epoch + 1}: train_loss={train_loss:.4f} val_{primary}={val_metric:.4f}"
        )
        score = sign * val_metric if np.isfinite(val_metric) else -np.inf
        if run.best_state is None or score > run.best or fixed_epochs is not None:
            run.best, run.best_state, run.bad = score, copy.deepcopy(net.state_dict()), 0
        else:
            run.bad += 1
        run.epoch = epoch + 1
        run.save(net, opt, sched, rng, p.checkpoint_every_epochs)
    best, best_state, history = run.best, run.best_state, run.history
    assert best_state is not None
    net.load_state_dict(best_state)
    if mode == "lora":
        merge_lora(model.trunk)
    return model.cpu(), head, history, sign * best


def _trainable(
    shared: Shared, model: TrunkWithHead, mode: str, lora_rank: int, device: torch.device
) -> tuple[np.ndarray, nn.Module, list[nn.Parameter]]:
    """What a fine-tuning mode trains: (the rows' inputs, the module they go through, its trained parameters).
    frozen: the head on the trunk's outputs; full: the whole network on the features; lora: the head and
    low-rank adapters on the frozen trunk's linear layers."""
    if mode == "frozen":
        return shared.trunk_outputs(device), model.head, list(model.head.parameters())
    assert shared.X is not None
    params = (
        list(model.parameters())
        if mode == "full"
        else add_lora(model.trunk, lora_rank) + list(model.head.parameters())
    )
    model.to(device)
    return shared.X, model, params


# ---- resuming an interrupted fine-tuning ----------------------------------------------------------------
def _resume_dir(shared: Shared, scenario: Scenario, fixed_epochs: int | None) -> Path:
    """Where a scenario's network saves its resumable state: one directory for the early-stopped training and
    one for the refit; both are removed once the scenario's checkpoint is published (clear_resume)."""
    return ws.scenario_root(shared.cfg, scenario.name) / RESUME / ("refit" if fixed_epochs else "train")


def clear_resume(cfg: PipelineConfig, scenario: str) -> None:
    """Remove a scenario's resumable training states (its checkpoint is published)."""
    resume.clear_state(ws.scenario_root(cfg, scenario) / RESUME)


def _run_key(
    shared: Shared, scenario: Scenario, spec: TargetSpec, ex: dict[str, Examples], fixed_epochs: int | None
) -> str:
    """Everything that shapes the training: another config, cache, foundation or set of examples starts
    afresh."""
    return resume.state_key(
        scenario.model_dump(mode="json"),
        spec.to_dict(),
        shared.cfg.training_params.finetune.model_dump(mode="json"),
        shared.cfg.training_params.foundation.device,
        shared.fmeta.version,
        shared.cache.manifest["fingerprint"],
        shared.cache.manifest["created"],
        {k: [len(v), int(v.entity.sum()), int(v.time.sum())] for k, v in ex.items()},
        fixed_epochs,
    )


@dataclass
class _Resumable:
    """Where a scenario network's training stands after its last finished epoch, saved with the weights,
    the optimizer, the schedule and both random generators (training/resume.py: safetensors + JSON, one
    rename), so that a killed fine-tuning restarts at the next epoch and ends where an uninterrupted one
    ends."""

    directory: Path
    key: str
    epoch: int = 0  # epochs finished
    history: list[dict] = field(default_factory=list)
    best: float = -np.inf  # the best validation score (higher is better: the metric times its sign)
    bad: int = 0  # epochs since it improved
    best_state: dict[str, torch.Tensor] | None = None

    def restore(
        self, net: nn.Module, opt: Any, sched: Any, rng: np.random.Generator, every: int, progress: Progress
    ) -> None:
        if not every:
            return
        found = resume.load_state(self.directory, self.key, net, opt, sched, warn=progress.log)
        if found is None:
            return
        info, self.best_state = found
        self.epoch, self.history, self.bad = info["epoch"], info["history"], info["bad"]
        self.best = float(info["best"])
        rng.bit_generator.state = info["numpy_rng"]
        progress.log(f"resuming the network's training after epoch {self.epoch} ({self.directory})")

    def save(self, net: nn.Module, opt: Any, sched: Any, rng: np.random.Generator, every: int) -> None:
        if not every or self.epoch % every:
            return
        info = {
            "epoch": self.epoch,
            "history": self.history,
            "best": self.best if np.isfinite(self.best) else -1e300,
            "bad": self.bad,
            "numpy_rng": rng.bit_generator.state,
        }
        resume.save_state(self.directory, self.key, net, opt, sched, self.best_state, info)
