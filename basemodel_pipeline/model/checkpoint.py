"""Checkpoints without pickle: weights as safetensors, everything else as JSON.

A version directory holds model.safetensors, model.json (a CheckpointMeta: the TrunkConfig, the feature
encoder, the training history and, for a scenario, its definition, target and published candidate), any
extra files, and manifest.json, written last: {"files": {relative path: {bytes, sha256}}} of every other
file. model.json's `checksums` names the manifest, so the checkpoint itself says it has one. Loading verifies
them all (checkpoints are small) and reports a changed, truncated or unreadable file, or a missing manifest
(nothing could be checked), in one line naming it and the stage that writes it again: no checkpoint loads
unverified. Every consumer reads model.json through read_meta, as a typed record, never by hand."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save

from basemodel_pipeline import files as fs
from basemodel_pipeline import manifests
from basemodel_pipeline.diskfaults import require_space
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.metadata import finite
from basemodel_pipeline.model.trunk import Trunk, TrunkWithHead

WEIGHTS = "model.safetensors"
META = "model.json"
MANIFEST = "manifest.json"


class TrunkConfig(BaseModel):
    """The network's shape (model.json's `arch`): all build_model needs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    in_dim: int = Field(gt=0)
    hidden_dim: int = Field(gt=0)
    num_blocks: int = Field(ge=0)
    dropout: float = Field(ge=0.0, lt=1.0)
    out_dim: int = Field(gt=0)

    def with_out_dim(self, out_dim: int) -> TrunkConfig:
        """The same trunk under another head (a scenario's head on the foundation's trunk)."""
        return self.model_copy(update={"out_dim": out_dim})


class CheckpointMeta(BaseModel):
    """model.json of a checkpoint version. Foundation and scenario checkpoints share the first block; the
    rest is set by the kind that writes it (None where it does not apply). Unknown keys are kept, so a
    newer writer's additions survive an older reader."""

    model_config = ConfigDict(frozen=True, extra="allow")

    kind: Literal["foundation", "scenario"]
    version: str = ""  # set by publish_checkpoint
    arch: TrunkConfig
    encoder: dict[str, Any] = Field(default_factory=dict)  # features/encoder.FeatureEncoder.to_dict()
    cache_fingerprint: str | None = None  # the event cache it was trained on
    history: list[dict[str, Any]] = Field(default_factory=list)  # one record per epoch
    # foundation checkpoints
    horizon_days: int | None = None
    input_dropout: float | None = None
    best_val_loss: float | None = None
    training_sizes: dict[str, Any] | None = None
    world_size: int | None = None
    # scenario checkpoints
    scenario: dict[str, Any] | None = None  # the scenario's config, as trained
    target: dict[str, Any] | None = None  # the target spec (scenarios/targets.TargetSpec.to_dict())
    foundation_version: str | None = None
    published: dict[str, Any] | None = None  # the published candidate: name and what reloads it
    metrics: dict[str, Any] | None = None
    checksums: str | None = None  # MANIFEST: publish_checkpoint wrote the checksums of every file there

    def to_json(self) -> str:
        """Strict JSON (NaN as null), numpy scalars as numbers, anything else JSON lacks as text."""
        return json.dumps(finite(self.model_dump(exclude_none=True)), indent=2, allow_nan=False, default=str)


