"""How assets run a stage: in-process library calls, or a Pipes entrypoint in a subprocess."""

from __future__ import annotations

import math
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg

from basemodel_pipeline.errors import UserError
from basemodel_pipeline.jobs._common import ERROR_FILE_EXTRA, data_version_of, flatten_metadata


def to_dagster_metadata(meta: Mapping[str, Any]) -> dict[str, Any]:
    """A stage's metadata as Dagster metadata values (dotted keys, paths, JSON; secrets dropped)."""
    out: dict[str, Any] = {}
    for key, (kind, value) in flatten_metadata(meta).items():
        if kind == "path":
            out[key] = dg.MetadataValue.path(value)
        elif kind == "json":
            out[key] = dg.MetadataValue.json(value)
        elif kind == "null":
            out[key] = dg.MetadataValue.null()
        elif isinstance(value, float) and not math.isfinite(value):
            out[key] = dg.MetadataValue.text(str(value))
        else:
            out[key] = value
    return out


def materialize_in_process(fn: Callable[[], Mapping[str, Any]]) -> dg.MaterializeResult:
    """Call a library stage; a UserError fails the step with the user's one-line message."""
    try:
        meta = fn()
    except UserError as err:
        raise dg.Failure(description=str(err), allow_retries=False) from None
    return dg.MaterializeResult(
        metadata=to_dagster_metadata(meta), data_version=dg.DataVersion(data_version_of(meta))
    )


def run_pipes_job(
    context: dg.AssetExecutionContext,
    client: dg.PipesSubprocessClient,
    job: str,
    config_path: str,
    args: Sequence[str] = (),
) -> dg.MaterializeResult:
    """Run ``python -m basemodel_pipeline.jobs.<job>`` through Pipes and return what it reported.

    The entrypoint writes a UserError's message to the file named by the ``error_file`` extra; the step then
    fails with that message (not just "process failed with code 2").
    """
    with tempfile.TemporaryDirectory(prefix="basemodel-pipes-") as tmp:
        error_file = Path(tmp) / "error.txt"
        command = [sys.executable, "-m", f"basemodel_pipeline.jobs.{job}", "--config", config_path, *args]
        try:
            invocation = client.run(
                context=context, command=command, extras={ERROR_FILE_EXTRA: str(error_file)}
            )
        except Exception:
            message = error_file.read_text().strip() if error_file.exists() else ""
            if message:
                raise dg.Failure(description=message, allow_retries=False) from None
            raise
        return invocation.get_materialize_result()
