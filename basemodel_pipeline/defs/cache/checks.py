"""Cache integrity: every file of the cache matches its manifest (size and sha256); blocks training."""

import json
from pathlib import Path

import dagster as dg

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.defs._run import latest_metadata


def manifest_problems(cache_dir: Path) -> tuple[list[str], int, int]:
    """(problems, files checked, bytes checked) of a cache directory against its manifest.json."""
    manifest_file = cache_dir / "manifest.json"
    if not manifest_file.is_file():
        return [f"{manifest_file} is missing"], 0, 0
    files = json.loads(manifest_file.read_text()).get("files") or {}
    problems: list[str] = []
    checked = size = 0
    for rel, expected in sorted(files.items()):
        path = cache_dir / rel
        if not path.is_file():
            problems.append(f"{rel}: missing")
            continue
        checked += 1
        size += path.stat().st_size
        if path.stat().st_size != expected["bytes"]:
            problems.append(f"{rel}: {path.stat().st_size} bytes, manifest says {expected['bytes']}")
        elif ws.sha256_file(path) != expected["sha256"]:
            problems.append(f"{rel}: sha256 differs from the manifest")
    listed = set(files) | {"manifest.json"}
    extra = [
        rel
        for p in cache_dir.rglob("*")
        if p.is_file()
        and (rel := str(p.relative_to(cache_dir))) not in listed
        and not rel.startswith("view/")  # derived: the merged view of the appends (cache/view.py)
        and not any(part.startswith(".") for part in p.relative_to(cache_dir).parts)  # staging, locks
    ]
    problems += [f"{rel}: not in the manifest" for rel in sorted(extra)]
    return problems, checked, size


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
