"""Rolling windows: `training_end_date: auto` and relative starts follow the data, so a retrain after new days
land trains and tests on later windows and produces a different model; fixed dates stay fixed."""

import datetime as dt
import hashlib
import json
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.config import load_config
from basemodel_pipeline.config.params import DataParams
from basemodel_pipeline.demo.synthetic import write_tiny_dataset
from basemodel_pipeline.errors import ConfigError
from basemodel_pipeline.inference.options import ScoringOptions
from basemodel_pipeline.pipeline import run_cache, run_extract, run_finetune, run_predict, run_pretrain

START = dt.date(2023, 1, 1)


def test_relative_dates_resolve_against_the_last_event_day() -> None:
    dp = DataParams(
        data_start_date=START,
        training_start_date="-20w",
        validation_start_date="-4splits",
        training_end_date="auto",
        split_interval_days=7,
    )
    assert dp.rolling
    with pytest.raises(ConfigError, match="training_end_date is 'auto'"):
        _ = dp.test_date  # nothing trains on unresolved windows
    resolved = dp.resolved(dt.date(2023, 12, 31), longest_horizon_days=28)
    assert (resolved.test_date, resolved.validation_start, resolved.first_split) == (
        dt.date(2023, 12, 3),
        dt.date(2023, 11, 5),
        dt.date(2023, 7, 16),
    )
    with pytest.raises(ConfigError, match="rolling windows resolved against the data"):
        dp.resolved(dt.date(2023, 3, 1), longest_horizon_days=28)  # not enough data for those offsets


def _weights(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_a_retrain_after_new_days_uses_later_windows_and_changes_the_model(tmp_path: Path) -> None:
    config = write_tiny_dataset(tmp_path, n_entities=60, days=200, start=START)
    text = yaml.safe_load(config.read_text())
    text["data_params"].update(training_end_date="auto", validation_start_date="-6w")
    config.write_text(yaml.safe_dump(text))
    transactions = tmp_path / "data" / "transactions.parquet"
    full = pq.read_table(transactions)
    cutoff = dt.datetime.combine(START + dt.timedelta(days=170), dt.time())
    pq.write_table(
        full.filter(pc.less(full["transaction_timestamp"], cutoff)), transactions
    )  # 170 days so far

    cfg = load_config(config)
    run_extract(cfg)
    run_cache(cfg)
    pretrained = run_pretrain(cfg)
    first = run_finetune(cfg, "churn")
    first_dir = ws.latest_scenario_dir(cfg, "churn")
    last_day = START + dt.timedelta(days=169)
    assert pretrained["windows.training_end_date"] == first["windows.training_end_date"]
    assert first["windows.training_end_date"] == (last_day - dt.timedelta(days=28)).isoformat()
    assert first["windows.validation_start_date"] == (last_day - dt.timedelta(days=28 + 42)).isoformat()

    scored = run_predict(
        cfg, "churn", ScoringOptions(as_of=last_day - dt.timedelta(days=60))
    )  # the first scoring: reference
    assert scored["drift_psi"] == 0.0 and ws.drift_reference(cfg, "churn", first["version"]).is_file()
    later = run_predict(cfg, "churn")  # two months later, same model: the population moved
    assert later["drift_reference_as_of"] == scored["as_of"] and later["drift_psi"] > 0.0

    pq.write_table(full, transactions)  # 30 new days land; the nightly refresh extracts them
    run_extract(cfg)
    run_cache(cfg)
    second = run_finetune(cfg, "churn")  # the automatic retrain: same config, same foundation
    second_dir = ws.latest_scenario_dir(cfg, "churn")
    shift = dt.date.fromisoformat(second["windows.training_end_date"]) - dt.date.fromisoformat(
        first["windows.training_end_date"]
    )
    assert shift == dt.timedelta(days=30)
    assert second["cache_data_version"] != first["cache_data_version"]
    assert second["foundation_version"] == first["foundation_version"] == pretrained["version"]
    assert _weights(second_dir) != _weights(first_dir)
    recorded = json.loads((second_dir / "model.json").read_text())
    assert (
        recorded["metrics"]["windows"]["training_end_date"] == second["windows.training_end_date"]
    )  # the checkpoint says what it trained on


def test_validate_resolves_rolling_windows_against_the_sources(tmp_path: Path) -> None:
    from basemodel_pipeline.sources.data_checks import check_config_against_data

    config = write_tiny_dataset(tmp_path, n_entities=20, days=120, start=START)
    text = yaml.safe_load(config.read_text())
    text["data_params"].update(training_end_date="auto", validation_start_date="-4w")
    config.write_text(yaml.safe_dump(text))
    check_config_against_data(load_config(config), config)  # fits: passes

    text["data_params"]["validation_start_date"] = "-12w"  # before the first training split point
    config.write_text(yaml.safe_dump(text))
    with pytest.raises(ConfigError, match=r"data_params.*last event day 2023-04-30.*validation_start_date"):
        check_config_against_data(load_config(config), config)


def test_validate_refuses_a_horizon_that_cannot_fit_its_rolling_validation_window(tmp_path: Path) -> None:
    """`auto` with a validation period shorter than a scenario's horizon passed `validate` and failed in
    `finetune` after a whole pretraining: now validate names the dates and the smallest start that works."""
    from basemodel_pipeline.sources.data_checks import check_config_against_data

    config = write_tiny_dataset(tmp_path, n_entities=20, days=120, start=START)
    text = yaml.safe_load(config.read_text())
    text["data_params"].update(training_end_date="auto", validation_start_date="-3w")  # churn: 28 days
    config.write_text(yaml.safe_dump(text))
    with pytest.raises(
        ConfigError,
        match=r"data_params.validation_start_date: scenario 'churn' \(scenarios\[0\]\): a 28-day target window "
        r"does not fit between validation_start_date \(2023-03-12\) and training_end_date \(2023-04-02\).*"
        r"last event day 2023-04-30.*-4w or earlier",
    ):
        check_config_against_data(load_config(config), config)
    text["data_params"]["validation_start_date"] = "-20d"
    config.write_text(yaml.safe_dump(text))
    with pytest.raises(ConfigError, match=r"-28d or earlier"):
        check_config_against_data(load_config(config), config)
