"""Checksum manifests: the size and sha256 of each file of an artifact, recorded when it is written
(file_records) and checked when it is read (file_problems). Every artifact's manifest holds such records
(checkpoints, outputs, the event cache, the per-entity states, the extracts' records)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_records(directory: Path, paths: list[Path]) -> dict[str, dict[str, Any]]:
    """{path relative to `directory`: {bytes, sha256}} of `paths`: what a checksum manifest records."""
    return {
        str(p.relative_to(directory)): {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in paths
    }


def file_problems(directory: Path, files: dict[str, dict[str, Any]], manifest: str) -> list[str]:
    """The recorded `files` (as file_records writes them) that are missing, have another size or another
    sha256 under `directory`; [] when all match. `manifest` names the record in the messages."""
    found = []
    for rel, expected in sorted(files.items()):
        path = directory / rel
        if not path.is_file():
            found.append(f"{rel}: missing")
        elif (size := path.stat().st_size) != expected.get("bytes"):
            found.append(
                f"{rel}: {size:,} bytes, {manifest} says {expected.get('bytes'):,} (truncated or replaced)"
            )
        elif sha256_file(path) != expected.get("sha256"):
            found.append(f"{rel}: changed after it was written (sha256 differs from {manifest})")
    return found
