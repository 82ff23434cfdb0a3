"""Checks across the files of a local Parquet source, before any of its rows is read.

Two files with the same content (a second download `events (1).parquet` beside `events.parquet`, both matched
by the source's directory or glob) would count every event in them twice, and nothing downstream could tell.
They are found by size first, then by the sha256 of the files whose sizes are equal (so a source of files of
distinct sizes, the usual case, costs one stat per file), and refused in one line naming both files.

`extract` runs these checks before it writes anything, `validate` among its first."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from basemodel_pipeline.config.models import DataSource
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.sources.damaged import source_files

HASH_BLOCK = 1 << 22


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def identical_files(files: Iterable[Path]) -> tuple[Path, Path] | None:
    """The first two of `files` (in their order) with the same bytes, or None: sizes first, then the sha256
    of the files whose size another file shares."""
    by_size: dict[int, list[Path]] = defaultdict(list)
    for path in files:
        by_size[path.stat().st_size].append(path)
    for same_size in by_size.values():
        if len(same_size) < 2:
            continue
        seen: dict[str, Path] = {}
        for path in same_size:
            first = seen.setdefault(_sha256(path), path)
            if first is not path:
                return first, path
    return None


def check_files(src: DataSource) -> None:
    """Refuse a local Parquet source whose files hold the same content twice (one line naming both)."""
    pair = identical_files(source_files(src))
    if pair is not None:
        first, copy = pair
        raise DataError(
            f"data source '{src.name}': {first} and {copy} have the same content, so every event in them would "
            f"count twice: remove one of them, or narrow data_location.path ({src.data_location.path}) to the "
            "files you mean"
        )
