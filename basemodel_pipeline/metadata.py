"""What a stage reports: its metadata flattened for Dagster and the CLI, its data version, and the names the
launcher and the step share.

Ground floor (docs/architecture.md): the Pipes entrypoints (entrypoints/), the Dagster assets (defs/) and the CLI all
read metadata through here, so none of them imports another face's internals.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

# Names (never values) of the variables the launcher forwarded to the step (Launcher.forward_env)
FORWARDED_ENV_VAR = "BASEMODEL_FORWARDED_ENV"

# Keys that could carry credentials never reach logs or Dagster metadata.
SECRET_KEY = re.compile(r"pass(word|wd)?|secret|token|credential|private|api[_-]?key|access[_-]?key", re.I)
PATH_KEY = re.compile(r"(^|[._])(path|dir|file|directory|location)$", re.I)


def _scalar(value: Any) -> Any:
    """numpy scalars, dates and paths to plain JSON values."""
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, list | dict | str):
        with contextlib.suppress(TypeError, ValueError):
            value = value.item()
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    return value


def flatten_metadata(meta: Mapping[str, Any], prefix: str = "") -> dict[str, tuple[str, Any]]:
    """A stage's metadata as {key: (type, value)}, type one of path|json|null|infer.

    Nested dicts become dotted keys ("transactions.rows"), lists become JSON, keys that look like paths
    ("path", "cache_dir", "x.file") become path values, and keys that look like secrets are dropped.
    """
    out: dict[str, tuple[str, Any]] = {}
    for raw_key, raw_value in meta.items():
        key = f"{prefix}{raw_key}"
        if SECRET_KEY.search(str(raw_key)):
            continue
        value = _scalar(raw_value)
        if isinstance(value, Mapping):
            out.update(flatten_metadata(value, prefix=f"{key}."))
        elif isinstance(value, list | tuple):
            out[key] = ("json", json.loads(json.dumps([_scalar(v) for v in value], default=str)))
        elif value is None:
            out[key] = ("null", None)
        elif isinstance(value, str) and PATH_KEY.search(key):
            out[key] = ("path", value)
        elif isinstance(value, bool | int | float | str):
            out[key] = ("infer", value)
        else:
            out[key] = ("infer", str(value))
    return out


def to_pipes_metadata(meta: Mapping[str, Any]) -> dict[str, Any]:
    """Flat metadata in the form dagster_pipes.report_asset_materialization accepts."""
    out: dict[str, Any] = {}
    for key, (kind, value) in flatten_metadata(meta).items():
        if kind == "infer":
            if isinstance(value, float) and not math.isfinite(value):
                out[key] = {"raw_value": str(value), "type": "text"}
            else:
                out[key] = value
        else:
            out[key] = {"raw_value": value, "type": kind}
    return out


def data_version_of(meta: Mapping[str, Any]) -> str:
    """The artifact's own version when the stage reports one, else a hash of its metadata."""
    for key in ("data_version", "version", "fingerprint", "checksum"):
        value = meta.get(key)
        if isinstance(value, str) and value:
            return value
    payload = json.dumps({k: v for k, v in flatten_metadata(meta).items()}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def json_dumps(obj: Any) -> str:
    """JSON with NaN and infinities written as null (strict JSON: other tools refuse bare NaN)."""
    return json.dumps(finite(obj), indent=2, allow_nan=False)


def finite(obj: Any) -> Any:
    """obj with NaN and infinities as None and numpy scalars as Python numbers, for strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    if isinstance(obj, np.floating | np.integer):
        return finite(obj.item())
    return obj
