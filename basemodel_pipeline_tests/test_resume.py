"""Foundation training resumes from its last saved state and ends where an uninterrupted run ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from basemodel_pipeline.config import load_config
from basemodel_pipeline.pipeline import run_cache, run_extract, run_pretrain
from basemodel_pipeline.progress import NullProgress

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
    cmd = [sys.executable, "-m", "basemodel_pipeline.jobs.pretrain", "--config", str(config)]
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
