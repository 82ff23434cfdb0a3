"""Training assets, each a Pipes entrypoint run through the launcher. The foundation and the scenario models
queue on the `gpu` pool; a scenario's baselines (LightGBM, popularity: CPUs only) run before its model in
their own step, on the `cpu` pool, so that they never hold the GPU slot."""

import dagster as dg

from basemodel_pipeline.defs.shared.conditions import (
    FOUNDATION,
    MAX_RUNTIME,
    MAX_RUNTIME_TAG,
    SCENARIO,
    SCENARIO_MODEL,
)
from basemodel_pipeline.defs.shared.execution import run_entrypoint
from basemodel_pipeline.defs.shared.launcher import Launcher
from basemodel_pipeline.defs.shared.partitions import scenarios_partitions
from basemodel_pipeline.defs.shared.resources import BasemodelConfigResource, QualityGates
from basemodel_pipeline.defs.shared.versions import code_version

GPU_POOL = "gpu"
CPU_POOL = (
    "cpu"  # CPU-heavy steps without a GPU (deploy: one at a time; `dagster instance concurrency set cpu N`)
)
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

    Checkpoint (safetensors + JSON) under <workspace>/checkpoints/foundation/<version>/, served (LATEST) only
    when its checksums verify and its losses are finite (metadata `promoted`, `gates.*`).
    Runs `python -m basemodel_pipeline.entrypoints.pretrain` through Dagster Pipes (launcher backend).
    Automation: trained once when missing, then weekly after the cache changed.
    """
    return run_entrypoint(context, launcher, "pretrain", basemodel_config.config_path)


@dg.asset(
    deps=[foundation_model, "event_cache"],
    partitions_def=scenarios_partitions,
    group_name="models",
    kinds={"lightgbm"},
    pool=CPU_POOL,
    automation_condition=SCENARIO,
    code_version=code_version("scenario_baselines"),
    op_tags=TRAIN_TAGS,
)
def scenario_baselines(
    context: dg.AssetExecutionContext, basemodel_config: BasemodelConfigResource, launcher: Launcher
) -> dg.MaterializeResult:
    """A scenario's baselines (partition = scenario name): LightGBM on the automatic aggregates and popularity
    (repeat purchases for recommendation), fitted on CPUs with a progress line per LightGBM class.

    Staged under <workspace>/staging/baselines/<name>/<key>/ (key = data version: cache, feature encoder,
    scenario config, windows, seed, code); scenario_model reads them instead of fitting them on the GPU slot.
    Runs `python -m basemodel_pipeline.entrypoints.baselines` through Dagster Pipes, without a GPU.
    Automation: like scenario_model, in the same run, before it.
    """
    return run_entrypoint(context, launcher, "baselines", basemodel_config.config_path)


@dg.asset(
    deps=[foundation_model, "event_cache", scenario_baselines],
    partitions_def=scenarios_partitions,
    group_name="models",
    kinds={"pytorch"},
    pool=GPU_POOL,
    automation_condition=SCENARIO_MODEL,
    code_version=code_version("scenario_model"),
    op_tags=TRAIN_TAGS,
)
def scenario_model(
    context: dg.AssetExecutionContext,
    basemodel_config: BasemodelConfigResource,
    launcher: Launcher,
    quality_gates: QualityGates,
) -> dg.MaterializeResult:
    """One scenario (partition = scenario name) fine-tuned from the foundation checkpoint.

    Evaluated with the popularity and aggregates + LightGBM baselines on the test window (read from
    scenario_baselines' stage when it matches, `baselines_reused`); checkpoint and metrics.json under
    <workspace>/checkpoints/scenarios/<name>/<version>/. The version is served (LATEST) only when its quality
    gates pass (metadata `promoted`, `serving_version`, `gates.*`); a rejected one stays on disk.
    Runs `python -m basemodel_pipeline.entrypoints.finetune` through Dagster Pipes (scenario = partition key).
    Automation: a new scenario trains once; a new foundation or cache retrains every scenario once.
    """
    return run_entrypoint(context, launcher, "finetune", basemodel_config.config_path, quality_gates.args())
