"""The record of an extract, extracts/<source>/.files.json (OWN_RECORD): the extract's manifest.

    {"files": {name: {bytes, sha256}}, "pending": [[first day or null, end day or null], ...]}

The files the extracts of this source wrote (all they may delete) with their size and sha256, hashed once
after they are written. Before writing, a run adds its day range to `pending` (null, null: every file); at
the end it hashes the files of the pending ranges and clears them, so a killed run leaves its range pending
(its files are its own, and `basemodel verify` reports the extract as interrupted) until the next run
records them; a run that fails records what it leaves (every file is whole: each was renamed into place).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from basemodel_pipeline import files as fs
from basemodel_pipeline import manifests
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.sources import DayRange

OWN_RECORD = ".files.json"  # the files this source's extracts wrote (all they may delete), sizes and sha256


def read_record(out: Path) -> dict[str, Any] | None:
    """The extract's record (OWN_RECORD) as {"files": {name: entry}, "pending": [[start, end], ...]}; None
    before the first."""
    try:
        data = json.loads((out / OWN_RECORD).read_text())
        files = data["files"]
        pending = [[p[0], p[1]] for p in data.get("pending") or []]
        for span in pending:  # each a day or null: a malformed one is refused here, not while deciding
            for day in span:  # what is ours
                _day(day, dt.date.min)
        if not isinstance(files, dict) or not all(map(_entry, files.values())):
            raise TypeError("'files' is not a mapping of names to sizes and checksums")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise DataError(f"{out / OWN_RECORD}: unreadable ({exc}); delete it and extract again") from None
    return {"files": files, "pending": pending}


def _entry(entry: object) -> bool:
    """A record entry: {} (not hashed yet) or {bytes, sha256}."""
    return isinstance(entry, dict) and (
        not entry or (isinstance(entry.get("bytes"), int) and isinstance(entry.get("sha256"), str))
    )


def pending_range(pending: list[list[str | None]], name: str) -> bool:
    """Whether the file `name` lies in a day range of a run that has not finished (may have written it)."""
    return any(
        in_range(name, None if a is None and b is None else (_day(a, dt.date.min), _day(b, dt.date.max)))
        for a, b in pending
    )


def _day(text: str | None, default: dt.date) -> dt.date:
    return default if text is None else dt.date.fromisoformat(text)


def own_files(out: Path, record: dict[str, Any] | None) -> set[str] | None:
    """The file names the extracts of this directory wrote: those recorded, and those of a range a killed
    run may have written; None before the first record."""
    if record is None:
        return None
    return set(record["files"]) | {
        f.name for f in out.glob("*.parquet") if pending_range(record["pending"], f.name)
    }


def begin_record(out: Path, record: dict[str, Any] | None, days: DayRange | None) -> set[str]:
    """Add this run's day range to the record's pending ranges before anything is written (a first run
    records every file it finds as its own, as refuse_foreign allowed). Returns the recorded files that are
    missing already (deleted by hand): they stay recorded, and missing, unless this run writes them again."""
    record = record or {"files": {f.name: {} for f in out.glob("*.parquet")}, "pending": []}
    span = [None, None] if days is None else [days[0].isoformat(), days[1].isoformat()]
    _write_record(out, record["files"], [*record["pending"], span])
    return {name for name in record["files"] if not (out / name).exists()}


def finish_record(out: Path, missing: set[str]) -> None:
    """After a complete run: the size and sha256 of every file of the pending ranges (and of any entry
    without them), the other entries as they were; files the run removed leave the record."""
    record = read_record(out) or {"files": {}, "pending": []}
    pending = record["pending"]
    on_disk = {f.name for f in out.glob("*.parquet")}
    files = {}
    for name in sorted(on_disk | set(record["files"])):
        entry = record["files"].get(name, {})
        if name not in on_disk:
            if name in missing and not pending_range(pending, name):
                files[name] = entry  # deleted by hand before this run, and not extracted again
        elif "sha256" not in entry or pending_range(pending, name):
            files.update(manifests.file_records(out, [out / name]))
        else:
            files[name] = entry
    if files:
        _write_record(out, files, [])
    else:  # nothing written (a first run that failed): no record, as before the run
        (out / OWN_RECORD).unlink(missing_ok=True)


def _write_record(out: Path, files: dict[str, Any], pending: list[list[str | None]]) -> None:
    record = manifests.signed({"files": files, "pending": pending})
    fs.atomic_write_text(out / OWN_RECORD, json.dumps(record, indent=1))


def in_range(name: str, days: DayRange | None) -> bool:
    """Whether the day file `yyyy-mm-dd.parquet` belongs to the extracted range (all days when None)."""
    if days is None:
        return True
    try:
        day = dt.date.fromisoformat(name.removesuffix(".parquet"))
    except ValueError:
        return False
    return days[0] <= day < days[1]
