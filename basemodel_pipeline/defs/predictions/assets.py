"""Scores of every entity for one scenario, as of the day after the cache's last event day."""

import dagster as dg

from basemodel_pipeline.defs._run import run_pipes_job
from basemodel_pipeline.defs.models.assets import GPU_POOL, scenario_model
from basemodel_pipeline.defs.models.partitions import scenarios_partitions
from basemodel_pipeline.defs.resources import BasemodelConfigResource


@dg.asset(
    deps=[scenario_model],
    partitions_def=scenarios_partitions,
    group_name="predictions",
    kinds={"pytorch", "parquet"},
    pool=GPU_POOL,
)
def predictions(
    context: dg.AssetExecutionContext,
    basemodel_config: BasemodelConfigResource,
    pipes_subprocess_client: dg.PipesSubprocessClient,
) -> dg.MaterializeResult:
    """Scores of one scenario (partition) for every entity: <workspace>/predictions/<scenario>/<as_of>/.

    Runs `python -m basemodel_pipeline.jobs.predict` through Dagster Pipes (scenario = partition key).
    """
    return run_pipes_job(context, pipes_subprocess_client, "predict", basemodel_config.config_path)


@dg.asset(
    deps=["foundation_model"],
    group_name="predictions",
    kinds={"pytorch", "parquet", "numpy"},
    pool=GPU_POOL,
)
def entity_embeddings(
    context: dg.AssetExecutionContext,
    basemodel_config: BasemodelConfigResource,
    pipes_subprocess_client: dg.PipesSubprocessClient,
) -> dg.MaterializeResult:
    """Universal float16 behavioural embeddings of every entity from the foundation trunk, as of the day after
    the data: <workspace>/embeddings/<as_of>/ (embeddings.parquet, client_ids.npy + embeddings.npy).

    Runs `python -m basemodel_pipeline.jobs.embed` through Dagster Pipes.
    """
    return run_pipes_job(context, pipes_subprocess_client, "embed", basemodel_config.config_path)
