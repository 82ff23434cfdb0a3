"""One asset per data source: its rows copied from the source into <workspace>/extracts/<source>/.

Extracts run in-process (DuckDB reads the source and writes Parquet; no GPU). Event sources land as daily
files; the asset itself is unpartitioned and re-extraction is incremental inside the library.
"""

import dagster as dg

from basemodel_pipeline.config import DataSource
from basemodel_pipeline.defs._run import materialize_in_process
from basemodel_pipeline.defs.resources import BasemodelConfigResource
from basemodel_pipeline.pipeline import run_extract
from basemodel_pipeline.progress import LogProgress

GROUP = "extracts"
KEY_PREFIX = "extracts"

KIND_DOC = {
    "event": "Event table (entity, timestamp, attributes), one Parquet file per day.",
    "attribute": "Attribute table joined to events (e.g. products).",
    "main_entity_attribute": "Attributes of the main entity (e.g. household demographics).",
}


def extract_key(source: str) -> dg.AssetKey:
    return dg.AssetKey([KEY_PREFIX, source])


def build_extract_asset(src: DataSource) -> dg.AssetsDefinition:
    name = src.name

    @dg.asset(
        key=extract_key(name),
        group_name=GROUP,
        kinds={"duckdb", "parquet"},
        description=f"Extract of data source '{name}' ({src.type}). {KIND_DOC[src.type]}",
        metadata={"source_type": src.type, "database_type": src.data_location.database_type},
    )
    def _extract(
        context: dg.AssetExecutionContext, basemodel_config: BasemodelConfigResource
    ) -> dg.MaterializeResult:
        return materialize_in_process(
            lambda: run_extract(basemodel_config.load(), name, LogProgress(context.log.info))[name]
        )

    return _extract


def build_extract_assets(sources: list[DataSource]) -> list[dg.AssetsDefinition]:
    return [build_extract_asset(src) for src in sources]
