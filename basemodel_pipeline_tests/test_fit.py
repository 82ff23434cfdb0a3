"""The one epoch loop (training/fit.py): the kept epoch, early stopping, resume, and that it is the only one."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from basemodel_pipeline.progress import NullProgress
from basemodel_pipeline.training import loop, resume
from basemodel_pipeline.training.fit import Stopping, best_epoch, fit

ROOT = Path(__file__).resolve().parents[1] / "basemodel_pipeline"


class Lines(NullProgress):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, message: str) -> None:
        self.lines.append(message)


def _scripted(values: list[float], stopping: Stopping) -> tuple[resume.RunState, nn.Linear, list[str]]:
    """fit over validation values given in advance; epoch k's weights are all k + 1."""
    model, log = nn.Linear(2, 1), Lines()

    def train(run: resume.RunState, epoch: int) -> None:
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(epoch + 1)
        run.stepped(epoch, 1.0, 4)

    run = fit(resume.RunState(), len(values), train, lambda e: values[e], model, stopping, log.log)
    return run, model, log.lines


def test_early_stopping_keeps_the_best_epoch_and_stops_after_patience_epochs_without_improvement() -> None:
    run, _, lines = _scripted([3.0, 2.5, 2.6, 2.7, 2.0], Stopping("val_loss", patience=2))
    assert [h["epoch"] for h in run.history] == [1, 2, 3, 4]  # 2.6, 2.7 do not beat 2.5: no fifth epoch
    assert run.best == 2.5 and torch.all(run.best_state["weight"] == 2)
    assert lines[-1] == "val_loss did not improve for 2 epochs: stopping"
    assert lines[0] == "epoch 1: train_loss=1.0000 val_loss=3.0000"
    run, _, _ = _scripted([3.0, 2.5, 2.6, 2.4, 2.45], Stopping("val_loss", patience=2))
    assert len(run.history) == 5 and run.best == 2.4  # an improvement resets the count
    assert best_epoch(run.history, Stopping("val_loss")) == 4


def test_a_higher_is_better_metric_a_non_finite_value_and_keeping_the_last_epoch() -> None:
    up = Stopping("val_metric", higher_is_better=True, patience=1)
    run, _, _ = _scripted([0.6, 0.7, 0.65, 0.9], up)
    assert [h["val_metric"] for h in run.history] == [0.6, 0.7, 0.65] and run.best == 0.7
    run, _, _ = _scripted([math.nan, 0.5, math.nan], Stopping("val_metric", higher_is_better=True))
    assert run.best == 0.5 and torch.all(run.best_state["weight"] == 2)  # NaN is never better
    last = Stopping("val_metric", higher_is_better=True, patience=1, keep_last=True)
    run, _, _ = _scripted([0.9, 0.1, 0.2], last)
    assert len(run.history) == 3 and run.best == 0.2 and torch.all(run.best_state["weight"] == 3)


def _regression(directory: Path, crash_at: int | None = None) -> tuple[resume.RunState, nn.Module]:
    """A small network fitted through loop.train_epoch, saving its state after every epoch."""
    torch.manual_seed(0)
    data = np.random.default_rng(1)
    X = torch.from_numpy(data.normal(size=(200, 4)).astype(np.float32))
    Y = X @ torch.tensor([[1.0], [-2.0], [0.5], [0.0]]) + 0.1
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(8, 1))
    opt, sched = loop.optimizer_and_schedule(model.parameters(), 0.01, 0.0, 2, 60)
    rng = np.random.default_rng(2)
    saver = resume.Saver(directory, "k", model, opt, sched, every_epochs=1, rng=rng, bar="b", label="the net")
    cpu = torch.device("cpu")

    def train(run: resume.RunState, epoch: int) -> None:
        if epoch == crash_at:
            raise KeyboardInterrupt("simulated kill")
        on_step = lambda loss, n: run.stepped(epoch, loss, n)  # noqa: E731
        loop.train_epoch(
            model, 200, loop.array_batch(X, Y, cpu), nn.functional.mse_loss, opt, sched, 32, rng, cpu, on_step
        )

    def validate(epoch: int) -> float:
        model.eval()
        with torch.no_grad():
            return float(nn.functional.mse_loss(model(X), Y))

    run = fit(saver.resume(Lines()), 6, train, validate, model, Stopping(patience=10), Lines().log, saver)
    return run, model


def test_a_run_killed_after_an_epoch_resumes_and_ends_like_an_uninterrupted_one(tmp_path: Path) -> None:
    reference, ref_model = _regression(tmp_path / "a")
    with pytest.raises(KeyboardInterrupt):
        _regression(tmp_path / "b", crash_at=3)
    assert json.loads((tmp_path / "b" / "state.json").read_text())["info"]["epoch"] == 3
    resumed, model = _regression(tmp_path / "b")
    strip = lambda h: [{k: v for k, v in r.items() if k != "seconds"} for r in h]  # noqa: E731
    assert strip(resumed.history) == strip(reference.history)
    assert resumed.best == reference.best and resumed.step == reference.step
    assert all(torch.equal(reference.best_state[k], resumed.best_state[k]) for k in reference.best_state)
    assert all(torch.equal(a, b) for a, b in zip(ref_model.parameters(), model.parameters(), strict=True))


def test_a_state_saved_in_an_earlier_format_is_ignored_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        _regression(tmp_path, crash_at=2)
    meta = json.loads((tmp_path / "state.json").read_text())
    del meta["format"]  # what states saved before RunState was the one record look like
    (tmp_path / "state.json").write_text(json.dumps(meta))
    model = nn.Linear(4, 1)
    opt, sched = loop.optimizer_and_schedule(model.parameters(), 0.01, 0.0, 2, 60)
    lines = Lines()
    run = resume.Saver(tmp_path, "k", model, opt, sched, every_epochs=1).resume(lines)
    assert run.epoch == 0 and run.history == []
    assert len(lines.lines) == 1 and "format 1" in lines.lines[0] and "starting afresh" in lines.lines[0]
    assert not (tmp_path / "state.json").exists()


def test_the_library_has_one_epoch_loop() -> None:
    """Every loop over epochs is training/fit.py's: the others hand fit their epoch's training."""
    found = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.For) and "epoch" in ast.unparse(node.target).lower():
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert [f.split(":")[0] for f in found] == ["training/fit.py"], found
