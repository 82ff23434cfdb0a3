"""Promotion: a new checkpoint is written as a candidate version, judged by its quality gates, and only then
named by LATEST, which is what `predict`, `embed`, `explain`, the reports, the summary and retention treat as
current.

    <root>/<version>/                a checkpoint version (foundation or one scenario), immutable once written
    <root>/verdicts/<version>.json   its verdict: promoted | rejected, every gate with its detail, who and when
    <root>/LATEST                    the version served

A candidate that fails a blocking gate (evaluation/gates.py, plus `checkpoint_sha256`: its files match the
manifest) stays on disk as rejected, with its reasons, and LATEST keeps naming the version before it.
`basemodel promote` promotes a version by hand or rolls back to an earlier one, showing the gates' verdict; a
version that fails a gate is promoted by hand only with `force`, and its verdict records that.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from basemodel_pipeline import files as fs
from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.evaluation.gates import Gate, loss_gates, rejecting, scenario_gates
from basemodel_pipeline.model import checkpoint as ckpt


class Verdict(BaseModel):
    """verdicts/<version>.json of a checkpoint root."""

    version: str
    status: Literal["promoted", "rejected"]
    gates: list[dict[str, Any]] = Field(default_factory=list)  # Gate.to_dict() of every gate
    by: str  # what decided: pretrain, finetune, `basemodel promote` (with --force)
    previous: str | None = None  # what LATEST named before
    decided_at: str = ""

    @property
    def failed(self) -> list[Gate]:
        return rejecting([Gate.from_dict(g) for g in self.gates])

    @property
    def reason(self) -> str:
        """One line: why it was rejected (or what overrode the gates)."""
        failed = self.failed
        return "; ".join(f"{g.name}: {g.detail}" for g in failed) if failed else "every gate passed"


def checkpoint_gate(directory: Path) -> Gate:
    """`checkpoint_sha256`: the version's files match its manifest and model.json fits the weights."""
    try:
        ckpt.verify(directory)
        meta = ckpt.read_meta(directory, verified=True)
        ckpt.check_shapes(directory, meta.arch)
    except UserError as exc:
        return Gate("checkpoint_sha256", False, str(exc))
    return Gate("checkpoint_sha256", True, "files match manifest.json (size and sha256)")


def gates_of(cfg: PipelineConfig, directory: Path) -> list[Gate]:
    """Every gate of one checkpoint version, from what it recorded: the checksums, then the foundation's
    losses or the scenario's test metrics against the config's quality_gates."""
    found = [checkpoint_gate(directory)]
    if not found[0].passed:
        return found
    meta = ckpt.read_meta(directory, verified=True)
    if meta.kind == "foundation":
        return found + loss_gates(meta.history)
    name = str((meta.scenario or {}).get("name", directory.parent.name))
    metrics = json.loads((directory / "metrics.json").read_text())
    return found + scenario_gates(name, metrics, cfg.quality_gates)


def current(root: Path) -> str | None:
    """The version LATEST names (None: nothing promoted yet, or an unreadable pointer)."""
    try:
        return fs.latest(root, "checkpoint").name
    except UserError:
        return None


def read_verdict(root: Path, version: str) -> Verdict | None:
    raw = fs.read_verdict(root, version)
    if raw is None:
        return None
    try:
        return Verdict.model_validate(raw)
    except ValueError:
        return None


def _decide(root: Path, version: str, gates: list[Gate], by: str, promote: bool) -> Verdict:
    verdict = Verdict(
        version=version,
        status="promoted" if promote else "rejected",
        gates=[g.to_dict() for g in gates],
        by=by,
        previous=current(root),
        decided_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )
    fs.write_verdict(root, version, verdict.model_dump(mode="json"))
    if promote:
        fs.set_latest(root, version)
    return verdict


def judge(cfg: PipelineConfig, root: Path, version: str, by: str) -> Verdict:
    """Run a new version's gates; promote it (LATEST) when every blocking gate passed, else reject it."""
    gates = gates_of(cfg, root / version)
    return _decide(root, version, gates, by, promote=not rejecting(gates))


def promote(cfg: PipelineConfig, root: Path, version: str | None, force: bool = False) -> Verdict:
    """Make `version` (default: the newest) the served one by hand: its gates run again with the config's
    thresholds; a version that fails one is promoted only with `force`. Rolling back is promoting an
    earlier version."""
    found = fs.versions(root) if root.is_dir() else []
    if not found:
        raise UserError(f"no checkpoint versions under {root}; run the stage that writes them first")
    version = version or found[0]
    if version not in found:
        raise UserError(f"{root}: no version {version!r}; versions: {', '.join(found[:5])}")
    gates = gates_of(cfg, root / version)
    failed = rejecting(gates)
    if failed and not (force and gates[0].passed):
        why = "; ".join(f"{g.name}: {g.detail}" for g in failed)
        hint = "" if not gates[0].passed else "; add --force to serve it anyway"
        raise UserError(f"{root.name} {version} fails its gates ({why}){hint}")
    return _decide(root, version, gates, "basemodel promote" + (" --force" if failed else ""), promote=True)


@dataclass(frozen=True)
class Listed:
    version: str
    status: str  # LATEST | promoted earlier | rejected | candidate
    detail: str


def listing(root: Path) -> list[Listed]:
    """Every version of a checkpoint root, newest first, with its status and why."""
    latest = current(root)
    out = []
    for version in fs.versions(root) if root.is_dir() else []:
        verdict = read_verdict(root, version)
        if version == latest:
            out.append(Listed(version, "LATEST", verdict.reason if verdict else "served"))
        elif verdict is None:
            out.append(Listed(version, "candidate", "no verdict (being judged, or its run stopped first)"))
        elif verdict.status == "rejected":
            out.append(Listed(version, "rejected", verdict.reason))
        else:
            out.append(Listed(version, "promoted earlier", f"{verdict.by} at {verdict.decided_at}"))
    return out


def summary(verdict: Verdict) -> dict[str, Any]:
    """What a stage reports of its verdict (Dagster metadata, the CLI's table)."""
    return {
        "promoted": verdict.status == "promoted",
        "serving_version": verdict.version if verdict.status == "promoted" else verdict.previous,
        # "ok", not "passed": metadata keys that look like secrets ("pass...") are dropped (metadata.py)
        "gates": {g["name"]: {"ok": g["passed"], "detail": g["detail"]} for g in verdict.gates},
        "rejected_by": verdict.reason if verdict.status == "rejected" else None,
    }
