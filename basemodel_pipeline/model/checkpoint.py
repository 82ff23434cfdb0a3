"""Checkpoints without pickle: weights as safetensors, everything else as JSON.

A version directory holds model.safetensors, model.json (arch, encoder, history), any extra files, and
manifest.json, written last: {"files": {relative path: {bytes, sha256}}} of every other file. Loading
verifies them all (checkpoints are small) and reports a changed, truncated or unreadable file in one line
naming it and the stage that writes it again. Checkpoints written before manifests load unverified."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.diskfaults import require_space
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.model.trunk import Trunk, TrunkWithHead

WEIGHTS = "model.safetensors"
META = "model.json"
MANIFEST = "manifest.json"


def save_checkpoint(directory: Path, model: TrunkWithHead, meta: dict[str, Any]) -> None:
    """Write weights and metadata into `directory` (a staging dir: the caller publishes it atomically)."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    (directory / WEIGHTS).write_bytes(save(state))  # through Python: a full disk is an OSError (ENOSPC)
    (directory / META).write_text(json.dumps(meta, indent=2, default=str))


def write_manifest(directory: Path) -> None:
    """Record the size and sha256 of every file of a staged checkpoint (the last file written)."""
    files = ws.file_records(
        directory, [f for f in sorted(directory.rglob("*")) if f.is_file() and f.name != MANIFEST]
    )
    (directory / MANIFEST).write_text(json.dumps({"files": files}, indent=2))


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
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    extra = sum(len(c) for c in (extra_files or {}).values())
    require_space(root, weights + extra, f"checkpoint {root.name}/{version}")
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
        write_manifest(tmp)
    except BaseException:
        ws.discard_dir(tmp)
        raise
    ws.publish_dir(tmp, final)
    ws.set_latest(root, version)
    return version, final


def build_model(arch: dict[str, Any]) -> TrunkWithHead:
    trunk = Trunk(arch["in_dim"], arch["hidden_dim"], arch["num_blocks"], arch["dropout"])
    return TrunkWithHead(trunk, arch["out_dim"])


def redo(directory: Path) -> str:
    """What writes this checkpoint again (scenario versions live in checkpoints/scenarios/<name>/)."""
    if directory.parent.parent.name == "scenarios":
        return f"re-run `basemodel finetune CONFIG -s {directory.parent.name}`"
    return "re-run `basemodel pretrain CONFIG`"


def problems(directory: Path) -> list[str]:
    """What differs from the checkpoint's manifest ([] when all matches, or when it has no manifest)."""
    try:
        files = json.loads((directory / MANIFEST).read_text())["files"]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{MANIFEST}: unreadable ({exc})"]
    return ws.file_problems(directory, files, MANIFEST)


def _damaged(directory: Path, problem: str) -> UserError:
    name, _, what = problem.partition(": ")
    return UserError(
        f"checkpoint file {directory / name}: {what}; {redo(directory)}, or point {directory.parent / 'LATEST'} "
        "at an earlier version"
    )


def verify(directory: Path) -> None:
    """Raise a one-line UserError for the first file that differs from the manifest."""
    found = problems(directory)
    if found:
        raise _damaged(directory, found[0])


def read_meta(directory: Path, verified: bool = False) -> dict[str, Any]:
    """model.json of a checkpoint (the checkpoint verified first unless `verified`)."""
    if not verified:
        verify(directory)
    try:
        meta = json.loads((directory / META).read_text())
        if not isinstance(meta, dict) or not isinstance(meta.get("arch"), dict):
            raise ValueError("no 'arch' object")
    except (OSError, ValueError) as exc:
        raise _damaged(directory, f"{META}: unreadable ({' '.join(str(exc).split())})") from None
    return meta


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(directory / WEIGHTS))
    except (OSError, SafetensorError) as exc:
        raise _damaged(directory, f"{WEIGHTS}: unreadable ({' '.join(str(exc).split())})") from None


def check_shapes(directory: Path, arch: dict[str, Any]) -> None:
    """The architecture in model.json fits the stored tensors (checked on the meta device: nothing is
    allocated, so an absurd size in an edited model.json costs nothing)."""
    try:
        with torch.device("meta"):
            wanted = {k: tuple(v.shape) for k, v in build_model(arch).state_dict().items()}
        with safe_open(str(directory / WEIGHTS), "pt") as fh:
            stored = {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}  # noqa: SIM118
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise _damaged(directory, f"{META}: 'arch' is not a valid architecture ({exc})") from None
    except (OSError, SafetensorError) as exc:
        raise _damaged(directory, f"{WEIGHTS}: unreadable ({' '.join(str(exc).split())})") from None
    if wanted != stored:
        diff = sorted(k for k in set(wanted) | set(stored) if wanted.get(k) != stored.get(k))
        raise _damaged(
            directory,
            f"{META}: its 'arch' does not fit {WEIGHTS} ({diff[0]}: {wanted.get(diff[0])} vs "
            f"{stored.get(diff[0])} stored)",
        )


def load_checkpoint(directory: Path) -> tuple[TrunkWithHead, dict[str, Any]]:
    meta = read_meta(directory)
    check_shapes(directory, meta["arch"])
    model = build_model(meta["arch"])
    model.load_state_dict(_weights(directory))
    model.eval()
    return model, meta


def load_trunk_state(directory: Path) -> dict[str, torch.Tensor]:
    """Only the trunk's tensors (for fine-tuning from a foundation checkpoint)."""
    verify(directory)
    state = _weights(directory)
    return {k.removeprefix("trunk."): v for k, v in state.items() if k.startswith("trunk.")}
