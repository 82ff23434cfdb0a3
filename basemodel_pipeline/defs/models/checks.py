"""Model checks: each checkpoint matches its recorded checksums (the library's `verify`, as `basemodel
verify` runs it); the foundation's loss is finite and improving; a scenario beats its floor and popularity.

The training steps run the same quality gates themselves (training/promotion.py) and promote a version
(LATEST) only when every blocking gate passed; these checks show those verdicts in the UI. The scenario checks
are partitioned like the scenario (one result per scenario) and blocking: when one fails, the run stops before
the scenario's predictions are written and uploaded, and the rejected version was never made current.
"""

from pathlib import Path
from typing import Any

import dagster as dg

from basemodel_pipeline.defs.models.assets import foundation_model, scenario_model
from basemodel_pipeline.defs.shared.execution import latest_metadata
from basemodel_pipeline.defs.shared.partitions import scenarios_partitions
from basemodel_pipeline.errors import UserError

# the library's verification (torch, DuckDB) is imported when a check runs, not when definitions load


def finding_result(finding: Any, path: str) -> dg.AssetCheckResult:
    """A check result from a `basemodel verify` finding (verify.Finding)."""
    return dg.AssetCheckResult(
        passed=finding.status == "ok",
        severity=dg.AssetCheckSeverity.ERROR,
        description=f"{finding.label}: {finding.status}: {finding.detail}",
        metadata={"status": finding.status, "path": dg.MetadataValue.path(path)},
    )


@dg.asset_check(
    asset=foundation_model,
    name="checkpoint_sha256",
    blocking=True,
    description="The checkpoint's files match their manifest (size and sha256), model.json fits the weights "
    "(the same verification as `basemodel verify`); blocks the scenarios.",
)
def foundation_checkpoint_sha256(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    meta = latest_metadata(context.instance, foundation_model.key)
    if not meta or "path" not in meta:
        return dg.AssetCheckResult(passed=False, description="foundation_model has no materialization yet")
    from basemodel_pipeline.ops.verify import verify_checkpoint

    return finding_result(verify_checkpoint("foundation", "foundation", Path(meta["path"])), meta["path"])


@dg.asset_check(
    asset=scenario_model,
    name="checkpoint_sha256",
    partitions_def=scenarios_partitions,
    blocking=True,
    description="The scenario checkpoint's files match their manifest (size and sha256) and model.json fits "
    "the weights (the same verification as `basemodel verify`); blocks its predictions.",
)
def scenario_checkpoint_sha256(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    scenario = context.partition_key
    meta = latest_metadata(context.instance, scenario_model.key, scenario)
    if not meta or "path" not in meta:
        return dg.AssetCheckResult(
            passed=False, description=f"scenario_model[{scenario}] has no materialization"
        )
    from basemodel_pipeline.ops.verify import verify_checkpoint

    return finding_result(verify_checkpoint("scenario", scenario, Path(meta["path"])), meta["path"])


@dg.asset_check(
    asset=foundation_model,
    blocking=True,
    description="Every epoch's train and validation loss is finite (blocks scenarios) and they improve (warns).",
)
def loss_finite_and_improving(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    meta = latest_metadata(context.instance, foundation_model.key)
    if not meta or "path" not in meta:
        return dg.AssetCheckResult(passed=False, description="foundation_model has no materialization yet")
    from basemodel_pipeline.model import checkpoint as ckpt

    try:
        info = ckpt.read_meta(Path(meta["path"]))  # verified against its manifest first
    except UserError as exc:
        return dg.AssetCheckResult(passed=False, description=str(exc))
    from basemodel_pipeline.evaluation.gates import loss_gates

    history = info.history
    gates = loss_gates(history)
    failed = [g for g in gates if not g.passed]
    first = failed[0] if failed else gates[0]
    return dg.AssetCheckResult(
        passed=not failed,
        severity=dg.AssetCheckSeverity.ERROR if first.blocking else dg.AssetCheckSeverity.WARN,
        description=first.detail,
        metadata={"epochs": len(history), "history": dg.MetadataValue.json(history)},
    )


def verdict_result(
    meta: dict[str, Any] | None, gate: str, what: str, required: bool = True
) -> dg.AssetCheckResult:
    """A check result from the verdict the training step recorded for one of its gates (metadata
    `gates.<name>.ok` / `.detail`, written by training/promotion.py before it promoted or rejected). A gate
    that is not `required` may be absent (it did not apply to that run)."""
    if meta and not required and f"gates.{gate}.ok" not in meta:
        return dg.AssetCheckResult(passed=True, description=f"{gate}: does not apply to this version")
    if not meta or f"gates.{gate}.ok" not in meta:
        return dg.AssetCheckResult(passed=False, description=f"{what} has no verdict for {gate}: re-run it")
    promoted = bool(meta.get("promoted"))
    return dg.AssetCheckResult(
        passed=bool(meta[f"gates.{gate}.ok"]),
        severity=dg.AssetCheckSeverity.ERROR,
        description=str(meta.get(f"gates.{gate}.detail", "")),
        metadata={
            "version": str(meta.get("version", "")),
            "promoted": promoted,
            "serving_version": str(meta.get("serving_version") or ""),
        },
    )


def scenario_check(name: str, description: str, required: bool = True) -> dg.AssetChecksDefinition:
    """A blocking check per scenario partition: the verdict of one of its quality gates (evaluation/gates.py),
    decided by the fine-tuning step before it promoted or rejected the version."""

    @dg.asset_check(
        asset=scenario_model,
        name=name,
        partitions_def=scenarios_partitions,
        blocking=True,
        description=description,
    )
    def _check(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        scenario = context.partition_key
        meta = latest_metadata(context.instance, scenario_model.key, scenario)
        return verdict_result(meta, name, f"scenario_model[{scenario}]", required)

    return _check


test_metric_above_floor = scenario_check(
    "test_metric_above_floor",
    "The scenario's test metric is within its bound (quality_gates.metric_floor for AUROC-type metrics, "
    "metric_floors per scenario); a version that fails it is not promoted (LATEST stays).",
)
beats_popularity = scenario_check(
    "beats_popularity",
    "The scenario's test metric beats the popularity baseline on the same split (+ "
    "quality_gates.popularity_margin); a version that fails it is not promoted (LATEST stays).",
)
refit_outputs_finite = scenario_check(
    "refit_outputs_finite",
    "After the production refit (finetune.refit_on_all), the model that is served scores every test row with "
    "finite outputs; a version that fails it is not promoted (LATEST stays).",
    required=False,
)

model_checks = [
    foundation_checkpoint_sha256,
    scenario_checkpoint_sha256,
    loss_finite_and_improving,
    test_metric_above_floor,
    beats_popularity,
    refit_outputs_finite,
]
