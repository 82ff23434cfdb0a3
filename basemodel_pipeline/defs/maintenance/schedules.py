"""The daily retention job and schedule (BASEMODEL_RETENTION_CRON, default 05:00 UTC: after the nightly
refresh at 02:00 and the weekly foundation at 03:00 have started, never in the middle of a LATEST switch)."""

from pathlib import Path

import dagster as dg

from basemodel_pipeline.defs.shared.conditions import TIMEZONE
from basemodel_pipeline.defs.shared.resources import BasemodelConfigResource
from basemodel_pipeline.settings import setting

RETENTION_CRON_ENV_VAR = "BASEMODEL_RETENTION_CRON"
DEFAULT_RETENTION_CRON = "0 5 * * *"


prune_workspace = dg.define_asset_job(
    "prune_workspace",
    selection=dg.AssetSelection.assets("workspace_retention"),
    description="Delete checkpoints, predictions and embeddings beyond the retention policy.",
)


def build_retention_schedule(default_status: dg.DefaultScheduleStatus) -> dg.ScheduleDefinition:
    @dg.schedule(
        name="workspace_retention_daily",
        cron_schedule=setting(RETENTION_CRON_ENV_VAR, DEFAULT_RETENTION_CRON),
        execution_timezone=TIMEZONE,
        job=prune_workspace,
        default_status=default_status,
    )
    def workspace_retention_daily(
        context: dg.ScheduleEvaluationContext, basemodel_config: BasemodelConfigResource
    ) -> dg.RunRequest | dg.SkipReason:
        """Each day: apply the retention policy of the config to the workspace (one run per day)."""
        if not Path(basemodel_config.config_path).is_file():
            return dg.SkipReason(f"config {basemodel_config.config_path} does not exist yet")
        tick = context.scheduled_execution_time
        day = tick.date().isoformat() if tick else "manual"
        return dg.RunRequest(run_key=f"retention-{day}", tags={"basemodel/trigger": "retention"})

    return workspace_retention_daily
