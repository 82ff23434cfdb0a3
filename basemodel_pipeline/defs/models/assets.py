"""Training assets. Both run their Pipes entrypoint through the launcher and queue on the `gpu` pool."""

import dagster as dg

from basemodel_pipeline.defs._run import run_pipes_job
from basemodel_pipeline.defs.automation import FOUNDATION, MAX_RUNTIME, MAX_RUNTIME_TAG, SCENARIO
from basemodel_pipeline.defs.launcher import Launcher
from basemodel_pipeline.defs.models.partitions import scenarios_partitions
from basemodel_pipeline.defs.resources import BasemodelConfigResource
from basemodel_pipeline.defs.versions import code_version

GPU_POOL = "gpu"
TRAIN_TAGS = {"basemodel/stage": "train", MAX_RUNTIME_TAG: str(MAX_RUNTIME["train"])}


@dg.asset(
    deps=["event_cache"],
    group_name="models",
    kinds={"pytorch"},
    pool=GPU_POOL,
    automation_condition=FOUNDATION,
    code_version=code_version("foundation_model"),
    op_tags=TRAIN_TAGS,
)
def foundation_model(
    context: dg.AssetExecutionContext, basemodel_config: BasemodelConfigResource, launcher: Launcher
) -> dg.MaterializeResult:
    """Self-supervised foundation model: from an entity's past, predict its future behaviour.

    Checkpoint (safetensors + JSON) under <workspace>/checkpoints/foundation/<version>/.
    Runs `python -m basemodel_pipeline.jobs.pretrain` through Dagster Pipes (launcher backend).
    Automation: trained once when missing, then weekly after the cache changed.
    """
    return run_pipes_job(context, launcher, "pretrain", basemodel_config.config_path)


@dg.asset(
    deps=[foundation_model, "event_cache"],
    partitions_def=scenarios_partitions,
    group_name="models",
    kinds={"pytorch"},
    pool=GPU_POOL,
    automation_condition=SCENARIO,
    code_version=code_version("scenario_model"),
    op_tags=TRAIN_TAGS,
)
def scenario_model(
    context: dg.AssetExecutionContext, basemodel_config: BasemodelConfigResource, launcher: Launcher
) -> dg.MaterializeResult:
    """One scenario (partition = scenario name) fine-tuned from the foundation checkpoint.

    Evaluated with the popularity and aggregates + LightGBM baselines on the test window; checkpoint and
    metrics.json under <workspace>/checkpoints/scenarios/<name>/<version>/.
    Runs `python -m basemodel_pipeline.jobs.finetune` through Dagster Pipes (scenario = partition key).
    Automation: a new scenario trains once; a new foundation or cache retrains every scenario once.
    """
    return run_pipes_job(context, launcher, "finetune", basemodel_config.config_path)
