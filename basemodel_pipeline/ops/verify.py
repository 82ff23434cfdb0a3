"""`basemodel verify CONFIG`: check every artifact of a workspace against the checksums recorded when it
was written: each source's extract (the sizes and sha256 in its .files.json, no unrecorded Parquet file),
the current event cache version (size and sha256 of every file, no unlisted file), every version of the
foundation and scenario checkpoints (manifest.json, model.json readable and fitting the weights, LATEST
naming a version), the per-entity states, and the scenarios' predictions (and their subsets) and the
embeddings in file destinations. States, predictions and embeddings are also checked against the current
cache: one built from older cache content (a correction of days before its date) is `stale`, not damaged.

Every artifact is written with its checksums, so a missing manifest is a failure (the files cannot be
checked), never an unchecked `ok`; only an artifact that was never made is `absent`. With
BASEMODEL_MANIFEST_KEY set, every manifest's signature is checked first (keyed manifests, manifests.py); an
`ok` line says whether a signature was checked. One finding per artifact; nothing is modified. The Dagster
checks call the same functions."""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from basemodel_pipeline import files as fs
from basemodel_pipeline import manifests
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.history import history_version
from basemodel_pipeline.cache.integrity import first, manifest_problems
from basemodel_pipeline.cache.versions import read_manifest
from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.model import checkpoint as ckpt
from basemodel_pipeline.outputs import manifest as outputs_manifest
from basemodel_pipeline.sources import extract_record
from basemodel_pipeline.workspace import cache_dir

MIB = 2**20
UNCHECKABLE = "missing: the files cannot be checked"  # a deleted manifest


def noted(detail: str, manifest: dict[str, Any]) -> str:
    """An `ok` finding's detail, with what was done with the manifest's signature (if it has one)."""
    note = manifests.signature_note(manifest)
    return f"{detail}; {note}" if note else detail


@dataclass(frozen=True)
class Finding:
    kind: str  # extract | cache | foundation | scenario | state | predictions | embeddings
    label: str  # what it is (a path, or a scenario and its version)
    status: str  # ok | FAILED | stale | absent
    detail: str  # the size checked, what is wrong and what to do, or how to make it


def verify_extract(cfg: PipelineConfig, source: str) -> Finding:
    """One source's extract: every file against the size and sha256 its record (.files.json) holds, and
    no Parquet file the record does not hold (the cache would read it as data)."""
    out = ws.extracts_dir(cfg, source)
    redo = f"re-run `basemodel extract CONFIG --source {source}`"
    found = sorted(f.name for f in out.glob("*.parquet")) if out.is_dir() else []
    try:
        record = extract_record.read_record(out)
    except UserError as exc:
        return Finding("extract", str(out), "FAILED", str(exc))
    if record is None:
        if not found:
            return Finding(
                "extract",
                str(out),
                "absent",
                f"no extract yet (`basemodel extract CONFIG --source {source}`)",
            )
        return Finding("extract", str(out), "FAILED", f"{extract_record.OWN_RECORD} {UNCHECKABLE}; {redo}")
    raw = json.loads((out / extract_record.OWN_RECORD).read_text())  # as written: its signature too
    if signature := manifests.signature_problem(raw, extract_record.OWN_RECORD):
        return Finding("extract", str(out), "FAILED", f"{signature}; {redo}")
    if record["pending"]:
        spans = ", ".join(f"{a or 'start'}..{b or 'end'}" for a, b in record["pending"])
        why = f"an extract was interrupted (days {spans}): its files are not all recorded; {redo}"
        return Finding("extract", str(out), "FAILED", why)
    files = record["files"]
    problems = [f"{name}: no size or checksum recorded" for name, e in files.items() if "sha256" not in e]
    problems += manifests.file_problems(
        out, {n: e for n, e in files.items() if "sha256" in e}, extract_record.OWN_RECORD
    )
    problems += [
        f"{name}: not in {extract_record.OWN_RECORD} (not written by the extract)"
        for name in found
        if name not in files
    ]
    if problems:
        return Finding("extract", str(out), "FAILED", f"{first(sorted(problems))}; {redo}")
    size = sum(int(e["bytes"]) for e in files.values())
    return Finding(
        "extract", str(out), "ok", noted(f"{len(files)} files, {size / MIB:.1f} MiB, sha256 checked", raw)
    )


