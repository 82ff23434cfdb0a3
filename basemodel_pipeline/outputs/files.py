"""Parquet, CSV and TSV files, staged in a hidden directory and published atomically at close.

    <root>/predictions/<scenario>/<as_of>/predictions.<parquet|csv|tsv>
    <root>/predictions/<scenario>/<as_of>/subsets/<name>/predictions.<parquet|csv|tsv>   (predict --entities)
    <root>/embeddings/<as_of>/embeddings.<parquet|csv|tsv>

<root> is the workspace unless the destination sets `path`. The staging directory replaces the final one in
one rename; files of other formats already there, the subsets/ directory (and files the caller adds to
`directory`, such as the embeddings' .npy arrays) are published together with the new file, and a
manifest.json with the size and sha256 of each, written last (outputs/manifest.py). A subset is
staged outside the (scenario, as_of) directory and renamed into its subsets/ directory, so it never touches
the full table. Publishes into one scenario's (or the embeddings') directory take turns on an flock
(.publish.lock beside the as-of directories), so a full table published meanwhile cannot drop a subset.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from basemodel_pipeline import files as fs
from basemodel_pipeline import locks
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.config import PipelineConfig
from basemodel_pipeline.config.outputs import FileOutput
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.outputs.base import Writer
from basemodel_pipeline.outputs.manifest import MANIFEST, write_manifest

SUBSETS = "subsets"
PUBLISH_LOCK = ".publish.lock"


def output_dir(root: Path, dataset: str, scenario: str | None, as_of: dt.date) -> Path:
    parts = [dataset, scenario] if dataset == "predictions" else [dataset]
    return root.joinpath(*parts, as_of.isoformat())  # type: ignore[arg-type]


def flat_for_text(table: pa.Table) -> pa.Table:
    """CSV has no lists: a fixed-size list column `x` of width d becomes columns x_0 .. x_{d-1}."""
    out = table
    for i, field in reversed(list(enumerate(table.schema))):
        if pa.types.is_fixed_size_list(field.type):
            col = table.column(i).combine_chunks()
            width = field.type.list_size
            values = col.flatten()
            out = out.remove_column(i)
            for j in range(width - 1, -1, -1):
                part = values.take(pa.array(range(j, len(values), width))) if len(col) else values
                out = out.add_column(i, f"{field.name}_{j}", part)
        elif pa.types.is_nested(field.type):
            raise UserError(f"column '{field.name}' ({field.type}) cannot be written as CSV/TSV; use parquet")
    return out


class FileWriter(Writer):
    def __init__(
        self,
        cfg: PipelineConfig,
        name: str,
        dest: FileOutput,
        dataset: str,
        scenario: str | None,
        as_of: dt.date,
        subset: str | None = None,
    ) -> None:
        super().__init__(name, dataset, scenario, as_of)
        self.format = dest.kind
        self.dest = dest
        root = ws.root(cfg)
        if dest.path:
            root = root / dest.path  # an absolute path stays as it is
        self.slice = output_dir(root, dataset, scenario, as_of)  # the (scenario, as_of) directory
        self.subset = subset
        self.final = self.slice / SUBSETS / subset if subset else self.slice
        fs.clean_stale_tmp(self.slice.parent)  # only temporaries of dead writers
        staged_as = self.slice.with_name(f"{self.slice.name}.{SUBSETS}.{subset}") if subset else self.slice
        self.directory: Path = fs.staging_dir(staged_as)  # the caller may add files here before close
        self.file = self.directory / f"{dataset}.{dest.kind}"
        self._sink: pq.ParquetWriter | pacsv.CSVWriter | None = None

    def _open(self, schema: pa.Schema) -> pq.ParquetWriter | pacsv.CSVWriter:
        if self.format == "parquet":
            compression = None if self.dest.compression == "none" else self.dest.compression
            return pq.ParquetWriter(self.file, schema, compression=compression)
        delimiter = "\t" if self.format == "tsv" else ","
        return pacsv.CSVWriter(self.file, schema, write_options=pacsv.WriteOptions(delimiter=delimiter))

    def _write(self, table: pa.Table) -> None:
        if self.format != "parquet":
            table = flat_for_text(table)
        if self._sink is None:
            self._sink = self._open(table.schema)
        self._sink.write_table(table)

    def _close(self) -> dict[str, Any]:
        if self._sink is None:  # no rows: still a valid, empty file with the columns when they are known
            schema = self.schema or pa.schema([("entity_id", pa.string()), ("as_of", pa.date32())])
            self._sink = self._open(
                schema if self.format == "parquet" else flat_for_text(schema.empty_table()).schema
            )
        self._sink.close()
        self._sink = None
        lock = self.slice.parent / PUBLISH_LOCK
        with locks.exclusive_lock(lock, f"publish into {self.slice.parent}", None, lambda _: None):
            if self.subset is None:
                keep_other_files(self.final, self.directory)
            else:
                self.final.parent.mkdir(parents=True, exist_ok=True)
            write_manifest(self.directory)  # last: the checksums of what is published
            fs.publish_dir(self.directory, self.final)
        return {"destination": str(self.final / self.file.name), "path": str(self.final / self.file.name)}

    def _abort(self) -> None:
        if self._sink is not None:
            with contextlib.suppress(Exception):  # the staging directory is removed anyway
                self._sink.close()
            self._sink = None
        fs.discard_dir(self.directory)


def keep_other_files(final: Path, staging: Path) -> None:
    """Hard-link (or copy) files and directories (subsets/) of `final` that the staging directory does not
    replace into it."""
    if not final.is_dir():
        return
    for f in final.iterdir():
        target = staging / f.name
        if target.exists() or f.name == MANIFEST:  # the manifest is written anew
            continue
        if f.is_dir():
            shutil.copytree(f, target, copy_function=_link_or_copy)
        elif f.is_file():
            _link_or_copy(f, target)


def _link_or_copy(source: Path | str, target: Path | str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
