"""Training a scenario's network (the trunk and its head) with per-scenario early stopping; modes in
scenarios/finetune.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from basemodel_pipeline import runtime
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.config import PipelineConfig, Scenario
from basemodel_pipeline.model.lora import add_lora, merge_lora
from basemodel_pipeline.model.trunk import TrunkWithHead
from basemodel_pipeline.progress import Progress
from basemodel_pipeline.scenarios.shared import Shared
from basemodel_pipeline.targets.labels import Examples, TargetSpec
from basemodel_pipeline.tasks import Task, task_for
from basemodel_pipeline.training import fit, loop, resume
from basemodel_pipeline.training.calibrate import auto_batch

RESUME = ".resume"  # under the scenario's checkpoint root, beside its versions
HEAD_BATCH_MAX = 2048  # finetune.batch_size auto (head_batch_size)


def train_network(
    shared: Shared,
    scenario: Scenario,
    spec: TargetSpec,
    ex: dict[str, Examples],
    progress: Progress,
    fixed_epochs: int | None = None,
    task: Task | None = None,
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
    head = task or task_for(spec)
    model = shared.new_model(head.out_dim)
    head.init_bias(model.head, ex["train"].labels)
    model.to(device)
    rows = {k: shared.rows(v) for k, v in ex.items()}
    inputs, net, params = _trainable(shared, model, mode, scenario.lora_rank, device)
    n = len(ex["train"])
    batch_size = head_batch_size(p.batch_size, mode, n)
    steps = epochs * -(-n // batch_size)
    opt, sched = loop.optimizer_and_schedule(params, lr, p.weight_decay, min(100, steps // 10), steps)
    rng = np.random.default_rng(p.seed)
    sign = 1.0 if head.higher_is_better() else -1.0
    val_truth = head.truth(ex["val"].labels)
    bar = f"finetune {scenario.name}"
    progress.start(bar, steps)

    def batch(idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:  # [b, in_dim or hidden], head targets
        xb = torch.from_numpy(inputs[rows["train"][idx]]).to(device)
        return xb, head.targets(ex["train"].labels, idx).to(device)

    def train(run: resume.RunState, epoch: int) -> None:
        def on_step(loss: float, size: int) -> None:
            run.stepped(epoch, loss, size)
            progress.advance(bar, 1, loss=loss)

        try:  # the shared loop (training/loop.py): bf16 autocast on CUDA, fp32 on the CPU
            loop.train_epoch(net, n, batch, head.loss, opt, sched, batch_size, rng, device, on_step)
        except FloatingPointError as exc:
            raise FloatingPointError(f"scenario '{scenario.name}': {exc}") from None

    def validate(epoch: int) -> float:
        val_logits = runtime.predict(net, inputs[rows["val"]], device)
        return float(head.primary(val_truth, head.network_outputs(val_logits)))

    saver = resume.Saver(
        _resume_dir(shared, scenario, fixed_epochs), _run_key(shared, scenario, spec, ex, fixed_epochs),
        net, opt, sched, every_epochs=p.checkpoint_every_epochs, rng=rng, bar=bar,
        label="the network's training",
    )  # fmt: skip
    stopping = fit.Stopping(
        "val_metric",
        head.higher_is_better(),
        p.patience,
        fixed_epochs is not None,
        f"val_{head.primary_metric}",
    )
    # a head on a frozen trunk's outputs: tiny operations, one CPU thread (runtime.torch_threads)
    threads = 1 if mode == "frozen" else torch.get_num_threads()
    with runtime.torch_threads(threads):
        run = fit.fit(
            saver.resume(progress),
            epochs,
            train,
            validate,
            net,
            stopping,
            progress.log,
            saver,
            f"{scenario.name} ",
        )
    best_state = run.best_state
    assert best_state is not None
    net.load_state_dict(best_state)
    if mode == "lora":
        merge_lora(model.trunk)
    return model.cpu(), head, run.history, sign * fit.score(run.best, head.higher_is_better())


def head_batch_size(batch_size: int | str, mode: str, n: int) -> int:
    """finetune.batch_size resolved for `n` training examples: auto is 256, and for a head on a frozen trunk
    doubled up to HEAD_BATCH_MAX while an epoch keeps at least 128 steps (calibrate.auto_batch)."""
    if batch_size != "auto":
        return int(batch_size)
    return auto_batch(n, HEAD_BATCH_MAX if mode == "frozen" else 256)


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
