"""The scenario's baselines run in their own step, outside the `gpu` pool, and the model Dagster publishes is
the one `basemodel finetune` publishes alone (real Dagster instance, real Pipes subprocesses, tiny data)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import dagster as dg
import pytest
from typer.testing import CliRunner

from basemodel_pipeline.config import load_config
from basemodel_pipeline.defs import build_definitions
from basemodel_pipeline.defs.materialize import materialize_all
from basemodel_pipeline.defs.shared.execution import latest_metadata
from basemodel_pipeline.defs.shared.launcher import Launcher

pytestmark = pytest.mark.timeout(1800)
BASELINES, MODEL = dg.AssetKey("scenario_baselines"), dg.AssetKey("scenario_model")


def test_baselines_are_a_step_outside_the_gpu_pool(tiny_dataset: Path) -> None:
    defs = build_definitions(str(tiny_dataset), env="ci")
    baselines, model = defs.get_assets_def(BASELINES), defs.get_assets_def(MODEL)
    assert model.op.pool == "gpu"
    assert baselines.op.pool != "gpu"
    assert baselines.partitions_def == model.partitions_def
    assert BASELINES in defs.resolve_asset_graph().get(MODEL).parent_keys
    assert Launcher(backend="docker", gpus=1).gpus_for("baselines") == 0  # no GPU for its container
    assert Launcher(backend="docker", gpus=1).gpus_for("finetune") == 1


def _metrics(meta: dict) -> dict:
    return json.loads((Path(str(meta["path"])) / "metrics.json").read_text())


def test_dagster_scenario_equals_the_cli_finetune(tiny_config: Path) -> None:
    from basemodel_pipeline import cli
    from basemodel_pipeline import workspace as ws

    with dg.instance_for_test() as instance:
        report = materialize_all(tiny_config, instance, env="ci")
        assert {"scenario_baselines[churn]", "scenario_model[churn]"} <= set(report.step_seconds)
        assert "scenario_baselines[department_propensity]" in report.materialized
        dagster = {s: latest_metadata(instance, MODEL, s) for s in ("churn", "department_propensity")}
        assert all(meta is not None and meta["baselines_reused"] is True for meta in dagster.values())
        # progress of the multilabel LightGBM, logged by the baselines step (not by the model's)
        logs = [e for run_id in report.run_ids for e in instance.all_logs(run_id)]
        lines = [e for e in logs if e.user_message and "lightgbm_aggregates: class" in e.user_message]
        assert lines and {e.step_key for e in lines} == {"scenario_baselines"}

    cfg = load_config(tiny_config)
    shutil.rmtree(ws.root(cfg) / "staging")  # the CLI alone: every baseline fitted inline
    for scenario, meta in dagster.items():
        result = CliRunner().invoke(cli.app, ["finetune", str(tiny_config), "--scenario", scenario])
        assert result.exit_code == 0, result.output
        alone = _metrics({"path": ws.latest_scenario_dir(cfg, scenario)})
        ours = _metrics(meta)
        assert alone["baselines"]["reused"] is False and ours["baselines"]["reused"] is True
        for key in ("published", "test", "test_metrics", "best_val", "examples", "classes", "selection"):
            assert alone[key] == ours[key], (scenario, key)
