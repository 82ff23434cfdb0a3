"""Scores of every entity per scenario and foundation embeddings, as of the day after the cache's last day."""

import dagster as dg

from basemodel_pipeline.defs.models.assets import GPU_POOL, TRAIN_TAGS, foundation_model, scenario_model
from basemodel_pipeline.defs.shared.conditions import SCORES, gated_eager
from basemodel_pipeline.defs.shared.execution import run_entrypoint
from basemodel_pipeline.defs.shared.launcher import Launcher
from basemodel_pipeline.defs.shared.partitions import scenarios_partitions
from basemodel_pipeline.defs.shared.resources import BasemodelConfigResource
from basemodel_pipeline.defs.shared.run_config import run_config_class
from basemodel_pipeline.defs.shared.versions import code_version
from basemodel_pipeline.inference.options import EmbedOptions, ScoringOptions

SCORE_TAGS = {**TRAIN_TAGS, "basemodel/stage": "score"}


ScoringConfig = run_config_class(
    ScoringOptions,
    "ScoringConfig",
    "Run-time options of a scenario's scoring run (the launchpad's config editor; the defaults suit a nightly run): "
    "the fields of inference.options.ScoringOptions.",
)
EmbeddingsConfig = run_config_class(
    EmbedOptions,
    "EmbeddingsConfig",
    "Run-time options of an embeddings export: the fields of inference.options.EmbedOptions.",
)


@dg.asset(
    deps=[scenario_model, "event_cache"],
    partitions_def=scenarios_partitions,
    group_name="predictions",
    kinds={"pytorch", "parquet"},
    pool=GPU_POOL,
    automation_condition=SCORES,
    code_version=code_version("predictions"),
    op_tags=SCORE_TAGS,
)
def predictions(
    context: dg.AssetExecutionContext,
    config: ScoringConfig,
    basemodel_config: BasemodelConfigResource,
    launcher: Launcher,
) -> dg.MaterializeResult:
    """Scores of one scenario (partition) for every entity: <workspace>/predictions/<scenario>/<as_of>/.

    Runs `python -m basemodel_pipeline.entrypoints.predict` through Dagster Pipes (scenario = partition key), only
    after the scenario's blocking checks (test metric above its floor and above popularity) passed. As of the
    latest day the features come from the per-entity state, advanced with the days the cache gained.
    Automation: after a new model or a release of this code; a new cache through scenario_retrain_sensor (in
    the scenario's retrain run, or alone when its policy does not retrain it), once per model and cache.
    """
    return run_entrypoint(context, launcher, "predict", basemodel_config.config_path, config.to_argv())


@dg.asset(
    deps=[foundation_model, "event_cache"],
    group_name="predictions",
    kinds={"pytorch", "parquet", "numpy"},
    pool=GPU_POOL,
    automation_condition=gated_eager("foundation_model", "event_cache"),
    code_version=code_version("entity_embeddings"),
    op_tags=SCORE_TAGS,
)
def entity_embeddings(
    context: dg.AssetExecutionContext,
    config: EmbeddingsConfig,
    basemodel_config: BasemodelConfigResource,
    launcher: Launcher,
) -> dg.MaterializeResult:
    """Universal float16 behavioural embeddings of every entity from the foundation trunk, as of the day after
    the data: <workspace>/embeddings/<as_of>/ (embeddings.parquet, client_ids.npy + embeddings.npy).

    Runs `python -m basemodel_pipeline.entrypoints.embed` through Dagster Pipes.
    """
    return run_entrypoint(context, launcher, "embed", basemodel_config.config_path, config.to_argv())
