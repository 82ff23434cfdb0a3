"""New data: request the day partitions of event extracts that the source has and the extract lacks.

Per event source the cursor keeps the latest day already requested (the watermark). A tick asks the
source for its watermark (one max() query, `sources.watermark`) and requests one run for the days
[cursor day, watermark] (the cursor day again: it may have been partial). The run key names the source and
the day range, so a repeated tick or a lost cursor never runs the same range twice.

The requested range stays in the cursor ("pending") until its run succeeded (or the extract on disk reaches
its last day). While that run is queued or running the source gets no new request; when it failed or was
canceled, the next tick requests the range again (extended to the current watermark) under a new run key
``<source>:<first>..<last>#<attempt>``, so a failed range is retried, one run at a time, until it succeeds.

Parquet sources on s3:// are first listed by prefix: while the listing (keys, sizes, ETags) is unchanged
the source is not queried at all; when day-named files (``.../2017-03-01.parquet`` or ``day=2017-03-01/``)
are found, the newest name is the watermark without reading any data.
"""

import datetime as dt
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import dagster as dg

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.config import DataSource, PipelineConfig, load_config
from basemodel_pipeline.defs.extracts.assets import extract_key
from basemodel_pipeline.defs.extracts.files import day_of, parquet_files
from basemodel_pipeline.defs.shared.conditions import MAX_RUNTIME, MAX_RUNTIME_TAG
from basemodel_pipeline.defs.shared.resources import BasemodelConfigResource
from basemodel_pipeline.settings import setting

