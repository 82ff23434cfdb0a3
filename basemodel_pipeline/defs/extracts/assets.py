"""One asset per data source: its rows copied from the source into <workspace>/extracts/<source>/.

Event sources are daily-partitioned (one partition = one ``<yyyy-mm-dd>.parquet`` file; a partition range
runs as one `run_extract(days=(start, end))` call, so a UI backfill of a year is one run, and each day's
materialization carries that day's own rows, bytes and data version (the content version of its own file),
the range's totals beside them). Attribute tables are unpartitioned and extracted whole. Extracts run
in-process (DuckDB reads the source and writes Parquet; no GPU). Each source's extract queues on its own
pool `extract_<source>` (one step at a time with the deploy's default pool limit of 1); the library's
per-source lock (sources/extract.py) is the real guard.
"""

import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.config import DataSource
from basemodel_pipeline.defs.extracts.files import (
    content_version,
    day_files,
    day_version,
    parquet_files,
    rows_of,
    schema_of,
)
from basemodel_pipeline.defs.shared.execution import materialize_in_process, materialize_partitions_in_process
from basemodel_pipeline.defs.shared.resources import BasemodelConfigResource
from basemodel_pipeline.defs.shared.versions import code_version
from basemodel_pipeline.pipeline import run_extract
from basemodel_pipeline.progress import LogProgress

GROUP = "extracts"
POOL_PREFIX = "extract_"  # one pool per source: two extracts of one source never run at once
KEY_PREFIX = "extracts"

KIND_DOC = {
    "event": "Event table (entity, timestamp, attributes), one Parquet file per day (daily partitions).",
    "attribute": "Attribute table joined to events (e.g. products), extracted whole.",
    "main_entity_attribute": "Attributes of the main entity (e.g. household demographics), extracted whole.",
}


def extract_key(source: str) -> dg.AssetKey:
    return dg.AssetKey([KEY_PREFIX, source])


def days_partitions(start: dt.date, end: dt.date | None = None) -> dg.DailyPartitionsDefinition:
    """One partition per day from the config's data_start_date: up to today's (partial) day, or up to a
    historical data set's data_end_date (the UI then shows only days that can hold data)."""
    if end is not None:
        return dg.DailyPartitionsDefinition(
            start_date=start.isoformat(), end_date=(end + dt.timedelta(days=1)).isoformat()
        )
    return dg.DailyPartitionsDefinition(start_date=start.isoformat(), end_offset=1)


def _column_schema(schema: dict[str, str]) -> dg.TableSchema:
    return dg.TableSchema(columns=[dg.TableColumn(name, type_) for name, type_ in schema.items()])


def _range_metadata(src: str, meta: dict, files: list, days: tuple[dt.date, dt.date]) -> dict:
    """Metadata shared by every day of a range run: the range's and the whole extract's totals, and the rows
    of the range's days that repeat another row exactly."""
    return {
        "duplicate_rows": meta["duplicate_rows"],
        "range_rows": sum(rows_of(f) for f in files),
        "days": (days[1] - days[0]).days,
        "day_files": len(files),
        "first_day": days[0].isoformat(),
        "last_day": (days[1] - dt.timedelta(days=1)).isoformat(),
        "range_bytes": sum(f.stat().st_size for f in files),
        "total_rows": meta["rows"],
        "total_files": meta["files"],
        "path": meta["path"],
        "source": src,
    }


def _day_metadata(directory: Path, day: str) -> dict[str, Any]:
    """One day partition's own rows, bytes (0 when the source has no event that day) and data version (the
    content version of its own file: an unchanged day keeps it whatever range re-extracts it)."""
    file = directory / f"{day}.parquet"
    rows = rows_of(file) if file.is_file() else 0
    return {
        "rows": rows,
        "dagster/row_count": rows,
        "bytes": file.stat().st_size if rows else 0,
        "data_version": day_version(directory, day),
    }


def build_extract_asset(src: DataSource, partitions: dg.PartitionsDefinition | None) -> dg.AssetsDefinition:
    name = src.name
    is_event = src.type == "event"

    @dg.asset(
        key=extract_key(name),
        group_name=GROUP,
        kinds={"duckdb", "parquet"},
        description=f"Extract of data source '{name}' ({src.type}). {KIND_DOC[src.type]}",
        metadata={"source_type": src.type, "database_type": src.data_location.database_type},
        partitions_def=partitions if is_event else None,
        backfill_policy=dg.BackfillPolicy.single_run() if is_event else None,
        tags={"basemodel/stage": "extract"},
        code_version=code_version("extract"),
        pool=f"{POOL_PREFIX}{name}",
    )
    def _extract(
        context: dg.AssetExecutionContext, basemodel_config: BasemodelConfigResource
    ) -> dg.MaterializeResult:
        progress = LogProgress(context.log.info)
        if not is_event:

            def whole() -> dict:
                meta = run_extract(basemodel_config.load(), name, progress)[name]
                return {**meta, "data_version": content_version(parquet_files(Path(meta["path"])))}

            return materialize_in_process(whole, extra=_files_extra)
        window = context.partition_time_window
        days = (window.start.date(), window.end.date())

        def stage() -> dict:
            cfg = basemodel_config.load()
            meta = run_extract(cfg, name, progress, days=days)[name]
            return _range_metadata(name, meta, day_files(ws.extracts_dir(cfg, name), *days), days)

        # each day's materialization gets its own counts and data version, the range's totals beside them
        return materialize_partitions_in_process(
            context, stage, lambda meta, day: _day_metadata(Path(meta["path"]), day), extra=_schema_extra
        )

    return _extract


def _files_extra(meta: Mapping[str, Any]) -> dict[str, Any]:
    """Row count and column schema of a whole (attribute) extract."""
    return {"dagster/row_count": meta["rows"], **_schema_extra(meta)}


def _schema_extra(meta: Mapping[str, Any]) -> dict[str, Any]:
    """Column schema of an extract, from its newest file's footer."""
    files = parquet_files(Path(meta["path"]))
    return {"dagster/column_schema": _column_schema(schema_of(files[-1]))} if files else {}


def build_extract_assets(
    sources: list[DataSource], partitions: dg.PartitionsDefinition
) -> list[dg.AssetsDefinition]:
    return [build_extract_asset(src, partitions) for src in sources]
