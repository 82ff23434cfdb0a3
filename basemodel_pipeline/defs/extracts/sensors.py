"""New data: request the day partitions of event extracts that the source has and the extract lacks.

Per event source the cursor keeps the latest day already requested (the watermark). A tick asks the
source for its watermark (one max() query, `sources.watermark`) and requests one run for the days
[cursor day, watermark] (the cursor day again: it may have been partial). The run key names the source and
the day range, so a repeated tick or a lost cursor never runs the same range twice.

The requested range stays in the cursor ("pending") until its run succeeded (or the extract on disk reaches
its last day). While that run is queued or running the source gets no new request; when it failed or was
canceled, the range is requested again (extended to the current watermark) under a new run key
``<source>:<first>..<last>#<attempt>``, so a failed range is retried, one run at a time, until it succeeds.
Retries back off: after the n-th consecutive failed attempt the sensor waits base x 2^(n-1) seconds, at most
the maximum (BASEMODEL_EXTRACT_RETRY_BASE_S, default 300; BASEMODEL_EXTRACT_RETRY_MAX_S, default 21600),
counted from the failed run's end ("failed_at" in the pending range); the skip reason says when the next
attempt is. A success clears the pending range, so the next failure waits the base delay again.

Parquet sources on s3:// are first listed by prefix: while the listing (keys, sizes, ETags) is unchanged
the source is not queried at all; when day-named files (``.../2017-03-01.parquet`` or ``day=2017-03-01/``)
are found, the newest name is the watermark without reading any data.
"""

import datetime as dt
import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.config import DataSource, PipelineConfig, load_config
from basemodel_pipeline.defs.extracts.assets import extract_key
from basemodel_pipeline.defs.extracts.files import day_of, parquet_files
from basemodel_pipeline.defs.shared.conditions import MAX_RUNTIME, MAX_RUNTIME_TAG
from basemodel_pipeline.defs.shared.resources import BasemodelConfigResource
from basemodel_pipeline.settings import seconds_setting, setting

RANGE_START = "dagster/asset_partition_range_start"
RUN_KEY_TAG = "dagster/run_key"
FAILED = (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
RANGE_END = "dagster/asset_partition_range_end"
DAY_IN_KEY = re.compile(r"(\d{4}-\d{2}-\d{2})(?:\.parquet$|/)")
RETRY_BASE_ENV_VAR = "BASEMODEL_EXTRACT_RETRY_BASE_S"
RETRY_MAX_ENV_VAR = "BASEMODEL_EXTRACT_RETRY_MAX_S"


@dataclass(frozen=True)
class Backoff:
    """How long a failed range waits before its next attempt: `base_s` after the first failure, doubling
    with each consecutive failure, never more than `max_s`."""

    base_s: float = 300.0
    max_s: float = 6 * 3600.0

    @classmethod
    def from_settings(cls) -> "Backoff":
        return cls(
            seconds_setting(RETRY_BASE_ENV_VAR, cls.base_s), seconds_setting(RETRY_MAX_ENV_VAR, cls.max_s)
        )

    def delay(self, failures: int) -> float:
        """Seconds between the `failures`-th consecutive failed attempt and the next one."""
        if failures < 1:
            return 0.0
        return min(self.base_s * 2.0 ** min(failures - 1, 60), self.max_s)


def utc(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def in_words(seconds: float) -> str:
    """A wait in words: "45 s", "10 min", "2.5 h"."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


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


def run_record(instance: dg.DagsterInstance | None, run_key: str) -> dg.RunRecord | None:
    """The newest run launched for `run_key` (None when there is none, or no instance)."""
    if instance is None:
        return None
    records = instance.get_run_records(filters=dg.RunsFilter(tags={RUN_KEY_TAG: run_key}), limit=1)
    return records[0] if records else None


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
    now: float,
    backoff: Backoff,
    notes: list[str],
) -> dg.RunRequest | None:
    """Follow the range requested last (state["pending"]): clear it once extracted, request it again (up to the
    watermark `mark`, new run key) once its failed run's backoff delay has passed; None while it is still to
    run, running, or waiting (then a line in `notes` says until when)."""
    pending = state["pending"]
    first, last = dt.date.fromisoformat(pending["first"]), dt.date.fromisoformat(pending["last"])
    record = run_record(instance, pending["run_key"])
    status = record.dagster_run.status if record is not None else None
    if record is None or status not in FAILED:
        extracted = last_extracted_day(cfg, src)
        if status == dg.DagsterRunStatus.SUCCESS or (extracted is not None and extracted >= last):
            del state["pending"]
        return None
    if "failed_at" not in pending:  # the failure is new: when the run ended (never later than now)
        ended = record.end_time or record.update_timestamp.timestamp()
        pending["failed_at"] = min(ended, now)
    attempt = pending["attempt"]
    due = pending["failed_at"] + backoff.delay(attempt)
    if now < due:
        notes.append(
            f"{src.name} {pending['first']}..{pending['last']}: attempt {attempt} failed at "
            f"{utc(pending['failed_at'])}; attempt {attempt + 1} at {utc(due)} (in {in_words(due - now)})"
        )
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
    now: float | None = None,
    backoff: Backoff | None = None,
    notes: list[str] | None = None,
) -> list[dg.RunRequest]:
    """Run requests for every event source with days newer than its cursor, or whose last requested range
    failed (looked up in `instance` by run key) and has waited its backoff delay (from the settings unless
    given) by `now` (a Unix time, default: now); updates `cursor` in place, and adds to `notes` a line for
    each source whose retry waits."""
    now = time.time() if now is None else now
    backoff = Backoff.from_settings() if backoff is None else backoff
    notes = [] if notes is None else notes
    requests = []
    for src in cfg.data_sources:
        if src.type != "event":
            continue
        state = cursor.setdefault(src.name, {})
        listing = state.get("listing")
        mark = source_watermark(cfg, src, state)
        mark = min(mark, today) if mark is not None else None
        if "pending" in state:
            retry = pending_request(cfg, src, state, mark, instance, now, backoff, notes)
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
    event_keys: list[dg.AssetKey],
    default_status: dg.DefaultSensorStatus,
    clock: Callable[[], float] = time.time,
) -> dg.SensorDefinition:
    """The sensor; `clock` (Unix time) decides when a failed range's backoff delay has passed."""

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
        the range requested last, retried with a growing delay while its run fails)."""
        if not Path(basemodel_config.config_path).is_file():
            return dg.SkipReason(f"config {basemodel_config.config_path} does not exist yet")
        cursor = json.loads(context.cursor) if context.cursor else {}
        notes: list[str] = []
        cfg = load_config(basemodel_config.config_path)
        requests = new_data_requests(cfg, cursor, dt.date.today(), context.instance, clock(), notes=notes)
        if notes and requests:
            context.log.info("retries waiting: " + "; ".join(notes))
        return dg.SensorResult(
            run_requests=requests,
            cursor=json.dumps(cursor, sort_keys=True),
            skip_reason="; ".join(notes) if notes and not requests else None,
        )

    return new_data_sensor
