"""Cache integrity: every file of the cache matches its manifest (size and sha256); blocks training."""

from pathlib import Path

import dagster as dg

from basemodel_pipeline.cache.integrity import manifest_problems
from basemodel_pipeline.defs.shared.execution import latest_metadata


def build_cache_check(cache_key: dg.AssetKey) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=cache_key,
        name="manifest_sha256",
        blocking=True,
        description="Every cache file exists with the size and sha256 its manifest records (blocks training).",
    )
    def manifest_sha256(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        meta = latest_metadata(context.instance, cache_key)
        if not meta or "path" not in meta:
            return dg.AssetCheckResult(passed=False, description="event_cache has no materialization yet")
        problems, checked, size = manifest_problems(Path(meta["path"]))
        return dg.AssetCheckResult(
            passed=not problems,
            severity=dg.AssetCheckSeverity.ERROR,
            description="; ".join(problems[:5]) or f"{checked} files match the manifest",
            metadata={
                "files": checked,
                "bytes": size,
                "problems": len(problems),
                "path": dg.MetadataValue.path(meta["path"]),
            },
        )

    return manifest_sha256
