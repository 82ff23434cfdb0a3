"""Data-parallel foundation training: two torchrun processes on CPU (gloo) train and publish one checkpoint."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

from basemodel_pipeline.config import load_config
from basemodel_pipeline.pipeline import run_cache, run_extract
from basemodel_pipeline.training.distributed import World


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_shard_gives_every_rank_the_same_number_of_queries() -> None:
    e, t = np.arange(11), np.arange(11) * 10
    shards = [World(r, 3).shard(e, t) for r in range(3)]
    assert [len(s[0]) for s in shards] == [3, 3, 3]
    assert sorted(np.concatenate([s[0] for s in shards])) == list(range(9))
    assert World().shard(e, t)[0] is e


def test_torchrun_two_cpu_processes_publish_one_foundation(tiny_config: Path) -> None:
    raw = yaml.safe_load(tiny_config.read_text())
    raw["training_params"]["foundation"].update(
        {"epochs": 2, "hidden_dim": 32, "num_blocks": 1, "batch_size": 32, "device": "cpu"}
    )
    tiny_config.write_text(yaml.safe_dump(raw))
    cfg = load_config(tiny_config)
    run_extract(cfg)
    run_cache(cfg)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
        "-m", "basemodel_pipeline.cli", "pretrain", str(tiny_config),
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    root = Path(cfg.workspace) / "checkpoints" / "foundation"
    versions = [
        d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".") and d.name != "verdicts"
    ]
    assert len(versions) == 1  # rank 0 alone published
    meta = json.loads((versions[0] / "model.json").read_text())
    assert meta["world_size"] == 2
    assert len(meta["history"]) == 2 and all(np.isfinite(h["val_loss"]) for h in meta["history"])
