"""The per-entity state and the predictions are tied to the cache content they were built from: a correction
of old days (same row count) rebuilds the state, and `basemodel verify` checks the state and every
predictions output against their recorded checksums and against the current cache (stale, not corrupt)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from basemodel_pipeline.cli import app
from basemodel_pipeline.config import load_config

runner = CliRunner()


@pytest.fixture(scope="module")
def trained(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Extracts, cache, foundation, 'churn' and its predictions (with the state): never modified."""
    from basemodel_pipeline.pipeline import run_cache, run_extract, run_finetune, run_pretrain

    d = tmp_path_factory.mktemp("trained")
    shutil.copytree(tiny_dataset.parent / "data", d / "data")
    raw = yaml.safe_load(tiny_dataset.read_text())
    # the model as evaluated: its scores move with the corrected old sales values (the refitted trees on these
    # 60 entities happen not to read them, which would leave nothing for the correction to move)
    raw["training_params"]["finetune"]["refit_on_all"] = False
    config = d / "config.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = load_config(config)
    run_extract(cfg)
    run_cache(cfg)
    run_pretrain(cfg)
    run_finetune(cfg, "churn")
    ok(["predict", str(config), "-s", "churn"])
    return config


@pytest.fixture
def workspace(trained: Path, tmp_path: Path) -> Path:
    shutil.copytree(trained.parent, tmp_path / "ws", symlinks=True)
    return tmp_path / "ws" / "config.yaml"


