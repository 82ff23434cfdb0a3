"""Training assets. Both run their Pipes entrypoint as a subprocess and queue on the `gpu` pool."""

import dagster as dg

from basemodel_pipeline.defs._run import run_pipes_job
from basemodel_pipeline.defs.models.partitions import scenarios_partitions
from basemodel_pipeline.defs.resources import BasemodelConfigResource

GPU_POOL = "gpu"


@dg.asset(
    deps=["event_cache"],
    group_name="models",
    kinds={"pytorch"},
    pool=GPU_POOL,
)
def foundation_model(
    context: dg.AssetExecutionContext,
    basemodel_config: BasemodelConfigResource,
    pipes_subprocess_client: dg.PipesSubprocessClient,
) -> dg.MaterializeResult:
    """Self-supervised foundation model: from an entity's past, predict its future behaviour.

    Checkpoint (safetensors + JSON) under <workspace>/checkpoints/foundation/<version>/.
    Runs `python -m basemodel_pipeline.jobs.pretrain` through Dagster Pipes.
    """
    return run_pipes_job(context, pipes_subprocess_client, "pretrain", basemodel_config.config_path)


@dg.asset(
    deps=[foundation_model],
    partitions_def=scenarios_partitions,
    group_name="models",
    kinds={"pytorch"},
    pool=GPU_POOL,
)
def scenario_model(
    context: dg.AssetExecutionContext,
    basemodel_config: BasemodelConfigResource,
    pipes_subprocess_client: dg.PipesSubprocessClient,
) -> dg.MaterializeResult:
    """One scenario (partition = scenario name) fine-tuned from the foundation checkpoint.

    Evaluated with the popularity and aggregates + LightGBM baselines on the test window; checkpoint and
    metrics.json under <workspace>/checkpoints/scenarios/<name>/<version>/.
    Runs `python -m basemodel_pipeline.jobs.finetune` through Dagster Pipes (scenario = partition key).
    """
    return run_pipes_job(context, pipes_subprocess_client, "finetune", basemodel_config.config_path)
