"""`basemodel verify CONFIG`: check every artifact of a workspace against the checksums recorded when it
was written: the current event cache version (size and sha256 of every file, no unlisted file), and every
version of the foundation and scenario checkpoints (manifest.json, model.json readable and fitting the
weights, LATEST naming a version). One finding per artifact; nothing is modified."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.build import cache_dir
from basemodel_pipeline.cache.integrity import first, manifest_problems
from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.model import checkpoint as ckpt

MIB = 2**20


@dataclass(frozen=True)
class Finding:
    kind: str  # cache | foundation | scenario
    label: str  # what it is (a path, or a scenario and its version)
    status: str  # ok | FAILED | absent
    detail: str  # the size checked, what is wrong and what to do, or how to make it


def verify_cache(cfg: PipelineConfig) -> Finding:
    final = cache_dir(cfg)
    if not (final / "manifest.json").exists():
        return Finding("cache", str(final), "absent", "no cache yet (`basemodel cache CONFIG` builds it)")
    version = final.resolve()
    problems, files, size = manifest_problems(version, full=True)
    if problems:
        detail = f"{first(problems)}; rebuild it with `basemodel cache CONFIG`"
        return Finding("cache", str(version), "FAILED", detail)
    return Finding("cache", str(final), "ok", f"{files} files, {size / MIB:.1f} MiB, sha256 checked")


def verify_checkpoint(kind: str, label: str, directory: Path) -> Finding:
    """One checkpoint version: its manifest, then model.json and the weights' shapes."""
    try:
        ckpt.verify(directory)
        meta = ckpt.read_meta(directory, verified=True)
        ckpt.check_shapes(directory, meta["arch"])
    except UserError as exc:
        return Finding(kind, label, "FAILED", str(exc))
    size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
    how = (
        "sha256 checked" if (directory / ckpt.MANIFEST).exists() else "no checksums recorded (older version)"
    )
    return Finding(kind, label, "ok", f"{size / MIB:.1f} MiB, {how}")


def verify_root(kind: str, name: str, root: Path, make: str) -> list[Finding]:
    """Every version under a checkpoint root, newest first, and its LATEST pointer."""
    versions = ws.versions(root) if root.is_dir() else []
    if not versions:
        return [Finding(kind, name, "absent", f"no checkpoint yet ({make} writes it)")]
    findings = []
    try:
        current = ws.latest(root, f"{kind} checkpoint").name
    except UserError as exc:
        findings.append(Finding(kind, f"{name} LATEST", "FAILED", str(exc)))
        current = None
    for version in versions:
        mark = " (LATEST)" if version == current else ""
        findings.append(verify_checkpoint(kind, f"{name} {version}{mark}", root / version))
    return findings


def verify_workspace(cfg: PipelineConfig) -> list[Finding]:
    findings = [verify_cache(cfg)]
    findings += verify_root(
        "foundation", "foundation", ws.foundation_root(cfg), "`basemodel pretrain CONFIG`"
    )
    for sc in cfg.scenarios:
        make = f"`basemodel finetune CONFIG -s {sc.name}`"
        findings += verify_root("scenario", sc.name, ws.scenario_root(cfg, sc.name), make)
    return findings
