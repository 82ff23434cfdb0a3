"""The nightly schedule and the jobs it and the UI launch."""

import datetime as dt
from pathlib import Path

import dagster as dg

from basemodel_pipeline.config import load_config
from basemodel_pipeline.defs.extracts.sensors import last_extracted_day, range_tags
from basemodel_pipeline.defs.shared.conditions import MAX_RUNTIME, MAX_RUNTIME_TAG, NIGHTLY_CRON, TIMEZONE
from basemodel_pipeline.defs.shared.resources import BasemodelConfigResource


def build_jobs(extract_keys: list[dg.AssetKey]) -> list:
    """refresh: extracts + cache; refresh_and_train: + foundation and embeddings (the demo's first run)."""
    tags = {MAX_RUNTIME_TAG: str(MAX_RUNTIME["train"])}
    refresh = dg.AssetSelection.assets(*extract_keys, "event_cache")
    return [
        dg.define_asset_job("refresh", selection=refresh, tags=tags, description="Extracts and the cache."),
        dg.define_asset_job(
            "refresh_and_train",
            selection=refresh | dg.AssetSelection.assets("foundation_model", "entity_embeddings"),
            tags=tags,
            description="Extracts, cache, foundation model and embeddings (scenarios follow by automation).",
        ),
    ]


def nightly_range(config_path: str, today: dt.date) -> tuple[dt.date, dt.date] | None:
    """Days to extract tonight: from the newest extracted day (re-read: it may have been partial) to the
    newest day the sources have (their watermark, at most today); None when no event source has a day after
    its newest extracted day."""
    from basemodel_pipeline.sources import watermark

    cfg = load_config(config_path)
    starts, ends = [], []
    for src in cfg.sources("event"):
        last = last_extracted_day(cfg, src)
        mark = watermark(cfg, src)
        starts.append(last or cfg.data_params.data_start_date)
        if mark is not None and (last is None or min(mark, today) > last):
            ends.append(min(mark, today))
    if not ends:
        return None
    return min(starts), max(ends)


def build_nightly_schedule(default_status: dg.DefaultScheduleStatus) -> dg.ScheduleDefinition:
    @dg.schedule(
        name="nightly_refresh",
        cron_schedule=NIGHTLY_CRON,
        execution_timezone=TIMEZONE,
        job_name="refresh",
        default_status=default_status,
    )
    def nightly_refresh(
        context: dg.ScheduleEvaluationContext, basemodel_config: BasemodelConfigResource
    ) -> dg.RunRequest | dg.SkipReason:
        """Each night: extract the new days (up to the sources' newest day) and attribute tables, update the
        cache; skipped when the sources have no new day. The automation sensor then retrains the scenarios
        on the new cache and rewrites their predictions."""
        if not Path(basemodel_config.config_path).is_file():
            return dg.SkipReason(f"config {basemodel_config.config_path} does not exist yet")
        tick = context.scheduled_execution_time or dt.datetime.now(dt.UTC)
        days = nightly_range(basemodel_config.config_path, tick.date())
        if days is None:
            return dg.SkipReason("no new event day in any source since the newest extracted day")
        start, end = days
        return dg.RunRequest(
            run_key=f"nightly-{tick.date().isoformat()}",
            tags={**range_tags(start, end), "basemodel/trigger": "nightly"},
        )

    return nightly_refresh
