"""workspace_retention: apply the config's retention policy to the workspace (basemodel_pipeline.ops.retention)."""

import dagster as dg

from basemodel_pipeline.defs.shared.execution import materialize_in_process
from basemodel_pipeline.defs.shared.resources import BasemodelConfigResource
from basemodel_pipeline.defs.shared.versions import code_version
from basemodel_pipeline.ops.retention import prune


class RetentionRunConfig(dg.Config):
    """Launchpad options of a retention run."""

    dry_run: bool = False  # only report what would be deleted


@dg.asset(group_name="maintenance", kinds={"python"}, code_version=code_version("workspace_retention"))
def workspace_retention(
    context: dg.AssetExecutionContext, config: RetentionRunConfig, basemodel_config: BasemodelConfigResource
) -> dg.MaterializeResult:
    """Old checkpoints, predictions and embeddings deleted per the config's `retention` section.

    Keeps the newest versions of each (keep_checkpoints, keep_predictions, keep_embeddings) and everything
    still in use: LATEST, versions being published, the checkpoints kept scenarios and outputs were made
    from. Metadata: deleted_<kind> / kept_<kind> counts, bytes_freed, and what was deleted.
    Runs daily (schedule `workspace_retention_daily`, BASEMODEL_RETENTION_CRON, default 05:00 UTC).
    """

    def stage() -> dict[str, object]:
        plan = prune(basemodel_config.load(), dry_run=config.dry_run)
        verb = "would delete" if config.dry_run else "deleted"
        for entry in plan.delete:
            context.log.info(f"{verb} {entry.label} ({entry.reason})")
        return {"dry_run": config.dry_run, **plan.summary(), "deleted": [e.label for e in plan.delete]}

    return materialize_in_process(stage)
