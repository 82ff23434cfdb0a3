"""Predictions integrity: the table's files match the manifest written at publish, and it was scored from the
current cache content (the library's `verify.verify_output`, as `basemodel verify` runs it)."""

import datetime as dt
from pathlib import Path

import dagster as dg

from basemodel_pipeline.defs.models.checks import finding_result
from basemodel_pipeline.defs.predictions.assets import predictions
from basemodel_pipeline.defs.shared.execution import latest_metadata
from basemodel_pipeline.defs.shared.partitions import scenarios_partitions


@dg.asset_check(
    asset=predictions,
    name="output_sha256",
    partitions_def=scenarios_partitions,
    blocking=True,
    description="The predictions' files match the manifest written when they were published (size and sha256) "
    "and were scored from the current cache content (the same verification as `basemodel verify`).",
)
def predictions_output_sha256(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    scenario = context.partition_key
    meta = latest_metadata(context.instance, predictions.key, scenario)
    if not meta or "as_of" not in meta:
        return dg.AssetCheckResult(
            passed=False, description=f"predictions[{scenario}] has no materialization"
        )
    path = Path(str(meta.get("path") or ""))
    if not path.is_file():  # a warehouse table: its writer replaced the slice in one transaction
        return dg.AssetCheckResult(passed=True, description=f"{meta.get('destination')}: not a file output")
    from basemodel_pipeline.cache.versions import read_manifest
    from basemodel_pipeline.ops.verify import verify_output

    cache_meta = latest_metadata(context.instance, dg.AssetKey("event_cache"))
    cache = read_manifest(Path(cache_meta["path"])) if cache_meta and "path" in cache_meta else None
    as_of = dt.date.fromisoformat(str(meta["as_of"]))
    redo = f"re-run `basemodel predict CONFIG -s {scenario} --as-of {as_of}`"
    finding = verify_output("predictions", f"{scenario} {as_of}", path.parent, as_of, cache, redo)
    return finding_result(finding, str(path.parent))


predictions_checks = [predictions_output_sha256]
