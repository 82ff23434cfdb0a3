"""Foundation training resumes from its last saved state and ends where an uninterrupted run ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file

from basemodel_pipeline.config import load_config
from basemodel_pipeline.pipeline import run_cache, run_extract, run_pretrain
from basemodel_pipeline.progress import NullProgress
from basemodel_pipeline.training import resume

OVERRIDES = {
    "epochs": 3,
    "batch_size": 16,
    "split_points_per_entity": 4,
    "checkpoint_every_steps": 3,
    "hidden_dim": 32,
    "num_blocks": 1,
}


def _prepared(tiny_config: Path) -> Path:
    raw = yaml.safe_load(tiny_config.read_text())
    raw["training_params"]["foundation"].update(OVERRIDES)
    tiny_config.write_text(yaml.safe_dump(raw))
    cfg = load_config(tiny_config)
    run_extract(cfg)
    run_cache(cfg)
    return tiny_config


class CrashAfter(NullProgress):
    def __init__(self, steps: int) -> None:
        self.steps = steps

    def advance(self, task: str, amount: int = 1, **metrics: float) -> None:
        self.steps -= amount
        if task == "pretrain" and self.steps < 0:
            raise KeyboardInterrupt("simulated crash")


def test_crash_then_resume_matches_uninterrupted_run(tiny_config: Path) -> None:
    cfg = load_config(_prepared(tiny_config))
    reference = run_pretrain(cfg)
    with pytest.raises(KeyboardInterrupt):
        run_pretrain(cfg, CrashAfter(20))  # mid second epoch; last state saved at step 18
    state = Path(cfg.workspace) / "checkpoints" / "foundation" / ".resume" / "state.json"
    assert json.loads(state.read_text())["info"]["step"] == 18
    resumed = run_pretrain(cfg)
    assert resumed["epochs"] == reference["epochs"]
    assert resumed["val_loss"] == pytest.approx(reference["val_loss"], rel=0.01)
    assert not state.exists()  # cleared once the checkpoint is published


def test_changed_config_does_not_resume_a_foreign_state(tiny_config: Path) -> None:
    cfg = load_config(_prepared(tiny_config))
    with pytest.raises(KeyboardInterrupt):
        run_pretrain(cfg, CrashAfter(10))
    raw = yaml.safe_load(tiny_config.read_text())
    raw["training_params"]["foundation"]["learning_rate"] = 0.002
    tiny_config.write_text(yaml.safe_dump(raw))
    log: list[str] = []

    class Capture(NullProgress):
        def log(self, message: str) -> None:
            log.append(message)

    run_pretrain(load_config(tiny_config), Capture())
    assert not any(m.startswith("resuming") for m in log)


def test_sigkill_then_rerun_reaches_the_same_validation_loss(tiny_config: Path) -> None:
    config = _prepared(tiny_config)
    cfg = load_config(config)
    reference = run_pretrain(cfg)
    state = Path(cfg.workspace) / "checkpoints" / "foundation" / ".resume" / "state.json"
    cmd = [sys.executable, "-m", "basemodel_pipeline.entrypoints.pretrain", "--config", str(config)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 120
    while not state.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    if proc.poll() is not None:
        pytest.skip("training finished before a state was saved; nothing to kill")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert state.exists()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    resumed = json.loads(out.stdout[out.stdout.index("{") :]) if "{" in out.stdout else {}
    val = resumed.get("val_loss", resumed.get("metadata", {}).get("val_loss"))
    assert val is not None, out.stdout[-2000:]
    assert float(val) == pytest.approx(reference["val_loss"], rel=0.01)


# --- the resume state is saved atomically and an unreadable one means a fresh start ---


def _toy() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any) -> None:
    model(torch.ones(4, 3)).pow(2).sum().backward()
    opt.step()
    opt.zero_grad()
    sched.step()


def _info(step: int) -> dict[str, Any]:
    return resume.RunState(step=step).info()


def _save(directory: Path, model: Any, opt: Any, sched: Any, step: int) -> dict[str, torch.Tensor]:
    resume.save_state(directory, "k", model, opt, sched, None, _info(step))
    return {k: v.clone() for k, v in model.state_dict().items()}


class Boom(Exception):
    """The injected fault (a kill at this point of the save)."""


def _failing_at(n: int, real: Any) -> Any:
    """A stand-in for `real` that raises Boom on its n-th call (1-based)."""
    calls = {"n": 0}

    def fake(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == n:
            raise Boom(f"killed at call {n}")
        return real(*args, **kwargs)

    return fake


def _fault_points() -> list[tuple[str, Any, str, Any]]:
    """(label, object, attribute, real function): every write and rename the save goes through."""
    return [
        ("tensors", resume, "save_file", resume.save_file),
        ("json", resume.fs, "atomic_write_text", resume.fs.atomic_write_text),
        ("rename", os, "replace", os.replace),
    ]


@pytest.mark.parametrize("label", ["tensors", "json", "rename"])
def test_a_kill_at_any_point_of_the_save_leaves_a_consistent_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, label: str
) -> None:
    (_, obj, attr, real) = next(p for p in _fault_points() if p[0] == label)
    for n in range(1, 10):
        directory = tmp_path / f"kill{n}" / ".resume"
        torch.manual_seed(0)
        model, opt, sched = _toy()
        _train_step(model, opt, sched)
        saved = _save(directory, model, opt, sched, step=1)
        _train_step(model, opt, sched)
        monkeypatch.setattr(obj, attr, _failing_at(n, real))
        try:
            _save(directory, model, opt, sched, step=2)
            killed = False
        except Boom:
            killed = True
        monkeypatch.setattr(obj, attr, real)
        fresh, fopt, fsched = _toy()
        warnings: list[str] = []
        loaded = resume.load_state(directory, "k", fresh, fopt, fsched, warn=warnings.append)
        if not killed:
            assert loaded is not None and loaded[0]["step"] == 2
            break  # every call of this function was tried
        if loaded is not None:  # resumes from the previous complete state, weights and counters together
            assert loaded[0]["step"] == 1, f"{label} call {n}"
            for k, v in fresh.state_dict().items():
                assert torch.equal(v, saved[k]), f"{label} call {n}: step-1 counters with other weights"
    else:
        pytest.fail(f"save_state called {attr} more than 9 times")


def test_a_corrupt_state_is_ignored_with_a_warning(tmp_path: Path) -> None:
    directory = tmp_path / ".resume"
    for name, garbage in [("state.json", b'{"key": "k", "info": '), ("state.safetensors", b"\x00" * 64)]:
        model, opt, sched = _toy()
        _save(directory, model, opt, sched, step=3)
        _train_step(model, opt, sched)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        (directory / name).write_bytes(garbage)
        warnings: list[str] = []
        assert resume.load_state(directory, "k", model, opt, sched, warn=warnings.append) is None
        assert len(warnings) == 1 and "starting afresh" in warnings[0], warnings
        for k, v in model.state_dict().items():
            assert torch.equal(v, before[k])  # nothing half-loaded
        assert not directory.exists()  # removed, so it cannot wedge the next run either


def _weights(result: dict[str, Any]) -> dict[str, torch.Tensor]:
    return load_file(str(Path(result["path"]) / "model.safetensors"))


def test_kill_between_weights_and_counters_then_rerun_gives_the_uninterrupted_model(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load_config(_prepared(tiny_config))
    reference = run_pretrain(cfg)
    real = resume.fs.atomic_write_text

    def killed_at_step_21(path: Path, text: str) -> None:
        if path.name == resume.META and json.loads(text)["info"]["step"] == 21:
            raise KeyboardInterrupt("simulated kill after the weights, before state.json")
        real(path, text)

    monkeypatch.setattr(resume.fs, "atomic_write_text", killed_at_step_21)
    with pytest.raises(KeyboardInterrupt):
        run_pretrain(cfg)
    monkeypatch.setattr(resume.fs, "atomic_write_text", real)
    log: list[str] = []

    class Capture(NullProgress):
        def log(self, message: str) -> None:
            log.append(message)

    resumed = run_pretrain(cfg, Capture())
    assert any(m.startswith("resuming from step 18") for m in log), log
    ref, got = _weights(reference), _weights(resumed)
    assert all(torch.equal(ref[k], got[k]) for k in ref)


def test_a_corrupt_state_does_not_wedge_pretrain(tiny_config: Path) -> None:
    cfg = load_config(_prepared(tiny_config))
    state = Path(cfg.workspace) / "checkpoints" / "foundation" / ".resume"
    state.mkdir(parents=True)
    (state / "state.json").write_text('{"key": ')
    (state / "state.safetensors").write_bytes(b"\x00" * 16)
    log: list[str] = []

    class Capture(NullProgress):
        def log(self, message: str) -> None:
            log.append(message)

    result = run_pretrain(cfg, Capture())
    assert result["epochs"] == OVERRIDES["epochs"]
    assert any("starting afresh" in m for m in log), log
    assert not any(m.startswith("resuming") for m in log)


# ---- fine-tuning ------------------------------------------------------------------------------------------
class CrashAtLog(NullProgress):
    """Raises when a log line starts with `prefix` (after the epoch before it has saved its state)."""

    def __init__(self, prefix: str) -> None:
        self.prefix, self.lines = prefix, []

    def log(self, message: str) -> None:
        self.lines.append(message)
        if message.startswith(self.prefix):
            raise KeyboardInterrupt("simulated crash")


class Lines(NullProgress):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, message: str) -> None:
        self.lines.append(message)


def _network_result(meta: dict) -> tuple[dict, list, dict[str, torch.Tensor]]:
    folder = Path(meta["path"])
    metrics = json.loads((folder / "metrics.json").read_text())
    return metrics["test"], metrics["history"], load_file(str(folder / "model.safetensors"))


@pytest.mark.parametrize("mode", ["full", "frozen"])
def test_a_killed_finetune_resumes_at_the_next_epoch_and_ends_like_an_uninterrupted_one(
    tiny_config: Path, mode: str
) -> None:
    from basemodel_pipeline.pipeline import run_finetune

    raw = yaml.safe_load(_prepared(tiny_config).read_text())
    # without the production refit, whose own training would log its epochs again
    raw["training_params"]["finetune"].update(
        {"mode": mode, "epochs": 4, "patience": 10, "refit_on_all": False}
    )
    raw["scenarios"] = [{**s, "candidates": ["neural"]} for s in raw["scenarios"] if s["name"] == "churn"]
    tiny_config.write_text(yaml.safe_dump(raw))
    cfg = load_config(tiny_config)
    run_pretrain(cfg)
    test, history, weights = _network_result(run_finetune(cfg, "churn"))
    state_dir = Path(cfg.workspace) / "checkpoints" / "scenarios" / "churn" / ".resume"
    assert not state_dir.exists()  # removed once the checkpoint is published

    with pytest.raises(KeyboardInterrupt):
        run_finetune(cfg, "churn", CrashAtLog("churn epoch 3:"))  # epoch 3 trained, its state not saved
    saved = json.loads((state_dir / "train" / "state.json").read_text())
    assert saved["info"]["epoch"] == 2 and len(saved["info"]["history"]) == 2

    lines = Lines()
    test2, history2, weights2 = _network_result(run_finetune(cfg, "churn", lines))
    assert any("resuming the network's training after epoch 2" in line for line in lines.lines), lines.lines
    assert not any(line.startswith(("churn epoch 1:", "churn epoch 2:")) for line in lines.lines)
    assert [h["val_metric"] for h in history2] == [h["val_metric"] for h in history]
    assert [h["train_loss"] for h in history2] == [h["train_loss"] for h in history]
    assert test2 == test
    assert weights2.keys() == weights.keys() and all(torch.equal(weights[k], weights2[k]) for k in weights)
    assert not state_dir.exists()


def test_a_finetune_of_another_foundation_does_not_resume_a_foreign_state(tiny_config: Path) -> None:
    from basemodel_pipeline.pipeline import run_finetune

    raw = yaml.safe_load(_prepared(tiny_config).read_text())
    raw["training_params"]["finetune"].update({"epochs": 3, "patience": 10})
    raw["scenarios"] = [{**s, "candidates": ["neural"]} for s in raw["scenarios"] if s["name"] == "churn"]
    tiny_config.write_text(yaml.safe_dump(raw))
    cfg = load_config(tiny_config)
    run_pretrain(cfg)
    with pytest.raises(KeyboardInterrupt):
        run_finetune(cfg, "churn", CrashAtLog("churn epoch 2:"))
    run_pretrain(cfg.model_copy(deep=True))  # a new foundation version: the saved state is not its own
    lines = Lines()
    run_finetune(cfg, "churn", lines)
    assert not any("resuming the network" in line for line in lines.lines)
    assert any(line.startswith("churn epoch 1:") for line in lines.lines)
