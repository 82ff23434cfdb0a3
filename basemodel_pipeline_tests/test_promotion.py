"""Promotion: a new checkpoint is a candidate until its quality gates pass; a rejected one never becomes LATEST,
so `predict`, the summary and retention stay on the version before it; `basemodel promote` serves or rolls back
by hand (training/promotion.py, evaluation/gates.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from basemodel_pipeline import files as fs
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cli import app
from basemodel_pipeline.config import load_config
from basemodel_pipeline.config.gates import QualityGatesParams
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.evaluation.gates import floor_gate, loss_gates, popularity_gate, scenario_gates
from basemodel_pipeline.pipeline import (
    run_cache,
    run_extract,
    run_finetune,
    run_predict,
    run_pretrain,
    write_summary,
)
from basemodel_pipeline.training import promotion

runner = CliRunner()


def test_loss_gates() -> None:
    ok = [{"epoch": 1, "train_loss": 2.0, "val_loss": 1.5}, {"epoch": 2, "train_loss": 1.0, "val_loss": 1.2}]
    assert all(g.passed for g in loss_gates(ok))
    nan = loss_gates([{"epoch": 1, "train_loss": math.nan, "val_loss": 1.0}])
    assert [(g.name, g.passed, g.blocking) for g in nan] == [("loss_finite", False, True)]
    assert "train_loss=nan" in nan[0].detail
    flat = [
        {"epoch": 1, "train_loss": 2.0, "val_loss": 1.0},
        {"epoch": 2, "train_loss": 1.9, "val_loss": 1.1},
    ]
    finite, improving = loss_gates(flat)
    assert finite.passed and not improving.passed and not improving.blocking  # a warning only
    assert "never improved" in improving.detail
    assert not loss_gates([])[0].passed


def test_metric_direction_and_bounds() -> None:
    gates = QualityGatesParams(metric_floors={"spend_28d": 1.0, "next_basket": 0.05})
    assert floor_gate("auroc", 0.60, gates.bound("churn", "auroc")).passed  # 0.60 >= 0.55
    assert not popularity_gate("auroc", 0.60, 0.62, 0.0).passed
    spend = floor_gate("rmse", 0.9, gates.bound("spend_28d", "rmse"))  # lower is better: a ceiling
    assert spend.passed and "ceiling 1.0000" in spend.detail
    assert not floor_gate("rmse", 1.1, 1.0).passed
    assert popularity_gate("rmse", 0.9, 1.2, 0.0).passed and not popularity_gate("rmse", 0.9, 1.2, 0.5).passed
    assert gates.bound("other", "ndcg@10") is None
    assert floor_gate("ndcg@10", 0.02, None).passed
    assert not floor_gate("ndcg@10", 0.02, gates.bound("next_basket", "ndcg@10")).passed
    assert not floor_gate("auroc", math.nan, 0.0).passed  # a NaN metric is never served
    assert popularity_gate("auroc", 0.5, 0.9, None).passed  # margin null: not checked
    overridden = gates.overridden({"metric_floor": 0.7, "metric_floors": {"churn": 0.8}})
    assert overridden.metric_floor == 0.7 and overridden.metric_floors["spend_28d"] == 1.0
    verdict = scenario_gates(
        "churn", {"metric": "auroc", "test": {"model": 0.75, "popularity": 0.7}}, overridden
    )
    assert [(g.name, g.passed) for g in verdict] == [
        ("test_metric_above_floor", False),
        ("beats_popularity", True),
    ]


def test_a_root_whose_only_version_was_rejected_says_so(tmp_path: Path) -> None:
    root = tmp_path / "churn"
    version = fs.new_version()
    (root / version).mkdir(parents=True)
    gate = {"name": "beats_popularity", "passed": False, "detail": "test auroc: model 0.60, popularity 0.70"}
    fs.write_verdict(
        root, version, {"version": version, "status": "rejected", "gates": [gate], "by": "finetune"}
    )
    with pytest.raises(
        UserError, match=rf"newest version {version} was rejected .*beats_popularity: test auroc"
    ):
        fs.latest(root, "checkpoint of scenario 'churn'")


def _gates(config: Path, **gates: object) -> None:
    raw = yaml.safe_load(config.read_text())
    raw["quality_gates"] = gates
    config.write_text(yaml.safe_dump(raw, sort_keys=False))


def _model_version(predictions: dict) -> str:
    return json.loads((Path(predictions["path"]).parent / ws.PROVENANCE).read_text())["model_version"]


@pytest.mark.timeout(1800)
def test_a_retrain_its_gates_reject_leaves_latest_predictions_and_summary_alone(tiny_config: Path) -> None:
    raw = yaml.safe_load(tiny_config.read_text())
    raw["scenarios"] = [s for s in raw["scenarios"] if s["name"] == "churn"]
    tiny_config.write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = load_config(tiny_config)
    run_extract(cfg)
    run_cache(cfg)
    pretrained = run_pretrain(cfg)
    assert pretrained["promoted"] and pretrained["gates"]["checkpoint_sha256"]["ok"]
    assert ws.latest_foundation_dir(cfg).name == pretrained["version"]

    first = run_finetune(cfg, "churn")  # the tiny config's gates let any finite metric through
    assert first["promoted"] and first["serving_version"] == first["version"]
    root = ws.scenario_root(cfg, "churn")
    served = run_predict(cfg, "churn")
    assert _model_version(served) == first["version"]
    before = write_summary(cfg)["scenarios"]["churn"]

    _gates(tiny_config, metric_floor=0.999, popularity_margin=None)  # no tiny model reaches it
    result = runner.invoke(app, ["finetune", str(tiny_config), "-s", "churn"])
    assert result.exit_code == 1, result.output
    rejected = fs.versions(root)[0]
    assert rejected != first["version"]
    line = " ".join(result.stderr.split())
    assert f"churn version {rejected} failed its quality gates (test_metric_above_floor: test auroc" in line
    assert f"still serving {first['version']}" in line
    assert ws.latest_scenario_dir(cfg, "churn").name == first["version"]  # LATEST never moved
    verdict = promotion.read_verdict(root, rejected)
    assert verdict is not None and verdict.status == "rejected" and verdict.previous == first["version"]
    assert [g.name for g in verdict.failed] == ["test_metric_above_floor"]

    cfg = load_config(tiny_config)
    again = run_predict(cfg, "churn")  # what is served is still the first version
    assert _model_version(again) == first["version"]
    assert pq.read_table(again["path"]).num_rows == pq.read_table(served["path"]).num_rows
    assert write_summary(cfg)["scenarios"]["churn"] == before

    listed = runner.invoke(app, ["promote", str(tiny_config), "-s", "churn", "--list"], terminal_width=200)
    assert (
        listed.exit_code == 0 and "rejected" in listed.output and "test_metric_above_floor" in listed.output
    )

    refused = runner.invoke(app, ["promote", str(tiny_config), "-s", "churn", "--version", rejected])
    assert refused.exit_code == 2 and "--force" in " ".join(refused.stderr.split())
    assert ws.latest_scenario_dir(cfg, "churn").name == first["version"]
    forced = runner.invoke(
        app, ["promote", str(tiny_config), "-s", "churn", "--version", rejected, "--force"]
    )
    assert forced.exit_code == 0, forced.output
    assert ws.latest_scenario_dir(cfg, "churn").name == rejected
    assert promotion.read_verdict(root, rejected).by == "basemodel promote --force"

    _gates(tiny_config)  # the default gates again: a rollback runs them on the earlier version
    cfg = load_config(tiny_config)
    cfg = cfg.model_copy(
        update={"quality_gates": QualityGatesParams(metric_floor=0.0, popularity_margin=None)}
    )
    back = promotion.promote(cfg, root, first["version"])
    assert back.status == "promoted" and back.previous == rejected
    assert ws.latest_scenario_dir(cfg, "churn").name == first["version"]


def test_a_production_refit_that_cannot_score_is_not_served() -> None:
    params = QualityGatesParams(metric_floor=0.0, popularity_margin=None)
    metrics = {"metric": "auroc", "test": {"model": 0.8, "popularity": 0.7}}
    assert [g.name for g in scenario_gates("churn", metrics, params)] == [
        "test_metric_above_floor",
        "beats_popularity",
    ]
    broken = {**metrics, "refit": {"refit_on_all": True, "outputs_finite": False}}
    gate = scenario_gates("churn", broken, params)[-1]
    assert gate.name == "refit_outputs_finite" and not gate.passed and gate.blocking
    fine = {**metrics, "refit": {"refit_on_all": True, "outputs_finite": True}}
    assert all(g.passed for g in scenario_gates("churn", fine, params))
