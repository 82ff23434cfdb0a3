"""Which cache content a derived artifact (the per-entity state, a predictions table) was built from.

``history_version(manifest, as_of)`` hashes what the history before `as_of` is made of: the data configuration
(the cache fingerprint and format) and every extract file that can hold an event before that day: the day
files of earlier days (their size and content hash, from the manifest's `inputs`) and every other file
(attribute sources). A correction of old days changes it, even with the same number of rows; days appended
on or after `as_of` do not, so a state can still be advanced with them."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from typing import Any

DAY_FILE = re.compile(r"^(\d{4}-\d{2}-\d{2})\.parquet$")


def history_inputs(manifest: dict[str, Any], as_of: dt.date) -> dict[str, list[list[Any]]]:
    """The manifest's input files that can hold events before `as_of`, per source."""
    cut = as_of.isoformat()
    out = {}
    for source, files in sorted((manifest.get("inputs") or {}).items()):
        out[source] = [f for f in files if not (m := DAY_FILE.match(str(f[0]))) or m.group(1) < cut]
    return out


def history_version(manifest: dict[str, Any], as_of: dt.date) -> str | None:
    """A short hash of the cache content before `as_of`; None for a manifest that records no inputs."""
    if not manifest.get("inputs"):
        return None
    blob = [manifest.get("fingerprint"), manifest.get("format_version"), history_inputs(manifest, as_of)]
    digest = hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]
    return f"{as_of.isoformat()}-{digest}"


def provenance(manifest: dict[str, Any], as_of: dt.date) -> dict[str, str | None]:
    """The cache content an output as of a date was built from, for its provenance.json: the cache's data
    version (informative) and its history version before that date (what staleness is judged by)."""
    from basemodel_pipeline.cache.versions import data_version

    return {"cache_data_version": data_version(manifest), "cache_history": history_version(manifest, as_of)}
