"""`predict --workers K` never starts more scoring processes than the cores and free memory allow."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.inference import shards
from basemodel_pipeline.pipeline import (
    run_cache,
    run_extract,
    run_finetune,
    run_predict_workers,
    run_pretrain,
)
from basemodel_pipeline.progress import NullProgress

GIB = 2**30


@pytest.mark.parametrize(
    ("requested", "cores", "free", "expected", "message"),
    [
        (64, 2, 3.1 * GIB, 2, "--workers 64 capped to 2: 2 cores, 3.1 GiB free at ~400 MB per worker"),
        (8, 16, 1.0 * GIB, 2, "--workers 8 capped to 2: 16 cores, 1.0 GiB free at ~400 MB per worker"),
        (4, 1, 0.1 * GIB, 1, "--workers 4 capped to 1: 1 core, 0.1 GiB free at ~400 MB per worker"),
        (2, 16, 64.0 * GIB, 2, None),
        (3, 16, None, 3, None),  # free memory unknown: cores only
    ],
)
def test_worker_cap_by_cores_and_memory(
    requested: int, cores: int, free: float | None, expected: int, message: str | None
) -> None:
    assert shards.cap_workers(requested, cores, None if free is None else int(free)) == (expected, message)


def test_the_machine_is_measured() -> None:
    assert shards.usable_cores() >= 1
    free = shards.available_memory()
    assert free is None or free > 0


@pytest.mark.parametrize("workers", [0, -3])
def test_workers_below_one_is_a_user_error(tiny_config: Path, workers: int) -> None:
    with pytest.raises(UserError, match="--workers"):
        run_predict_workers(load_config(tiny_config), tiny_config, "churn", None, workers, [])


def test_predict_with_more_workers_than_cores_runs_at_most_the_cap(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = yaml.safe_load(tiny_config.read_text())
    raw["training_params"]["foundation"].update(epochs=1, hidden_dim=16, num_blocks=1)
    raw["training_params"]["finetune"].update(epochs=1)
    tiny_config.write_text(yaml.safe_dump(raw))
    cfg = load_config(tiny_config)
    run_extract(cfg)
    run_cache(cfg)
    run_pretrain(cfg)
    run_finetune(cfg, "churn")
    monkeypatch.setattr(shards, "usable_cores", lambda: 2)  # the machine of the issue: 2 cores, 3.1 GiB
    monkeypatch.setattr(shards, "available_memory", lambda: int(3.1 * GIB))
    started: list[list[str]] = []
    real_popen = shards.subprocess.Popen

    def counting_popen(cmd: list[str], **kwargs: object) -> object:
        started.append(cmd)
        return real_popen(cmd, **kwargs)

    monkeypatch.setattr(shards.subprocess, "Popen", counting_popen)
    log: list[str] = []

    class Capture(NullProgress):
        def log(self, message: str) -> None:
            log.append(message)

    out = run_predict_workers(cfg, tiny_config, "churn", None, 4, ["--precision", "fp32"], None, Capture())
    assert len(started) == 2 and out["workers"] == 2 and out["shards"] == 2
    assert "--workers 4 capped to 2: 2 cores, 3.1 GiB free at ~400 MB per worker" in log, log
    as_of = shards.default_as_of(shards.EventCache(shards.cache_dir(cfg)))
    assert len(list(shards.parts_dir(cfg, "churn", as_of, 2).glob("part-*.parquet"))) == 2
    assert not shards.parts_dir(cfg, "churn", as_of, 4).exists()