def ok(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (args, result.output, result.exception)
    return result.output


def scores(config: Path, *extra: str) -> np.ndarray:
    ok(["predict", str(config), "-s", "churn", *extra])
    [table] = sorted((config.parent / "predictions" / "churn").glob("*/predictions.parquet"))
    return pq.read_table(table).sort_by("entity_id").column("score").to_numpy()


def correct_old_days(config: Path, days: int = 40) -> None:
    """Change the sales values of the first `days` days of the source in place: the same rows, new values."""
    data = config.parent / "data" / "transactions.parquet"
    table = pq.read_table(data)
    ts = table.column("transaction_timestamp")
    old = pc.less(ts, pc.add(pc.min(ts), pa.scalar(days * 86400 * 10**6, pa.duration("us"))))
    value = table.column("sales_value")
    corrected = pc.if_else(old, pc.multiply(value, pa.scalar(25.0, value.type)), value)
    table = table.set_column(table.schema.get_field_index("sales_value"), "sales_value", corrected)
    pq.write_table(table, data)


def state_manifest(config: Path) -> dict:
    [manifest] = (config.parent / "state").glob("*/manifest.json")
    return json.loads(manifest.read_text())


def test_a_correction_of_old_days_rebuilds_the_state(workspace: Path) -> None:
    """Same row count, corrected values of old days, cache rebuilt: `predict` once used the state built from
    the old data; its scores must be the replayed ones."""
    before = scores(workspace)
    built_from = state_manifest(workspace).get("cache_data_version")
    correct_old_days(workspace)
    ok(["extract", str(workspace)])
    ok(["cache", str(workspace)])
    from_state = scores(workspace)
    rebuilt_from = state_manifest(workspace).get("cache_data_version")
    replayed = scores(workspace, "--replay")
    # the correction moves the scores by more than the tolerance that then tells a stale state from a fresh one
    # (a tiny model's scores can all sit within 1e-3 of each other)
    assert not np.allclose(before, replayed, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(from_state, replayed, rtol=1e-5, atol=1e-6)
    assert rebuilt_from is not None and rebuilt_from != built_from


def add_later_days(config: Path, shift_days: int = 3) -> None:
    """Copy the last week's rows `shift_days` after the data's end: new days, old ones untouched."""
    data = config.parent / "data" / "transactions.parquet"
    table = pq.read_table(data)
    ts = table.column("transaction_timestamp")
    week = pa.scalar(7 * 86400 * 10**6, pa.duration("us"))
    last = table.filter(pc.greater(ts, pc.subtract(pc.max(ts), week)))
    shift = pa.scalar(shift_days * 86400 * 10**6 + 7 * 86400 * 10**6, pa.duration("us"))
    moved = last.set_column(
        last.schema.get_field_index("transaction_timestamp"),
        "transaction_timestamp",
        pc.add(last.column("transaction_timestamp"), shift),
    )
    pq.write_table(pa.concat_tables([table, moved]), data)


def test_new_days_advance_the_state_to_the_replayed_scores(workspace: Path) -> None:
    """Days appended after the state's date leave its history as it was: advanced, not rebuilt."""
    add_later_days(workspace)
    ok(["extract", str(workspace)])
    assert "append" in ok(["cache", str(workspace)]).lower()
    shutil.rmtree(workspace.parent / "predictions")
    from_state = scores(workspace)
    assert state_manifest(workspace)["updates"] == 1  # advanced from the stored state
    np.testing.assert_allclose(from_state, scores(workspace, "--replay"), rtol=1e-3, atol=1e-4)


def verify(config: Path) -> tuple[int, list[str]]:
    result = runner.invoke(app, ["verify", str(config)])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, [line for line in result.stdout.splitlines() if line.strip()]


def lines_of(lines: list[str], kind: str) -> list[str]:
    return [line for line in lines if line.split()[1] == kind]


def flip_byte_keeping_time(path: Path) -> None:
    """One byte changed in place, the modification time restored: only a full hash finds it."""
    st = path.stat()
    with open(path, "r+b") as fh:
        fh.seek(st.st_size - 1)
        byte = fh.read(1)
        fh.seek(st.st_size - 1)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_verify_covers_the_state_and_the_predictions(workspace: Path) -> None:
    code, lines = verify(workspace)
    assert code == 0, lines
    [state] = lines_of(lines, "state")
    [predictions] = lines_of(lines, "predictions")
    assert state.startswith("ok") and "sha256" in state, state
    assert predictions.startswith("ok") and "churn" in predictions and "sha256" in predictions, predictions
    manifest = json.loads(
        next((workspace.parent / "predictions" / "churn").glob("*/manifest.json")).read_text()
    )
    assert set(manifest["files"]) >= {"predictions.parquet", "provenance.json"}
    assert manifest["built_from"]["cache_data_version"] and manifest["built_from"]["model_version"]


def test_a_tampered_state_array_fails_verify_naming_it(workspace: Path) -> None:
    [features] = (workspace.parent / "state").glob("*/features.npy")
    flip_byte_keeping_time(features)
    code, lines = verify(workspace)
    bad = [line for line in lines if line.startswith("FAILED")]
    assert code == 1 and len(bad) == 1, lines
    assert bad[0].split()[1] == "state" and "features.npy" in bad[0] and "basemodel predict" in bad[0], bad


def test_a_state_array_changed_with_its_time_is_rebuilt_by_predict(workspace: Path) -> None:
    [features] = (workspace.parent / "state").glob("*/features.npy")
    before = scores(workspace)
    with open(features, "r+b") as fh:  # an edit that moves the time: predict's own check finds it
        fh.seek(features.stat().st_size - 2)
        fh.write(b"\x00\x7c")  # +inf in float16
    result = runner.invoke(app, ["predict", str(workspace), "-s", "churn"])
    assert result.exit_code == 0, result.output
    assert "features.npy" in " ".join(result.stderr.split()) and "rebuilding" in result.stderr
    np.testing.assert_array_equal(scores(workspace), before)
    assert verify(workspace)[0] == 0


def test_a_tampered_predictions_file_fails_verify_naming_it(workspace: Path) -> None:
    [table] = (workspace.parent / "predictions" / "churn").glob("*/predictions.parquet")
    flip_byte_keeping_time(table)
    code, lines = verify(workspace)
    bad = [line for line in lines if line.startswith("FAILED")]
    assert code == 1 and len(bad) == 1, lines
    assert bad[0].split()[1] == "predictions" and "predictions.parquet" in bad[0], bad
    assert "basemodel predict" in bad[0], bad


def test_state_and_predictions_built_from_an_older_cache_are_stale_not_corrupt(workspace: Path) -> None:
    correct_old_days(workspace)
    ok(["extract", str(workspace)])
    ok(["cache", str(workspace)])
    code, lines = verify(workspace)
    assert code == 0, lines  # nothing is damaged
    [state] = lines_of(lines, "state")
    [predictions] = lines_of(lines, "predictions")
    for line in (state, predictions):
        assert line.startswith("stale") and "cache" in line and "FAILED" not in line, line
    assert "basemodel predict" in state and "basemodel predict" in predictions
    scores(workspace)  # rebuilds the state and rewrites the table
    code, lines = verify(workspace)
    assert code == 0 and not [line for line in lines if line.startswith("stale")], lines


def test_dagster_checks_call_the_library_verification(workspace: Path) -> None:
    """checkpoint_sha256 (foundation, scenario) and output_sha256 (predictions) report what `basemodel
    verify` reports, from the paths the materializations recorded."""
    import dagster as dg

    from basemodel_pipeline import workspace as ws
    from basemodel_pipeline.defs import build_definitions
    from basemodel_pipeline.defs.models.assets import foundation_model, scenario_model
    from basemodel_pipeline.defs.models.checks import (
        foundation_checkpoint_sha256,
        scenario_checkpoint_sha256,
    )
    from basemodel_pipeline.defs.predictions.assets import predictions
    from basemodel_pipeline.defs.predictions.checks import predictions_output_sha256
    from basemodel_pipeline.workspace import cache_dir

    cfg = load_config(workspace)
    [table] = (workspace.parent / "predictions" / "churn").glob("*/predictions.parquet")
    paths = {
        ("event_cache", None): {"path": str(cache_dir(cfg).resolve())},
        ("foundation_model", None): {"path": str(ws.latest_foundation_dir(cfg))},
        ("scenario_model", "churn"): {"path": str(ws.latest_scenario_dir(cfg, "churn"))},
        ("predictions", "churn"): {"path": str(table), "as_of": table.parent.name},
    }

    from basemodel_pipeline.defs.shared.partitions import scenarios_partitions

    def run_checks(instance: dg.DagsterInstance) -> dict[str, dg.AssetCheckEvaluation]:
        checks = [foundation_checkpoint_sha256, scenario_checkpoint_sha256, predictions_output_sha256]
        jobs = [
            dg.define_asset_job("whole", dg.AssetSelection.checks(foundation_checkpoint_sha256)),
            dg.define_asset_job(
                "per_scenario",
                dg.AssetSelection.checks(scenario_checkpoint_sha256, predictions_output_sha256),
                partitions_def=scenarios_partitions,
            ),
        ]
        defs = dg.Definitions(
            assets=[foundation_model, scenario_model, predictions],
            asset_checks=checks,
            jobs=jobs,
            resources=build_definitions(str(workspace), env="ci").resources,
        )
        results = {}
        for job, partition in (("whole", None), ("per_scenario", "churn")):
            result = defs.resolve_job_def(job).execute_in_process(
                instance=instance,
                tags={"dagster/partition": partition} if partition else None,
                raise_on_error=False,
            )
            for e in result.get_asset_check_evaluations():
                results[e.asset_key.to_user_string()] = e
        return results

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("scenarios", ["churn"])
        for (key, partition), metadata in paths.items():
            instance.report_runless_asset_event(
                dg.AssetMaterialization(asset_key=key, partition=partition, metadata=metadata)
            )
        found = run_checks(instance)
        assert set(found) == {"foundation_model", "scenario_model", "predictions"}
        assert all(e.passed for e in found.values()), {k: e.description for k, e in found.items()}

        flip_byte_keeping_time(table)
        flip_byte_keeping_time(ws.latest_scenario_dir(cfg, "churn") / "model.safetensors")
        found = run_checks(instance)
        assert found["foundation_model"].passed
        assert (
            not found["scenario_model"].passed and "model.safetensors" in found["scenario_model"].description
        )
        assert not found["predictions"].passed and "predictions.parquet" in found["predictions"].description
