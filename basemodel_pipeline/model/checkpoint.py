"""Checkpoints without pickle: weights as safetensors, everything else as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.model.trunk import Trunk, TrunkWithHead

WEIGHTS = "model.safetensors"
META = "model.json"


def save_checkpoint(directory: Path, model: TrunkWithHead, meta: dict[str, Any]) -> None:
    """Write weights and metadata into `directory` (a staging dir: the caller publishes it atomically)."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(directory / WEIGHTS))
    (directory / META).write_text(json.dumps(meta, indent=2, default=str))


def publish_checkpoint(
    root: Path,
    model: TrunkWithHead,
    meta: dict[str, Any],
    extra_files: dict[str, str] | dict[str, str | bytes] | None = None,
) -> tuple[str, Path]:
    """Write a new version under `root` atomically and point LATEST at it. Returns (version, path).
    `extra_files`: relative path -> text or bytes (subdirectories are created)."""
    version = ws.new_version()
    ws.clean_stale_tmp(root)
    final = root / version
    tmp = ws.staging_dir(final)
    try:
        save_checkpoint(tmp, model.cpu(), {**meta, "version": version})
        for name, content in (extra_files or {}).items():
            path = tmp / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)
    except BaseException:
        ws.discard_dir(tmp)
        raise
    ws.publish_dir(tmp, final)
    ws.set_latest(root, version)
    return version, final


def build_model(arch: dict[str, Any]) -> TrunkWithHead:
    trunk = Trunk(arch["in_dim"], arch["hidden_dim"], arch["num_blocks"], arch["dropout"])
    return TrunkWithHead(trunk, arch["out_dim"])


def load_checkpoint(directory: Path) -> tuple[TrunkWithHead, dict[str, Any]]:
    meta = json.loads((directory / META).read_text())
    model = build_model(meta["arch"])
    model.load_state_dict(load_file(str(directory / WEIGHTS)))
    model.eval()
    return model, meta


def load_trunk_state(directory: Path) -> dict[str, torch.Tensor]:
    """Only the trunk's tensors (for fine-tuning from a foundation checkpoint)."""
    state = load_file(str(directory / WEIGHTS))
    return {k.removeprefix("trunk."): v for k, v in state.items() if k.startswith("trunk.")}
