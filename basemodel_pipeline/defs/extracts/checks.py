"""Checks on the extracts: the source's schema is unchanged (blocking) and volumes follow the guidelines.

Both read Parquet footers only. The schema baseline is the schema recorded by the latest passed evaluation
of the same check (the first evaluation records it). To accept an intended schema change, run the check
once from the UI with config ``accept_new_schema: true``.
"""

import datetime as dt
import json
import statistics
from pathlib import Path
from typing import Any

import dagster as dg

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.config import DataSource
from basemodel_pipeline.defs.extracts.files import day_of, describe_change, parquet_files, rows_of, schema_of
from basemodel_pipeline.defs.shared.resources import BasemodelConfigResource, QualityGates


class SchemaCheckConfig(dg.Config):
    accept_new_schema: bool = False


def last_passed_metadata(
    context: dg.AssetCheckExecutionContext, key: dg.AssetCheckKey
) -> dict[str, Any] | None:
    """Metadata of this check's latest passed evaluation in an earlier run (None before the first).

    Reads the check's execution history newest first, a page at a time, and filters on the status's name:
    the status enum (AssetCheckExecutionRecordStatus) is not part of Dagster's public API."""
    storage, cursor = context.instance.event_log_storage, None
    while True:
        history = storage.get_asset_check_execution_history(key, limit=20, cursor=cursor)
        for record in history:
            if record.status.value != "SUCCEEDED" or record.run_id == context.run.run_id:
                continue
            if record.event is None or record.event.dagster_event is None:
                continue
            evaluation = record.event.dagster_event.event_specific_data
            return {k: v.value for k, v in evaluation.metadata.items()}  # type: ignore[union-attr]
        if len(history) < 20:
            return None
        cursor = history[-1].id


def run_days(context: dg.AssetCheckExecutionContext) -> tuple[dt.date, dt.date] | None:
    """The day range [start, end) this run extracted (from its partition tags), or None."""
    tags = context.run.tags
    start = tags.get("dagster/asset_partition_range_start") or tags.get("dagster/partition")
    end = tags.get("dagster/asset_partition_range_end") or tags.get("dagster/partition")
    if not start or not end:
        return None
    return dt.date.fromisoformat(start), dt.date.fromisoformat(end) + dt.timedelta(days=1)


def schema_problems(files: list[Path], baseline: dict[str, str] | None) -> tuple[dict[str, str], list[str]]:
    """(current schema, problems): files that disagree with the newest file, and a change vs the baseline."""
    schemas = {f.name: schema_of(f) for f in files}
    current = schemas[files[-1].name]
    problems = []
    differing = [name for name, schema in schemas.items() if schema != current]
    if differing:
        problems.append(
            f"{len(differing)} of {len(files)} files differ from {files[-1].name}, first {differing[0]}: "
            f"{describe_change(schemas[differing[0]], current)}"
        )
    if baseline is not None and baseline != current:
        problems.append(f"schema changed since the last passed check: {describe_change(baseline, current)}")
    return current, problems


def day_volume_problems(
    rows_by_day: dict[dt.date, int], days: tuple[dt.date, dt.date] | None, gates: QualityGates
) -> tuple[list[str], dict[str, Any]]:
    """Days of `days` (default: the newest day) whose rows leave [min, max] x the trailing median."""
    if not rows_by_day:
        return ["no day files"], {}
    ordered = sorted(rows_by_day)
    start, end = days or (ordered[-1], ordered[-1] + dt.timedelta(days=1))
    problems: list[str] = []
    checked = 0
    for day in (d for d in ordered if start <= d < end):
        window = [
            rows_by_day[d] for d in ordered if day - dt.timedelta(days=gates.volume_window_days) <= d < day
        ]
        if len(window) < 7:  # too little history to judge
            continue
        checked += 1
        median = statistics.median(window)
        ratio = rows_by_day[day] / median if median else float("inf")
        if not gates.min_day_ratio <= ratio <= gates.max_day_ratio:
            problems.append(f"{day}: {rows_by_day[day]} rows, {ratio:.2f}x the trailing median {median:g}")
    meta = {"days_checked": checked, "days_flagged": len(problems)}
    return problems, meta


def build_extract_checks(src: DataSource, key: dg.AssetKey) -> list[dg.AssetChecksDefinition]:
    name = src.name

    @dg.asset_check(
        asset=key,
        name="schema_unchanged",
        blocking=True,
        description=f"Columns and types of '{name}' match the last passed check (blocks the cache).",
    )
    def schema_unchanged(
        context: dg.AssetCheckExecutionContext,
        config: SchemaCheckConfig,
        basemodel_config: BasemodelConfigResource,
    ) -> dg.AssetCheckResult:
        files = parquet_files(ws.extracts_dir(basemodel_config.load(), name))
        if not files:
            return dg.AssetCheckResult(passed=False, description=f"'{name}' has no extract files yet")
        previous = (
            None
            if config.accept_new_schema
            else last_passed_metadata(context, dg.AssetCheckKey(key, "schema_unchanged"))
        )
        baseline = json.loads(previous["schema"]) if previous and "schema" in previous else None
        current, problems = schema_problems(files, baseline)
        return dg.AssetCheckResult(
            passed=not problems,
            severity=dg.AssetCheckSeverity.ERROR,
            description="; ".join(problems) or f"{len(current)} columns, as before",
            metadata={"schema": json.dumps(current, sort_keys=True), "files": len(files)},
        )

    @dg.asset_check(
        asset=key,
        name="volume_within_guidelines",
        description=(
            f"Rows of '{name}' per day within the configured ratio of the trailing median (event sources), "
            "or not shrinking by more than the configured share (attribute tables). Warns; never blocks."
        ),
    )
    def volume_within_guidelines(
        context: dg.AssetCheckExecutionContext,
        basemodel_config: BasemodelConfigResource,
        quality_gates: QualityGates,
    ) -> dg.AssetCheckResult:
        files = parquet_files(ws.extracts_dir(basemodel_config.load(), name))
        if src.type == "event":
            rows = {d: rows_of(f) for f in files if (d := day_of(f)) is not None}
            problems, meta = day_volume_problems(rows, run_days(context), quality_gates)
            meta["rows"] = sum(rows.values())
        else:
            total = sum(rows_of(f) for f in files)
            previous = last_passed_metadata(context, dg.AssetCheckKey(key, "volume_within_guidelines"))
            before = int(previous["rows"]) if previous and "rows" in previous else None
            problems = [] if total else ["the table is empty"]
            if before and total < (1 - quality_gates.max_table_shrink) * before:
                problems.append(f"{total} rows, down from {before}")
            meta = {"rows": total}
        severity = dg.AssetCheckSeverity.ERROR if meta["rows"] == 0 else dg.AssetCheckSeverity.WARN
        return dg.AssetCheckResult(
            passed=not problems,
            severity=severity,
            description="; ".join(problems[:5])
            + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else "")
            or "volumes within guidelines",
            metadata=meta,
        )

    return [schema_unchanged, volume_within_guidelines]
