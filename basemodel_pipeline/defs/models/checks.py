"""Model checks: each checkpoint matches its recorded checksums (the library's `verify`, as `basemodel
verify` runs it); the foundation's loss is finite and improving; a scenario beats its floor and popularity.

The scenario checks are partitioned like the scenario (one result per scenario) and blocking: when one
fails, the run stops before the scenario's predictions are written and published.
"""

import math
from pathlib import Path
from typing import Any

import dagster as dg

from basemodel_pipeline.defs.models.assets import foundation_model, scenario_model
from basemodel_pipeline.defs.shared.execution import latest_metadata
from basemodel_pipeline.defs.shared.partitions import scenarios_partitions
from basemodel_pipeline.defs.shared.resources import QualityGates
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
    from basemodel_pipeline.verify import verify_checkpoint

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
    from basemodel_pipeline.verify import verify_checkpoint

    return finding_result(verify_checkpoint("scenario", scenario, Path(meta["path"])), meta["path"])


def loss_verdict(history: list[dict[str, Any]]) -> tuple[bool, dg.AssetCheckSeverity, str]:
    """(passed, severity, why) for a training history [{epoch, train_loss, val_loss}, ...]."""
    if not history:
        return False, dg.AssetCheckSeverity.ERROR, "the checkpoint records no training history"
    bad = [
        f"epoch {h.get('epoch')}: {k}={h[k]}"
        for h in history
        for k in ("train_loss", "val_loss")
        if k in h and not math.isfinite(float(h[k]))
    ]
    if bad:
        return False, dg.AssetCheckSeverity.ERROR, "non-finite loss: " + ", ".join(bad[:3])
    val = [float(h["val_loss"]) for h in history if "val_loss" in h]
    train = [float(h["train_loss"]) for h in history if "train_loss" in h]
    if len(val) >= 2 and not min(val[1:]) < val[0]:
        return False, dg.AssetCheckSeverity.WARN, f"validation loss never improved on epoch 1 ({val[0]:.4f})"
    if len(train) >= 2 and not train[-1] < train[0]:
        return (
            False,
            dg.AssetCheckSeverity.WARN,
            f"training loss did not fall ({train[0]:.4f} -> {train[-1]:.4f})",
        )
    return (
        True,
        dg.AssetCheckSeverity.ERROR,
        f"losses finite; best validation loss {min(val or [math.nan]):.4f}",
    )


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
    history = info.history
    passed, severity, why = loss_verdict(history)
    return dg.AssetCheckResult(
        passed=passed,
        severity=severity,
        description=why,
        metadata={"epochs": len(history), "history": dg.MetadataValue.json(history)},
    )


def _higher_is_better(metric: str) -> bool:
    from basemodel_pipeline.evaluation.metrics import higher_is_better

    return higher_is_better(metric)


def floor_verdict(meta: dict[str, Any], bound: float | None) -> tuple[bool, str, dict[str, Any]]:
    """The test metric against its bound: a minimum (AUROC, accuracy...) or a maximum (rmse...)."""
    metric, value = str(meta.get("metric")), float(meta["test_model"])
    if bound is None:
        return (
            math.isfinite(value),
            f"test {metric} {value:.4f}; no bound configured for it",
            {"value": value},
        )
    higher = _higher_is_better(metric)
    ok = value >= bound if higher else value <= bound
    why = f"test {metric} {value:.4f} vs {'floor' if higher else 'ceiling'} {bound:.4f}"
    return math.isfinite(value) and ok, why, {"value": value, "bound": bound}


def popularity_verdict(meta: dict[str, Any], margin: float) -> tuple[bool, str, dict[str, Any]]:
    metric = str(meta.get("metric"))
    model, popularity = float(meta["test_model"]), float(meta["test_popularity"])
    lift = model - popularity if _higher_is_better(metric) else popularity - model
    why = f"test {metric}: model {model:.4f}, popularity {popularity:.4f} (better by {lift:.4f}, > {margin:g} needed)"
    return (
        math.isfinite(model) and lift > margin,
        why,
        {"model": model, "popularity": popularity, "lift": lift},
    )


def scenario_check(name: str, description: str, verdict: Any) -> dg.AssetChecksDefinition:
    """A blocking check per scenario partition on the metrics its materialization recorded."""

    @dg.asset_check(
        asset=scenario_model,
        name=name,
        partitions_def=scenarios_partitions,
        blocking=True,
        description=description,
    )
    def _check(context: dg.AssetCheckExecutionContext, quality_gates: QualityGates) -> dg.AssetCheckResult:
        scenario = context.partition_key
        meta = latest_metadata(context.instance, scenario_model.key, scenario)
        if not meta or "test_model" not in meta or "test_popularity" not in meta:
            return dg.AssetCheckResult(
                passed=False, description=f"scenario_model[{scenario}] has no test metrics"
            )
        metric = str(meta.get("metric"))
        threshold = (
            quality_gates.bound(scenario, metric)
            if verdict is floor_verdict
            else quality_gates.popularity_margin
        )
        passed, why, values = verdict(meta, threshold)
        return dg.AssetCheckResult(
            passed=passed,
            severity=dg.AssetCheckSeverity.ERROR,
            description=why,
            metadata={"metric": metric, **values},
        )

    return _check


test_metric_above_floor = scenario_check(
    "test_metric_above_floor",
    "The scenario's test metric is within its configured bound (QualityGates.metric_floor for AUROC, "
    "metric_floors per scenario).",
    floor_verdict,
)
beats_popularity = scenario_check(
    "beats_popularity",
    "The scenario's test metric beats the popularity baseline on the same split (+ popularity_margin).",
    popularity_verdict,
)

model_checks = [
    foundation_checkpoint_sha256,
    scenario_checkpoint_sha256,
    loss_finite_and_improving,
    test_metric_above_floor,
    beats_popularity,
]
