"""The per-entity state and the predictions are tied to the cache content they were built from: a correction
of old days (same row count) rebuilds the state, and `basemodel verify` checks the state and every
predictions output against their recorded checksums and against the current cache (stale, not corrupt)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
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
    config = Path(shutil.copy(tiny_dataset, d / "config.yaml"))
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
    """The issue's reproduction: same row count, corrected values of old days, cache rebuilt: `predict`
    used the state built from the old data; its scores must be the replayed ones."""
    before = scores(workspace)
    built_from = state_manifest(workspace).get("cache_data_version")
    correct_old_days(workspace)
    ok(["extract", str(workspace)])
    ok(["cache", str(workspace)])
    from_state = scores(workspace)
    rebuilt_from = state_manifest(workspace).get("cache_data_version")
    replayed = scores(workspace, "--replay")
    assert not np.allclose(before, replayed, atol=1e-4)  # the correction moves the scores
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