RANGE_START = "dagster/asset_partition_range_start"
RUN_KEY_TAG = "dagster/run_key"
FAILED = (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
RANGE_END = "dagster/asset_partition_range_end"
DAY_IN_KEY = re.compile(r"(\d{4}-\d{2}-\d{2})(?:\.parquet$|/)")


def range_tags(start: dt.date, end_inclusive: dt.date) -> dict[str, str]:
    return {
        RANGE_START: start.isoformat(),
        RANGE_END: end_inclusive.isoformat(),
        MAX_RUNTIME_TAG: str(MAX_RUNTIME["extract"]),
    }


def s3_listing(url: str, client: Any = None) -> tuple[str, dt.date | None]:
    """(signature of the listing, newest day named in the keys or None) of an s3:// prefix or glob."""
    if client is None:
        import boto3

        client = boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3") or None)
    bucket, _, rest = url[5:].partition("/")
    prefix = re.split(r"[*?\[{]", rest, maxsplit=1)[0]
    digest, newest = hashlib.sha256(), None
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            digest.update(f"{obj['Key']}\t{obj['Size']}\t{obj.get('ETag', '')}\n".encode())
            match = DAY_IN_KEY.search(obj["Key"])
            if match:
                day = dt.date.fromisoformat(match.group(1))
                newest = day if newest is None or day > newest else newest
    return digest.hexdigest()[:16], newest


def source_watermark(cfg: PipelineConfig, src: DataSource, state: dict[str, Any]) -> dt.date | None:
    """The source's newest event day; for s3:// Parquet, None while the listing is unchanged."""
    from basemodel_pipeline.sources import watermark

    path = str(src.data_location.path) if src.data_location.database_type == "parquet" else ""
    if path.startswith("s3://"):
        signature, newest = s3_listing(path)
        if signature == state.get("listing"):
            return None
        state["listing"] = signature
        if newest is not None:
            return newest
    return watermark(cfg, src)


def last_extracted_day(cfg: PipelineConfig, src: DataSource) -> dt.date | None:
    days = [d for f in parquet_files(ws.extracts_dir(cfg, src.name)) if (d := day_of(f)) is not None]
    return max(days) if days else None


def run_status(instance: dg.DagsterInstance | None, run_key: str) -> dg.DagsterRunStatus | None:
    """Status of the newest run launched for `run_key` (None when there is none, or no instance)."""
    if instance is None:
        return None
    runs = instance.get_runs(filters=dg.RunsFilter(tags={RUN_KEY_TAG: run_key}), limit=1)
    return runs[0].status if runs else None


def extract_request(src: DataSource, start: dt.date, last: dt.date, attempt: int = 1) -> dg.RunRequest:
    """One run extracting the days [start, last] of `src`; retries carry the attempt in the run key."""
    key = f"{src.name}:{start.isoformat()}..{last.isoformat()}" + (f"#{attempt}" if attempt > 1 else "")
    return dg.RunRequest(
        run_key=key,
        asset_selection=[extract_key(src.name)],
        tags={**range_tags(start, last), "basemodel/trigger": "new_data"},
    )


def pending_request(
    cfg: PipelineConfig,
    src: DataSource,
    state: dict[str, Any],
    mark: dt.date | None,
    instance: dg.DagsterInstance | None,
) -> dg.RunRequest | None:
    """Follow the range requested last (state["pending"]): clear it once extracted, request it again (up to the
    watermark `mark`, new run key) when its run failed; None while it is still to run or running."""
    pending = state["pending"]
    first, last = dt.date.fromisoformat(pending["first"]), dt.date.fromisoformat(pending["last"])
    status = run_status(instance, pending["run_key"])
    if status not in FAILED:
        extracted = last_extracted_day(cfg, src)
        if status == dg.DagsterRunStatus.SUCCESS or (extracted is not None and extracted >= last):
            del state["pending"]
        return None
    last = max(last, mark) if mark is not None else last
    request = extract_request(src, first, last, pending["attempt"] + 1)
    remember(state, request, pending["attempt"] + 1)
    state["day"] = max(state.get("day") or "", last.isoformat())
    return request


def remember(state: dict[str, Any], request: dg.RunRequest, attempt: int) -> None:
    """Keep the range of `request` in the source's cursor until its run succeeded."""
    state["pending"] = {
        "first": request.tags[RANGE_START],
        "last": request.tags[RANGE_END],
        "run_key": request.run_key,
        "attempt": attempt,
    }


def new_data_requests(
    cfg: PipelineConfig,
    cursor: dict[str, dict[str, Any]],
    today: dt.date,
    instance: dg.DagsterInstance | None = None,
) -> list[dg.RunRequest]:
    """Run requests for every event source with days newer than its cursor, or whose last requested range
    failed (looked up in `instance` by run key); updates `cursor` in place."""
    requests = []
    for src in cfg.data_sources:
        if src.type != "event":
            continue
        state = cursor.setdefault(src.name, {})
        listing = state.get("listing")
        mark = source_watermark(cfg, src, state)
        mark = min(mark, today) if mark is not None else None
        if "pending" in state:
            retry = pending_request(cfg, src, state, mark, instance)
            if retry is not None:
                requests.append(retry)
            elif "pending" in state:  # still waiting: look at a changed s3 listing again next tick
                state.pop("listing", None)
                if listing is not None:
                    state["listing"] = listing
            if "pending" in state:  # still to run, running, or retried: nothing else for this source
                continue
        if mark is None:
            continue
        known = state.get("day")
        last = dt.date.fromisoformat(known) if known else last_extracted_day(cfg, src)
        state["day"] = mark.isoformat()
        if last is not None and mark <= last:  # nothing newer than what was requested or extracted
            continue
        request = extract_request(src, last if last is not None else cfg.data_params.data_start_date, mark)
        remember(state, request, 1)
        requests.append(request)
    return requests


def build_new_data_sensor(
    event_keys: list[dg.AssetKey], default_status: dg.DefaultSensorStatus
) -> dg.SensorDefinition:
    @dg.sensor(
        name="new_data_sensor",
        minimum_interval_seconds=int(setting("BASEMODEL_NEW_DATA_INTERVAL_S", "300")),
        target=dg.AssetSelection.assets(*event_keys),
        default_status=default_status,
    )
    def new_data_sensor(
        context: dg.SensorEvaluationContext, basemodel_config: BasemodelConfigResource
    ) -> dg.SensorResult | dg.SkipReason:
        """Extract the days each event source gained since the last tick (cursor = per-source watermark and
        the range requested last, retried while its run fails)."""
        if not Path(basemodel_config.config_path).is_file():
            return dg.SkipReason(f"config {basemodel_config.config_path} does not exist yet")
        cursor = json.loads(context.cursor) if context.cursor else {}
        requests = new_data_requests(
            load_config(basemodel_config.config_path), cursor, dt.date.today(), context.instance
        )
        return dg.SensorResult(run_requests=requests, cursor=json.dumps(cursor, sort_keys=True))

    return new_data_sensor
