"""Sharded scoring: k workers each score a contiguous slice of the entities into a part file; merging the
parts in order streams exactly the single-process table to the output destination.

    basemodel predict CONFIG -s churn --shard 0/4      # ... 1/4, 2/4, 3/4: processes, containers, Dagster runs
    basemodel predict CONFIG -s churn --merge-shards 4 # once all parts exist (they share the workspace)
    basemodel predict CONFIG -s churn --workers 4      # both steps with 4 local processes (inference/workers.py)

In the library the layout of a run is part of its ScoringOptions (workers, shard, merge_shards:
inference/options.py), given to pipeline.run_predict.

Parts live in <workspace>/predictions/.shards/<scenario>/<as_of>/<k>/part-<i>.parquet, written atomically,
and carry the model version, so parts of different models or dates are never merged together.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.history import provenance as cache_provenance
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.inference.options import check_shard
from basemodel_pipeline.inference.state import default_as_of
from basemodel_pipeline.workspace import cache_dir

SHARD_ALIGN = (
    4096  # shard boundaries fall on the scorer's batch boundaries: identical batches, identical bits
)


def shard_range(n: int, shard: tuple[int, int] | None, align: int | None = None) -> slice:
    """Rows [a, b) of shard i of k over n entities: contiguous, cut at multiples of `align` (SHARD_ALIGN)."""
    align = align or SHARD_ALIGN
    if shard is None:
        return slice(0, n)
    check_shard(shard)
    i, k = shard
    blocks = -(-n // align)

    def cut(j: int) -> int:
        return min(n, (blocks * j // k) * align)

    return slice(cut(i), cut(i + 1))


def parts_dir(cfg: PipelineConfig, scenario: str, as_of: dt.date, k: int) -> Path:
    return ws.root(cfg) / "predictions" / ".shards" / scenario / as_of.isoformat() / str(k)


class PartWriter:
    """The writer interface (write/close/abort) for one shard's part file, published atomically at close."""

    def __init__(self, path: Path, model_version: str) -> None:
        self.path, self.rows = path, 0
        self.meta = {b"model_version": model_version.encode()}
        path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = path.with_name(f".{path.name}.tmp")
        self._writer: pq.ParquetWriter | None = None

    def write(self, table: pa.Table) -> None:
        if self._writer is None:
            schema = table.schema.with_metadata(self.meta)
            self._writer = pq.ParquetWriter(self.tmp, schema, compression="zstd")
        self._writer.write_table(table.replace_schema_metadata(self.meta))
        self.rows += table.num_rows

    def close(self) -> dict[str, Any]:
        if self._writer is None:
            raise UserError(f"{self.path}: nothing was written (an empty shard writes an empty table)")
        self._writer.close()
        os.replace(self.tmp, self.path)
        return {"rows": self.rows, "destination": str(self.path), "format": "parquet"}

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is not None:
            self.abort()


def merge_shards(
    cfg: PipelineConfig, scenario: str, as_of: dt.date | None, k: int, destination: str | None
) -> dict[str, Any]:
    """Stream parts 0..k-1 in order to the destination; all must exist and come from one model version."""
    from basemodel_pipeline.outputs import open_writer

    cache = EventCache(cache_dir(cfg))
    as_of = as_of or default_as_of(cache)
    d = parts_dir(cfg, scenario, as_of, k)
    files = [d / f"part-{i:05d}.parquet" for i in range(k)]
    missing = [f.name for f in files if not f.exists()]
    if missing:
        raise UserError(
            f"cannot merge {k} shards of '{scenario}' as of {as_of}: missing {', '.join(missing)} in {d}; "
            f"run `basemodel predict CONFIG -s {scenario} --shard I/{k}` for each"
        )
    versions = {pq.read_schema(f).metadata.get(b"model_version", b"").decode() for f in files}
    if len(versions) != 1:
        raise UserError(
            f"shards in {d} come from different model versions ({', '.join(sorted(versions))}); "
            "re-run the stale ones"
        )
    version = versions.pop()
    provenance = cache_provenance(cache.manifest, as_of)
    writer = open_writer(cfg, "predictions", scenario, as_of, destination)
    if getattr(writer, "directory", None) is not None:  # file destinations: what retention must keep
        ws.write_provenance(writer.directory, scenario=scenario, model_version=version, **provenance)
    with writer:
        for f in files:
            pf = pq.ParquetFile(f)
            for g in range(pf.num_row_groups):
                if pf.metadata.row_group(g).num_rows:  # an empty shard's types may be narrower
                    writer.write(pf.read_row_group(g).replace_schema_metadata(None))
        if writer.rows == 0:  # every shard empty: still the table's columns
            writer.write(pq.read_table(files[0]).replace_schema_metadata(None))
        info = writer.close()
    return {**info, "as_of": as_of.isoformat(), "shards": k, "model_version": version, **provenance}
