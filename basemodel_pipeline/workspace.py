"""Workspace layout and atomic file operations.

<workspace>/extracts/<source>/<yyyy-mm-dd>.parquet | table.parquet
<workspace>/cache/<fingerprint>/
<workspace>/checkpoints/foundation/<version>/        LATEST names the newest version
<workspace>/checkpoints/scenarios/<name>/<version>/  LATEST likewise
<workspace>/predictions/<scenario>/<as_of>/predictions.parquet   + provenance.json
<workspace>/embeddings/<as_of>/embeddings.parquet                 + provenance.json
<workspace>/reports/summary.json

provenance.json names the checkpoint versions an output was made from (retention keeps those).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.errors import UserError


def root(cfg: PipelineConfig) -> Path:
    return Path(cfg.workspace)


def extracts_dir(cfg: PipelineConfig, source: str) -> Path:
    return root(cfg) / "extracts" / source


def cache_root(cfg: PipelineConfig) -> Path:
    return root(cfg) / "cache"


def foundation_root(cfg: PipelineConfig) -> Path:
    return root(cfg) / "checkpoints" / "foundation"


def scenario_root(cfg: PipelineConfig, name: str) -> Path:
    return root(cfg) / "checkpoints" / "scenarios" / name


def predictions_dir(cfg: PipelineConfig, scenario: str, as_of: dt.date) -> Path:
    return root(cfg) / "predictions" / scenario / as_of.isoformat()


def drift_reference(cfg: PipelineConfig, scenario: str, model_version: str) -> Path:
    """Feature deciles of the population a scenario model version was first scored on (evaluation/drift.py)."""
    return root(cfg) / "predictions" / scenario / ".drift" / f"{model_version}.json"


def new_version() -> str:
    """Sortable, unique version name: UTC time to the microsecond."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")


VERSION_NAME = re.compile(r"^\d{8}T\d{6}\d{6}Z$")  # what new_version() writes


def _versions(parent: Path) -> list[str]:
    """Names of the version directories under `parent`, newest first."""
    found = [
        p.name for p in parent.iterdir() if VERSION_NAME.match(p.name) and p.is_dir() and not p.is_symlink()
    ]
    return sorted(found, reverse=True)


def _bad_pointer(pointer: Path, problem: str) -> UserError:
    """A UserError for a LATEST that does not name a version of its own root, saying how to fix it."""
    versions = _versions(pointer.parent)
    fix = (
        f"write a version name from {pointer.parent} into it (newest: {versions[0]})"
        if versions
        else "delete it and re-run the stage that produces it"
    )
    return UserError(f"{pointer}: {problem}; {fix}")


def latest(parent: Path, what: str) -> Path:
    """The version directory that `parent`/LATEST names. LATEST must hold one plain version name (as
    new_version() writes) of a directory inside `parent`: never a path leading elsewhere."""
    pointer = parent / "LATEST"
    if not pointer.exists():
        raise UserError(f"no {what} found under {parent}; run the stage that produces it first")
    name = pointer.read_text().strip()
    if not VERSION_NAME.match(name):
        raise _bad_pointer(
            pointer,
            f"names {name!r}, which is not a version name like {new_version()} (one directory beside it)",
        )
    path = parent / name
    if not path.is_dir():
        raise UserError(f"{pointer} names {path.name}, which is missing; re-run the stage that produces it")
    if not path.resolve().is_relative_to(parent.resolve()):
        raise _bad_pointer(pointer, f"version {name} is a link to {path.resolve()}, outside {parent}")
    return path


def latest_foundation_dir(cfg: PipelineConfig) -> Path:
    return latest(foundation_root(cfg), "foundation checkpoint (run `basemodel pretrain CONFIG`)")


def has_scenario(cfg: PipelineConfig, name: str) -> bool:
    return (scenario_root(cfg, name) / "LATEST").exists()


def latest_scenario_dir(cfg: PipelineConfig, name: str) -> Path:
    return latest(scenario_root(cfg, name), f"checkpoint of scenario '{name}' (run `basemodel finetune`)")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def staging_dir(final: Path) -> Path:
    """A fresh temporary directory beside `final`, to be published with publish_dir."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))


def publish_dir(tmp: Path, final: Path) -> None:
    """fsync every file in `tmp`, then rename it to `final` (replacing an older copy) in one step."""
    for f in tmp.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    if final.exists():
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    fsync_dir(final.parent)


PROVENANCE = "provenance.json"


def write_provenance(directory: Path, **versions: str | None) -> None:
    """Record in an output's (staging) directory which checkpoint versions made it, e.g.
    ``scenario="churn", model_version=..., foundation_version=...``; None values are left out."""
    record = {k: v for k, v in versions.items() if v is not None}
    (directory / PROVENANCE).write_text(json.dumps(record, sort_keys=True) + "\n")


def read_provenance(directory: Path) -> dict[str, str] | None:
    """The provenance record of an output directory, or None when it has none (or it is unreadable)."""
    try:
        record = json.loads((directory / PROVENANCE).read_text())
    except (OSError, ValueError):
        return None
    return {str(k): str(v) for k, v in record.items()} if isinstance(record, dict) else None


def set_latest(parent: Path, version: str) -> None:
    atomic_write_text(parent / "LATEST", version + "\n")


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def clean_stale_tmp(parent: Path) -> None:
    """Remove leftovers of a killed writer (hidden *.tmp files and directories)."""
    if not parent.exists():
        return
    for p in parent.glob(".*.tmp"):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
