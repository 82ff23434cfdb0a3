"""Copy a scenario's finished artifacts to s3:// (on when BASEMODEL_UPLOAD_URL is set).

Uploads, for one scenario partition, the foundation checkpoint it was trained from, the scenario
checkpoint (with metrics.json, its report) and its latest predictions, each under its workspace-relative
path (basemodel_pipeline.ops.upload). Runs after predictions, so only scenarios whose blocking checks passed
are ever uploaded; training itself never writes to object storage.
"""

from pathlib import Path

import dagster as dg

from basemodel_pipeline.defs.models.assets import foundation_model, scenario_model
from basemodel_pipeline.defs.predictions.assets import predictions
from basemodel_pipeline.defs.shared.conditions import gated_eager
from basemodel_pipeline.defs.shared.execution import latest_metadata, materialize_in_process
from basemodel_pipeline.defs.shared.partitions import scenarios_partitions
from basemodel_pipeline.defs.shared.resources import ArtifactUploader, BasemodelConfigResource
from basemodel_pipeline.defs.shared.versions import code_version
from basemodel_pipeline.errors import DataError


@dg.asset(
    deps=[predictions],
    partitions_def=scenarios_partitions,
    group_name="upload",
    kinds={"s3"},
    automation_condition=gated_eager("predictions"),
    code_version=code_version("uploaded_artifacts"),
)
def uploaded_artifacts(
    context: dg.AssetExecutionContext, basemodel_config: BasemodelConfigResource, uploader: ArtifactUploader
) -> dg.MaterializeResult:
    """Foundation checkpoint, scenario checkpoint + metrics.json and predictions of one scenario on s3://."""
    scenario = context.partition_key
    sources = {
        "foundation": latest_metadata(context.instance, foundation_model.key),
        "scenario": latest_metadata(context.instance, scenario_model.key, scenario),
        "predictions": latest_metadata(context.instance, predictions.key, scenario),
    }

    def stage() -> dict:
        workspace = Path(basemodel_config.load().workspace)
        out: dict = {"url": uploader.url}
        for name, meta in sources.items():
            if not meta or "path" not in meta:
                raise DataError(
                    f"{name} of scenario '{scenario}' has no materialization; materialize it first"
                )
            path = Path(meta["path"])
            out[name] = uploader.upload(path.parent if path.suffix == ".parquet" else path, workspace)
        return out

    return materialize_in_process(stage)
