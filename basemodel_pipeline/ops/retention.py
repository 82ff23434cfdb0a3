"""Retention: which old checkpoints, predictions and embeddings to delete, and deleting them safely.

The `retention` section of the config (config/retention.py) keeps the newest N of each:

    checkpoints/foundation/<version>/          keep_checkpoints versions
    checkpoints/scenarios/<name>/<version>/    keep_checkpoints versions per scenario
    predictions/<scenario>/<as_of>/            keep_predictions as-of dates per scenario
    embeddings/<as_of>/                        keep_embeddings as-of dates

Beyond those counts, whatever is still in use is always kept:

* the version LATEST points to, and every version newer than it (a run that is publishing right now), except
  versions their quality gates rejected: those stay while they are among the newest N, for inspection, and
  do not count towards the N versions kept for a rollback;
* the scenario checkpoint each kept prediction was made from (its provenance.json; predictions written
  before provenance existed: the newest checkpoint older than the prediction's files);
* the foundation version each kept scenario checkpoint was fine-tuned from (its model.json), and the one
  each kept embedding (or prediction) was made from.

A checkpoint root without a valid LATEST is left alone entirely. Only what the pipeline wrote is considered:
directories with its names (versions like 20240301T020000123456Z, as-of dates like 2024-03-01) holding the
manifest its writers publish with; hidden directories (a writer's staging directory), directories that only
look like its own (a user's, on a volume a symlinked directory leads to) and anything else are never touched.
Symlinked directories are followed.

Deletion renames the directory to a hidden ``.<name>.pruned.tmp`` beside it (one atomic rename: a reader
sees the whole directory or none) and then removes that; a leftover of an interrupted prune is removed by
the next prune (and by the writers' clean_stale_tmp).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from basemodel_pipeline import files as fs
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.errors import UserError

KINDS = ("foundation", "scenario", "predictions", "embeddings")
VERSION = fs.VERSION_NAME  # checkpoint version directories, as files.new_version() names them
AS_OF = re.compile(r"^\d{4}-\d{2}-\d{2}$")
TRASH_SUFFIX = ".pruned.tmp"
MANIFEST = "manifest.json"  # what every writer of checkpoints, predictions and embeddings publishes with
NEWER_THAN_LATEST = "newer than LATEST (a run publishing it)"


@dataclass(frozen=True)
class Entry:
    """One version directory and what retention decided for it (with the reason)."""

    kind: str  # foundation | scenario | predictions | embeddings
    group: str  # the scenario name; "" for the foundation and embeddings
    name: str  # version or as-of date
    path: Path
    bytes: int
    keep: bool
    reason: str

    @property
    def label(self) -> str:
        return f"{self.kind} {self.group}/{self.name}" if self.group else f"{self.kind} {self.name}"


@dataclass
class Plan:
    """Every version directory the policy looked at, kept or to delete."""

    entries: list[Entry] = field(default_factory=list)

    @property
    def keep(self) -> list[Entry]:
        return [e for e in self.entries if e.keep]

    @property
    def delete(self) -> list[Entry]:
        return [e for e in self.entries if not e.keep]

    @property
    def bytes_freed(self) -> int:
        return sum(e.bytes for e in self.delete)

    def summary(self) -> dict[str, int]:
        """Counts per kind (deleted_<kind>, kept_<kind>) and bytes_freed."""
        out: dict[str, int] = {}
        for kind in KINDS:
            out[f"deleted_{kind}"] = sum(1 for e in self.delete if e.kind == kind)
            out[f"kept_{kind}"] = sum(1 for e in self.keep if e.kind == kind)
        out["bytes_freed"] = self.bytes_freed
        return out


def dir_bytes(path: Path) -> int:
    """Bytes of the files under `path` (symbolic links are not followed)."""
    total = 0
    for parent, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += os.lstat(os.path.join(parent, name)).st_size
    return total


def _children(parent: Path, pattern: re.Pattern[str]) -> list[Path]:
    """The pipeline's own subdirectories of `parent`, oldest (smallest name) first: a name as the pipeline
    writes them (`pattern`) and the manifest every writer leaves in what it published. A directory that
    only looks like one (a user's own, on a volume `parent` links to) is never considered."""
    if not parent.is_dir():
        return []
    own = (p for p in parent.iterdir() if p.is_dir() and pattern.match(p.name) and (p / MANIFEST).is_file())
    return sorted(own, key=lambda p: p.name)


def _groups(parent: Path) -> list[Path]:
    """Visible subdirectories of `parent` (one per scenario)."""
    if not parent.is_dir():
        return []
    return sorted(p for p in parent.iterdir() if p.is_dir() and not p.name.startswith("."))


def _pointer(root: Path) -> str | None:
    try:
        return (root / "LATEST").read_text().strip() or None
    except OSError:
        return None


def _version_time(version: str) -> dt.datetime:
    return dt.datetime.strptime(version, "%Y%m%dT%H%M%S%fZ").replace(tzinfo=dt.UTC)


def _newest_file_time(path: Path) -> dt.datetime | None:
    times = [f.stat().st_mtime for f in path.iterdir() if f.is_file()]
    return dt.datetime.fromtimestamp(max(times), dt.UTC) if times else None


def _made_from(versions: list[Path], output: Path) -> str | None:
    """For an output without provenance: the newest checkpoint version published before its files."""
    written = _newest_file_time(output)
    if written is None:
        return None
    older = [v.name for v in versions if _version_time(v.name) <= written]
    return older[-1] if older else None


def _newest(paths: list[Path], keep: int | None) -> set[str]:
    return {p.name for p in paths} if keep is None else {p.name for p in paths[-keep:]}


def _dated_outputs(parent: Path, keep: int | None) -> list[tuple[Path, bool, str]]:
    """(directory, keep, reason) for the as-of directories of one predictions scenario or the embeddings."""
    dirs = _children(parent, AS_OF)
    newest = _newest(dirs, keep)
    why = "retention keeps all" if keep is None else f"one of the newest {keep}"
    return [(d, d.name in newest, why if d.name in newest else f"older than the newest {keep}") for d in dirs]


def _rejected(root: Path, version: str) -> bool:
    """Whether the version's promotion verdict rejected it (it was never served)."""
    return (fs.read_verdict(root, version) or {}).get("status") == "rejected"


def _checkpoints(root: Path, keep: int | None, used_by: dict[str, str]) -> list[tuple[Path, bool, str]]:
    """(directory, keep, reason) for the versions under one checkpoint root; `used_by`: version -> user.
    Versions their quality gates rejected do not count towards the newest N that stay for a rollback; they
    are kept for inspection while they are among the newest N of all."""
    versions = _children(root, VERSION)
    pointer = _pointer(root)
    if pointer is None or pointer not in {v.name for v in versions}:
        return [(v, True, "no valid LATEST under its root: left alone") for v in versions]
    rejected = {v.name for v in versions if _rejected(root, v.name)}
    newest = _newest([v for v in versions if v.name not in rejected], keep)
    newest_of_all = _newest(versions, keep)
    out = []
    for v in versions:
        if v.name == pointer:
            out.append((v, True, "LATEST"))
        elif v.name in used_by:
            out.append((v, True, f"used by {used_by[v.name]}"))
        elif v.name in rejected:
            if v.name in newest_of_all:
                kept = "retention keeps all" if keep is None else f"one of the newest {keep}"
                out.append((v, True, f"rejected by its quality gates, {kept}"))
            else:
                out.append((v, False, f"rejected by its quality gates, older than the newest {keep}"))
        elif v.name > pointer:
            out.append((v, True, NEWER_THAN_LATEST))
        elif v.name in newest:
            out.append((v, True, "retention keeps all" if keep is None else f"one of the newest {keep}"))
        else:
            out.append((v, False, f"older than the newest {keep}, not in use"))
    return out


def _foundation_of(checkpoint: Path) -> str | None:
    """model.json's foundation_version (model/checkpoint.CheckpointMeta), read here without the model
    layer: retention needs nothing above the ground floor."""
    try:
        return json.loads((checkpoint / "model.json").read_text()).get("foundation_version")
    except (OSError, ValueError, AttributeError):
        return None


def plan_retention(cfg: PipelineConfig) -> Plan:
    """What the config's retention policy keeps and deletes in its workspace now (nothing is changed)."""
    policy = cfg.retention
    root = ws.root(cfg)
    plan = Plan()
    uses_scenario: dict[str, dict[str, str]] = {}  # scenario -> version -> first user
    uses_foundation: dict[str, str] = {}

    def add(kind: str, group: str, rows: Iterable[tuple[Path, bool, str]]) -> list[Path]:
        kept = []
        for path, keep, reason in rows:
            plan.entries.append(Entry(kind, group, path.name, path, dir_bytes(path), keep, reason))
            if keep:
                kept.append(path)
        return kept

    for scenario_dir in _groups(root / "predictions"):
        scenario = scenario_dir.name
        rows = _dated_outputs(scenario_dir, policy.keep_predictions)
        versions = _children(ws.scenario_root(cfg, scenario), VERSION)
        for out in add("predictions", scenario, rows):
            record = ws.read_provenance(out) or {}
            user = f"predictions {scenario}/{out.name}"
            made_from = record.get("model_version") or _made_from(versions, out)
            if made_from:
                uses_scenario.setdefault(record.get("scenario", scenario), {}).setdefault(made_from, user)
            if record.get("foundation_version"):
                uses_foundation.setdefault(record["foundation_version"], user)

    rows = _dated_outputs(root / "embeddings", policy.keep_embeddings)
    foundations = _children(ws.foundation_root(cfg), VERSION)
    for out in add("embeddings", "", rows):
        record = ws.read_provenance(out) or {}
        made_from = record.get("foundation_version") or _made_from(foundations, out)
        if made_from:
            uses_foundation.setdefault(made_from, f"embeddings {out.name}")

    for scenario_root in _groups(root / "checkpoints" / "scenarios"):
        scenario = scenario_root.name
        used = uses_scenario.get(scenario, {})
        rows = _checkpoints(scenario_root, policy.keep_checkpoints, used)
        for kept in add("scenario", scenario, rows):
            foundation = _foundation_of(kept)
            if foundation:
                uses_foundation.setdefault(foundation, f"scenario {scenario}/{kept.name}")

    rows = _checkpoints(ws.foundation_root(cfg), policy.keep_checkpoints, uses_foundation)
    add("foundation", "", rows)
    return plan


def remove_dir(path: Path) -> None:
    """Delete a directory so that no reader ever sees it half-deleted: rename it to a hidden name first."""
    trash = path.with_name(f".{path.name}{TRASH_SUFFIX}")
    shutil.rmtree(trash, ignore_errors=True)  # a leftover of an interrupted prune
    os.replace(path, trash)
    fs.fsync_dir(path.parent)
    shutil.rmtree(trash)


def _remove_leftovers(plan: Plan) -> None:
    for parent in {e.path.parent for e in plan.entries}:
        for leftover in parent.glob(f".*{TRASH_SUFFIX}"):
            shutil.rmtree(leftover, ignore_errors=True)


def prune(cfg: PipelineConfig, dry_run: bool = False) -> Plan:
    """Plan retention for the workspace and, unless `dry_run`, delete what the plan does not keep."""
    plan = plan_retention(cfg)
    if not dry_run:
        _remove_leftovers(plan)
        for entry in plan.delete:
            try:
                remove_dir(entry.path)
                if entry.kind in ("foundation", "scenario"):  # its promotion verdict goes with it
                    fs.verdict_path(entry.path.parent, entry.name).unlink(missing_ok=True)
            except OSError as err:
                raise UserError(f"prune: cannot delete {entry.path}: {err.strerror or err}") from None
    return plan
