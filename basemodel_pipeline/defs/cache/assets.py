"""The event cache: model-ready, entity-sorted columnar store under <workspace>/cache/<fingerprint>/."""

import dagster as dg

from basemodel_pipeline.defs.shared.conditions import AFTER_DEPS_UPDATED
from basemodel_pipeline.defs.shared.execution import materialize_in_process
from basemodel_pipeline.defs.shared.resources import BasemodelConfigResource
from basemodel_pipeline.defs.shared.versions import code_version
from basemodel_pipeline.pipeline import run_cache
from basemodel_pipeline.progress import LogProgress

# DuckDB allows one writer: builds of the cache queue on this pool.
CACHE_POOL = "cache_writer"


def build_cache_asset(extract_keys: list[dg.AssetKey]) -> dg.AssetsDefinition:
    @dg.asset(
        name="event_cache",
        deps=extract_keys,
        group_name="cache",
        kinds={"duckdb", "parquet"},
        pool=CACHE_POOL,
        code_version=code_version("event_cache"),
        automation_condition=AFTER_DEPS_UPDATED,
    )
    def event_cache(
        context: dg.AssetExecutionContext, basemodel_config: BasemodelConfigResource
    ) -> dg.MaterializeResult:
        """Model-ready event store built from the extracts (about 1:1 with the source size).

        Keyed by the fingerprint of the config's data part; reused when nothing changed, appended (new days
        only, entity indices and codes kept) when only new days landed, rebuilt otherwise (docs/cache.md).
        Automation: refreshed after any extract (partition) is updated.
        """
        return materialize_in_process(
            lambda: run_cache(basemodel_config.load(), LogProgress(context.log.info)),
            extra=lambda meta: {"dagster/row_count": int(meta["events"])},
        )

    return event_cache