def save_checkpoint(directory: Path, model: TrunkWithHead, meta: CheckpointMeta) -> None:
    """Write weights and metadata into `directory` (a staging dir: the caller publishes it atomically)."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    (directory / WEIGHTS).write_bytes(save(state))  # through Python: a full disk is an OSError (ENOSPC)
    (directory / META).write_text(meta.to_json())


def write_manifest(directory: Path) -> None:
    """Record the size and sha256 of every file of a staged checkpoint (the last file written)."""
    files = manifests.file_records(
        directory, [f for f in sorted(directory.rglob("*")) if f.is_file() and f.name != MANIFEST]
    )
    (directory / MANIFEST).write_text(json.dumps(manifests.signed({"files": files}), indent=2))


def publish_checkpoint(
    root: Path,
    model: TrunkWithHead,
    meta: CheckpointMeta,
    extra_files: dict[str, str] | dict[str, str | bytes] | None = None,
    *,
    promote: bool,
) -> tuple[str, Path]:
    """Write a new version under `root` atomically. Returns (version, path). `extra_files`: relative path ->
    text or bytes (subdirectories are created). With `promote` LATEST names it at once; the training stages
    write candidates (promote=False) that their quality gates promote (training/promotion.py)."""
    version = fs.new_version()
    fs.clean_stale_tmp(root)
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    extra = sum(len(c) for c in (extra_files or {}).values())
    require_space(root, weights + extra, f"checkpoint {root.name}/{version}")
    final = root / version
    tmp = fs.staging_dir(final)
    try:
        save_checkpoint(tmp, model.cpu(), meta.model_copy(update={"version": version, "checksums": MANIFEST}))
        for name, content in (extra_files or {}).items():
            path = tmp / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)
        write_manifest(tmp)
    except BaseException:
        fs.discard_dir(tmp)
        raise
    fs.publish_dir(tmp, final)
    if promote:
        fs.set_latest(root, version)
    return version, final


def build_model(arch: TrunkConfig | Mapping[str, Any]) -> TrunkWithHead:
    a = arch if isinstance(arch, TrunkConfig) else TrunkConfig.model_validate(arch)
    return TrunkWithHead(Trunk(a.in_dim, a.hidden_dim, a.num_blocks, a.dropout), a.out_dim)


def redo(directory: Path) -> str:
    """What writes this checkpoint again (scenario versions live in checkpoints/scenarios/<name>/)."""
    if directory.parent.parent.name == "scenarios":
        return f"re-run `basemodel finetune CONFIG -s {directory.parent.name}`"
    return "re-run `basemodel pretrain CONFIG`"


def problems(directory: Path) -> list[str]:
    """What differs from the checkpoint's manifest ([] when all matches), its signature first (keyed
    manifests, manifests.py). Every checkpoint is published with one, so a missing manifest is a problem: its
    files cannot be checked."""
    try:
        record = json.loads((directory / MANIFEST).read_text())
        files = record["files"]
    except FileNotFoundError:
        return [f"{MANIFEST}: missing: the files cannot be checked"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{MANIFEST}: unreadable ({exc})"]
    signature = manifests.signature_problem(record, MANIFEST)
    return [signature] if signature else manifests.file_problems(directory, files, MANIFEST)


def damaged(directory: Path, problem: str) -> UserError:
    """The one-line error for a damaged checkpoint file: which, what is wrong, what writes it again."""
    name, _, what = problem.partition(": ")
    return UserError(
        f"checkpoint file {directory / name}: {what}; {redo(directory)}, or point {directory.parent / 'LATEST'} "
        "at an earlier version"
    )


def verify(directory: Path) -> None:
    """Raise a one-line UserError for the first file that differs from the manifest."""
    found = problems(directory)
    if found:
        raise damaged(directory, found[0])


def first_error(exc: ValidationError) -> str:
    """The first of a pydantic error's complaints in one line: the field's dotted path and the message."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "the document"
    return f"{where}: {first['msg']}" if first["type"] != "json_invalid" else "not JSON"


def read_meta(directory: Path, verified: bool = False) -> CheckpointMeta:
    """model.json of a checkpoint (the checkpoint verified first unless `verified`)."""
    if not verified:
        verify(directory)
    try:
        return CheckpointMeta.model_validate_json((directory / META).read_bytes())
    except ValidationError as exc:
        raise damaged(directory, f"{META}: unreadable ({first_error(exc)})") from None
    except OSError as exc:
        raise damaged(directory, f"{META}: unreadable ({' '.join(str(exc).split())})") from None


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(directory / WEIGHTS))
    except (OSError, SafetensorError) as exc:
        raise damaged(directory, f"{WEIGHTS}: unreadable ({' '.join(str(exc).split())})") from None


def check_shapes(directory: Path, arch: TrunkConfig) -> None:
    """The architecture in model.json fits the stored tensors (checked on the meta device: nothing is
    allocated, so an absurd size in an edited model.json costs nothing)."""
    try:
        with torch.device("meta"):
            wanted = {k: tuple(v.shape) for k, v in build_model(arch).state_dict().items()}
        with safe_open(str(directory / WEIGHTS), "pt") as fh:
            stored = {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}  # noqa: SIM118
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise damaged(directory, f"{META}: 'arch' is not a valid architecture ({exc})") from None
    except (OSError, SafetensorError) as exc:
        raise damaged(directory, f"{WEIGHTS}: unreadable ({' '.join(str(exc).split())})") from None
    if wanted != stored:
        diff = sorted(k for k in set(wanted) | set(stored) if wanted.get(k) != stored.get(k))
        raise damaged(
            directory,
            f"{META}: its 'arch' does not fit {WEIGHTS} ({diff[0]}: {wanted.get(diff[0])} vs "
            f"{stored.get(diff[0])} stored)",
        )


def load_checkpoint(directory: Path) -> tuple[TrunkWithHead, CheckpointMeta]:
    meta = read_meta(directory)
    check_shapes(directory, meta.arch)
    model = build_model(meta.arch)
    model.load_state_dict(_weights(directory))
    model.eval()
    return model, meta


def load_trunk_state(directory: Path) -> dict[str, torch.Tensor]:
    """Only the trunk's tensors (for fine-tuning from a foundation checkpoint)."""
    verify(directory)
    state = _weights(directory)
    return {k.removeprefix("trunk."): v for k, v in state.items() if k.startswith("trunk.")}
