"""Checksums of a file output directory (predictions/<scenario>/<as_of>/, a subset's, embeddings/<as_of>/).

    manifest.json   {"files": {relative path: {bytes, sha256}}, "built_from": {model_version, cache_data_version,
                    cache_history, ...}}

written last into the staging directory, just before it is published: every file of the directory except
the manifest itself and subsets/ (each subset has its own). `built_from` is the output's provenance.json
(the checkpoint versions, and the cache content it was scored from: cache/history.py), so `basemodel verify`
can tell a damaged output (a file differs from its checksum) from a stale one (built from older cache
content). provenance.json also records `checksums: manifest.json`: every output directory is published with
a manifest, so one without it (deleted) is damaged, never unchecked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from basemodel_pipeline import manifests
from basemodel_pipeline import workspace as ws

MANIFEST = "manifest.json"
SUBSETS = "subsets"


def _listed(directory: Path) -> list[Path]:
    return sorted(
        p
        for p in directory.rglob("*")
        if p.is_file()
        and p.relative_to(directory).parts[0] not in (MANIFEST, SUBSETS)
        and not any(part.startswith(".") for part in p.relative_to(directory).parts)
    )


def write_manifest(directory: Path) -> None:
    """Record every file of a staged output directory (call it last, before publishing); provenance.json
    first says that the directory has a manifest."""
    provenance = {**(ws.read_provenance(directory) or {}), "checksums": MANIFEST}
    (directory / ws.PROVENANCE).unlink(missing_ok=True)  # never write through a link to a published one
    ws.write_provenance(directory, **provenance)
    files = manifests.file_records(directory, _listed(directory))
    record: dict[str, Any] = {"files": files, "built_from": provenance}
    target = directory / MANIFEST
    target.unlink(missing_ok=True)  # never write through a link to a published directory's manifest
    target.write_text(json.dumps(manifests.signed(record), indent=2, sort_keys=True))


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of an output directory; FileNotFoundError when it has none (deleted), ValueError when
    it is unreadable."""
    data = json.loads((directory / MANIFEST).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise ValueError("no files recorded")
    return data


def problems(directory: Path, manifest: dict[str, Any]) -> list[str]:
    """Files of the directory that differ from the manifest (full sha256), are missing or are not listed;
    first, the manifest's signature (keyed manifests, manifests.py)."""
    if signature := manifests.signature_problem(manifest, MANIFEST):
        return [signature]
    found = manifests.file_problems(directory, manifest["files"], MANIFEST)
    listed = set(manifest["files"])
    found += [
        f"{rel}: not in the manifest"
        for p in _listed(directory)
        if (rel := str(p.relative_to(directory))) not in listed
    ]
    return found