def verify_cache(cfg: PipelineConfig) -> Finding:
    """The current cache version. The pointer cache/<fingerprint> names a version only once it is published
    with its manifest, so a version without one lost it."""
    final = cache_dir(cfg)
    redo = "rebuild it with `basemodel cache CONFIG`"
    if not final.exists():
        if final.is_symlink():
            why = f"it names {os.readlink(final)}, which is missing; {redo}"
            return Finding("cache", str(final), "FAILED", why)
        return Finding("cache", str(final), "absent", "no cache yet (`basemodel cache CONFIG` builds it)")
    version = final.resolve()
    if not (version / "manifest.json").exists():
        return Finding("cache", str(version), "FAILED", f"manifest.json {UNCHECKABLE}; {redo}")
    problems, files, size = manifest_problems(version, full=True)
    if problems:
        return Finding("cache", str(version), "FAILED", f"{first(problems)}; {redo}")
    checked = noted(f"{files} files, {size / MIB:.1f} MiB, sha256 checked", read_manifest(version) or {})
    return Finding("cache", str(final), "ok", checked)


def verify_checkpoint(kind: str, label: str, directory: Path) -> Finding:
    """One checkpoint version: its manifest, then model.json and the weights' shapes."""
    try:
        ckpt.verify(directory)
        meta = ckpt.read_meta(directory, verified=True)
        ckpt.check_shapes(directory, meta.arch)
    except UserError as exc:
        return Finding(kind, label, "FAILED", str(exc))
    size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
    manifest = json.loads((directory / ckpt.MANIFEST).read_text())
    return Finding(kind, label, "ok", noted(f"{size / MIB:.1f} MiB, sha256 checked", manifest))


def verify_root(kind: str, name: str, root: Path, make: str) -> list[Finding]:
    """Every version under a checkpoint root, newest first, and its LATEST pointer."""
    versions = fs.versions(root) if root.is_dir() else []
    if not versions and (root / "LATEST").exists():  # its versions were deleted: not one never made
        try:
            fs.latest(root, f"{kind} checkpoint")
        except UserError as exc:
            return [Finding(kind, f"{name} LATEST", "FAILED", str(exc))]
    if not versions:
        return [Finding(kind, name, "absent", f"no checkpoint yet ({make} writes it)")]
    findings = []
    try:
        current = fs.latest(root, f"{kind} checkpoint").name
    except UserError as exc:
        findings.append(Finding(kind, f"{name} LATEST", "FAILED", str(exc)))
        current = None
    for version in versions:
        verdict = fs.read_verdict(root, version) or {}
        rejected = (
            " (rejected by its quality gates: never served)" if verdict.get("status") == "rejected" else ""
        )
        mark = " (LATEST)" if version == current else rejected
        findings.append(verify_checkpoint(kind, f"{name} {version}{mark}", root / version))
    return findings


