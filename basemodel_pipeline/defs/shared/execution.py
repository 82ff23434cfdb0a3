"""How assets run a stage: in-process library calls, or a Pipes entrypoint in a subprocess."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dagster as dg

# Dagster's own marker for an output whose asset events the step logged itself: with it, Dagster adds none of
# its own (Dagster uses it for the per-partition data versions of observable source assets). Private API, used
# by materialize_partitions_in_process only; test_orchestration_sensors checks one materialization per day.
from dagster._core.definitions.source_asset import (
    SYSTEM_METADATA_KEY_SOURCE_ASSET_OBSERVATION as EVENTS_LOGGED_BY_STEP,
)

from basemodel_pipeline.defs.shared.launcher import Launcher
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.metadata import data_version_of, flatten_metadata


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


def materialize_in_process(
    fn: Callable[[], Mapping[str, Any]],
    extra: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
) -> dg.MaterializeResult:
    """Call a library stage; a UserError fails the step with the user's one-line message.

    `extra` turns the stage's metadata into additional Dagster metadata (row count, column schema...).
    """
    try:
        meta = fn()
    except UserError as err:
        raise dg.Failure(description=str(err), allow_retries=False) from None
    metadata = to_dagster_metadata(meta)
    if extra is not None:
        metadata.update(extra(meta))
    return dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion(data_version_of(meta)))


def materialize_partitions_in_process(
    context: dg.AssetExecutionContext,
    fn: Callable[[], Mapping[str, Any]],
    partition_meta: Callable[[Mapping[str, Any], str], Mapping[str, Any]],
    extra: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
) -> dg.MaterializeResult:
    """Call a library stage that writes a partition range in one step: one materialization per partition,
    each with its own data version.

    `fn` returns the metadata of the whole range, `partition_meta(meta, key)` that partition's own, with its
    `data_version`. Each partition's materialization carries both (its own on top) and the tags Dagster puts
    on the materializations of an output: its own data version and the asset's code version. From a returned
    MaterializeResult Dagster would give every partition of the range the one data version of the step, so a
    day re-extracted with the same bytes in another range would get a new version and rebuild what depends
    on it. Only for assets without dependencies (Dagster would also record the versions of the inputs).
    """
    try:
        meta = fn()
        own = {key: partition_meta(meta, key) for key in context.partition_keys}
    except UserError as err:
        raise dg.Failure(description=str(err), allow_retries=False) from None
    shared = to_dagster_metadata(meta)
    if extra is not None:
        shared.update(extra(meta))
    code = context.assets_def.code_versions_by_key.get(context.asset_key) or context.run_id
    for key, partition in own.items():
        tags = {
            "dagster/data_version": data_version_of(partition),
            "dagster/data_version_is_user_provided": "true",
            "dagster/code_version": code,
        }
        metadata = {**shared, **to_dagster_metadata(partition)}
        context.log_event(
            dg.AssetMaterialization(asset_key=context.asset_key, partition=key, metadata=metadata, tags=tags)
        )
    return dg.MaterializeResult(metadata={EVENTS_LOGGED_BY_STEP: True})


def run_entrypoint(
    context: dg.AssetExecutionContext,
    launcher: Launcher,
    stage: str,
    config_path: str,
    args: Sequence[str] = (),
) -> dg.MaterializeResult:
    """Run ``python -m basemodel_pipeline.entrypoints.<stage>`` through the launcher and return what it reported."""
    return launcher.run(context, stage, config_path, args).get_materialize_result()


def latest_metadata(
    instance: dg.DagsterInstance, key: dg.AssetKey, partition: str | None = None
) -> dict[str, Any] | None:
    """The metadata of an asset's (partition's) latest materialization as plain values, or None."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None), limit=1
    ).records
    if not records:
        return None
    mat = records[0].asset_materialization
    return {k: v.value for k, v in (mat.metadata if mat else {}).items()}