def verify_state(directory: Path, cache: dict[str, Any] | None) -> Finding:
    """One per-entity state directory: its arrays against the manifest (full sha256), then against the
    current cache's manifest `cache` (stale when built from other content)."""
    from basemodel_pipeline.inference import state as st

    redo = f"delete {directory}: the next `basemodel predict CONFIG -s NAME` rebuilds it"
    try:
        meta = json.loads((directory / "manifest.json").read_text())
        as_of = dt.date.fromisoformat(meta["as_of"])
    except FileNotFoundError:
        return Finding("state", str(directory), "FAILED", f"manifest.json {UNCHECKABLE}; {redo}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return Finding("state", str(directory), "FAILED", f"manifest.json unreadable ({exc}); {redo}")
    label = f"{directory} (as of {as_of})"
    if meta.get("version") != st.STATE_VERSION:
        why = f"written by an older version (format {meta.get('version')}); the next `basemodel predict` rebuilds it"
        return Finding("state", label, "stale", why)
    problems = st.state_problems(directory, meta, full=True)
    if problems:
        return Finding("state", label, "FAILED", f"{first(problems)}; {redo}")
    stale = st.stale_reason(meta, as_of, cache) if cache else None
    if stale:
        return Finding("state", label, "stale", f"{stale}; the next `basemodel predict` rebuilds it")
    size = sum(r["bytes"] for r in meta["files"].values())
    built = f"built from cache data version {meta.get('cache_data_version')}"
    return Finding(
        "state",
        label,
        "ok",
        noted(f"{meta['n_entities']:,} entities, {size / MIB:.1f} MiB, sha256 checked; {built}", meta),
    )


def verify_output(
    kind: str, label: str, directory: Path, as_of: dt.date, cache: dict[str, Any] | None, redo: str
) -> Finding:
    """One output directory (predictions of a scenario as of a date, a subset, embeddings as of a date): its
    files against its manifest.json (full sha256), then the cache content it was scored from against the
    current cache's."""
    where = directory / outputs_manifest.MANIFEST
    try:
        manifest = outputs_manifest.read_manifest(directory)
    except FileNotFoundError:
        return Finding(kind, label, "FAILED", f"{where} {UNCHECKABLE}; {redo}")
    except (OSError, ValueError) as exc:
        return Finding(kind, label, "FAILED", f"{where} unreadable ({exc}); {redo}")
    problems = outputs_manifest.problems(directory, manifest)
    if problems:
        return Finding(kind, label, "FAILED", f"{directory}: {first(problems)}; {redo}")
    built = manifest.get("built_from") or {}
    if cache and built.get("cache_history") and built["cache_history"] != history_version(cache, as_of):
        why = (
            f"scored from cache data version {built.get('cache_data_version')}, whose days before {as_of} "
            f"differ from the current cache's; {redo}"
        )
        return Finding(kind, label, "stale", why)
    size = sum(int(r.get("bytes", 0)) for r in manifest["files"].values())
    model = f"model {built['model_version']}, " if built.get("model_version") else ""
    return Finding(
        kind,
        label,
        "ok",
        noted(
            f"{len(manifest['files'])} files, {size / MIB:.1f} MiB, sha256 checked; {model}cache "
            f"{built.get('cache_data_version')}",
            manifest,
        ),
    )


def output_roots(cfg: PipelineConfig) -> list[Path]:
    """The workspace and the root of every file destination with its own path."""
    from basemodel_pipeline.config.outputs import FileOutput

    roots = [ws.root(cfg)]
    for dest in cfg.outputs.destinations.values():
        if isinstance(dest, FileOutput) and dest.path and (root := ws.root(cfg) / dest.path) not in roots:
            roots.append(root)
    return roots


def prediction_dirs(root: Path, scenario: str) -> list[tuple[str, Path, dt.date]]:
    """(label, directory, as_of) of every predictions table of a scenario under a root, and its subsets."""
    out = []
    for d, as_of in dated_dirs(root / "predictions" / scenario):
        out.append((f"{scenario} {d.name}", d, as_of))
        subsets = d / outputs_manifest.SUBSETS
        for s in sorted(subsets.iterdir()) if subsets.is_dir() else []:
            out.append((f"{scenario} {d.name} subset {s.name}", s, as_of))
    return out


def dated_dirs(base: Path) -> list[tuple[Path, dt.date]]:
    """(directory, as_of) of the published as-of directories under `base` (not staging, parts or locks)."""
    out = []
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        try:
            out.append((d, dt.date.fromisoformat(d.name)))
        except ValueError:
            continue
    return out


def verify_predictions(cfg: PipelineConfig, scenario: str, cache: dict[str, Any] | None) -> list[Finding]:
    found = []
    for root in output_roots(cfg):
        for label, directory, as_of in prediction_dirs(root, scenario):
            redo = f"re-run `basemodel predict CONFIG -s {scenario} --as-of {as_of}`"
            found.append(verify_output("predictions", label, directory, as_of, cache, redo))
    return found


def verify_embeddings(cfg: PipelineConfig, cache: dict[str, Any] | None) -> list[Finding]:
    found = []
    for root in output_roots(cfg):
        for directory, as_of in dated_dirs(root / "embeddings"):
            redo = f"re-run `basemodel embed CONFIG --as-of {as_of}`"
            found.append(verify_output("embeddings", str(directory), directory, as_of, cache, redo))
    return found


def verify_workspace(cfg: PipelineConfig) -> list[Finding]:
    findings = [verify_extract(cfg, src.name) for src in cfg.data_sources]
    findings.append(verify_cache(cfg))
    findings += verify_root(
        "foundation", "foundation", ws.foundation_root(cfg), "`basemodel pretrain CONFIG`"
    )
    for sc in cfg.scenarios:
        make = f"`basemodel finetune CONFIG -s {sc.name}`"
        findings += verify_root("scenario", sc.name, ws.scenario_root(cfg, sc.name), make)
    cache = read_manifest(cache_dir(cfg))
    states = ws.root(cfg) / "state"
    for directory in sorted(states.iterdir()) if states.is_dir() else []:
        if directory.is_dir() and not directory.name.startswith("."):
            findings.append(verify_state(directory, cache))
    for sc in cfg.scenarios:
        findings += verify_predictions(cfg, sc.name, cache)
    findings += verify_embeddings(cfg, cache)
    return findings
