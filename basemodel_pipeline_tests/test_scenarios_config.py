"""Scenario config validation: unknown sources and columns, task/target consistency, Python target references."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from basemodel_pipeline.config import load_config
from basemodel_pipeline.demo.datasets import DEMO_CONFIG, FULL_CONFIG
from basemodel_pipeline.errors import ConfigError
from basemodel_pipeline.sources.data_checks import check_config_against_data


def with_scenario(config: Path, scenario: dict[str, Any]) -> Path:
    raw = yaml.safe_load(config.read_text())
    raw["scenarios"] = [scenario]
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


def target(**kw: Any) -> dict[str, Any]:
    return {"source": "transactions", "horizon_days": 14, **kw}


@pytest.mark.parametrize(
    ("scenario", "message"),
    [
        (
            {"name": "x", "task": "binary", "target": target(kind="binary", source="clicks")},
            r"scenarios\[0\]\.target\.source: 'clicks' is not an event data source",
        ),
        (
            {"name": "x", "task": "multilabel", "target": target(kind="binary")},
            r"task 'multilabel' needs a target of kind 'multilabel' or 'python', got 'binary'",
        ),
        (
            {"name": "x", "task": "regression", "target": target(kind="regression", aggregation="sum")},
            r"aggregation 'sum' needs column",
        ),
        (
            {
                "name": "x",
                "task": "binary",
                "target": target(kind="binary", filter=[{"column": "a", "op": "in", "value": 1}]),
            },
            r"op 'in' needs a list value",
        ),
        (
            {"name": "x", "task": "recommendation", "target": target(kind="python", function="m:f")},
            r"recommendation needs a declarative target",
        ),
        (
            {"name": "x", "task": "multiclass", "target": target(kind="python", function="m:f")},
            r"needs target.classes",
        ),
        (
            {"name": "x", "task": "binary", "target": target(kind="python", function="not a reference")},
            r"scenarios\[0\]\.target\.function: String should match pattern",
        ),
        (
            {"name": "x", "task": "binary", "mode": "adapter", "target": target(kind="binary")},
            r"mode",
        ),
    ],
)
def test_invalid_scenarios_are_rejected(tiny_config: Path, scenario: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(with_scenario(tiny_config, scenario))


@pytest.mark.parametrize(
    ("task", "kind", "extra"),
    [
        ("binary", "binary", {}),
        ("multilabel", "multilabel", {"column": "department"}),
        ("multiclass", "multiclass", {"column": "department"}),
        ("regression", "regression", {"column": "sales_value"}),
        ("recommendation", "recommendation", {"column": "product_id"}),
        ("binary", "python", {"function": "m:f"}),
    ],
)
def test_a_typo_in_a_target_names_the_yaml_path_without_the_target_kind(
    tiny_config: Path, task: str, kind: str, extra: dict[str, Any]
) -> None:
    """The error path is the YAML path the user wrote: no pydantic discriminator tag ('regression') in it."""
    raw = yaml.safe_load(tiny_config.read_text())
    typo = {"name": "typo", "task": task, "target": target(kind=kind, colum="x", **extra)}
    raw["scenarios"] = [*raw["scenarios"][:2], typo]  # the tiny config's two, then the typo
    tiny_config.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ConfigError) as err:
        load_config(tiny_config)
    assert "scenarios[2].target.colum: unknown key 'colum'" in str(err.value)
    assert f".{kind}." not in str(err.value)


@pytest.mark.parametrize(
    ("tgt", "where", "column"),
    [
        (target(kind="multilabel", column="departmnt"), "target.column", "departmnt"),
        (target(kind="multiclass", column="colour"), "target.column", "colour"),
        (target(kind="regression", column="spend"), "target.column", "spend"),
        (target(kind="recommendation", column="sku"), "target.column", "sku"),
        (
            target(kind="binary", filter=[{"column": "dept", "value": "GROCERY"}]),
            "target.filter[0].column",
            "dept",
        ),
    ],
)
def test_unknown_target_columns_are_rejected_by_validation(
    tiny_config: Path, tgt: dict, where: str, column: str
) -> None:
    config = with_scenario(tiny_config, {"name": "x", "task": tgt["kind"], "target": tgt})
    with pytest.raises(
        ConfigError, match=rf"scenarios\[0\]\.{re.escape(where)}: column '{column}' is not in"
    ):
        check_config_against_data(load_config(config), config)


def test_known_columns_pass_validation(tiny_config: Path) -> None:
    tgt = target(
        kind="recommendation", column="product_id", filter=[{"column": "department", "value": "MEAT"}]
    )
    config = with_scenario(tiny_config, {"name": "x", "task": "recommendation", "target": tgt})
    check_config_against_data(load_config(config), config)


def test_python_target_that_cannot_be_imported_names_the_scenario(tiny_config: Path) -> None:
    from basemodel_pipeline.targets.python import load_function

    cfg = load_config(
        with_scenario(
            tiny_config,
            {"name": "mine", "task": "binary", "target": target(kind="python", function="no_such_mod:f")},
        )
    )
    with pytest.raises(
        ConfigError, match=r"scenario 'mine': target.function 'no_such_mod:f': cannot import module"
    ):
        load_function(cfg.scenario("mine"))
    cfg = load_config(
        with_scenario(
            tiny_config,
            {"name": "mine", "task": "binary", "target": target(kind="python", function="json:nope")},
        )
    )
    with pytest.raises(ConfigError, match=r"module 'json' has no function 'nope'"):
        load_function(cfg.scenario("mine"))


def test_demo_configs_parse_with_two_and_six_scenarios(tmp_path: Path) -> None:
    names = [s["name"] for s in yaml.safe_load(FULL_CONFIG)["scenarios"]]
    assert [s["name"] for s in yaml.safe_load(DEMO_CONFIG)["scenarios"]] == names[:2]
    assert len(names) == 6
    tasks = {s["task"] for s in yaml.safe_load(FULL_CONFIG)["scenarios"]}
    assert tasks == {"binary", "multilabel", "recommendation", "regression"}


def test_python_target_next_to_the_config_imports_from_any_directory(
    tiny_config: Path, tmp_path: Path
) -> None:
    """A target module beside the config works without PYTHONPATH, whatever the working directory."""
    import subprocess
    import sys

    config = with_scenario(
        tiny_config,
        {"name": "mine", "task": "binary", "target": target(kind="python", function="beside_config:f")},
    )
    (config.parent / "beside_config.py").write_text(
        "def f(history, future, attributes, ctx):\n    return 1.0\n"
    )
    code = (
        "import sys; from basemodel_pipeline.config import load_config; "
        "from basemodel_pipeline.targets.python import load_function; "
        f"print(load_function(load_config({str(config)!r}).scenario('mine')).__name__)"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=elsewhere, capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "f"


def test_a_test_window_past_the_end_of_the_data_is_rejected_before_training(tiny_config: Path) -> None:
    """training_end_date at the data's end: validate says so (and what date works), not finetune later."""
    import datetime as dt

    raw = yaml.safe_load(tiny_config.read_text())
    start = dt.date.fromisoformat(str(raw["data_params"]["data_start_date"]))
    check_config_against_data(load_config(tiny_config), tiny_config)  # the tiny dataset's own dates pass
    raw["data_params"]["training_end_date"] = (start + dt.timedelta(days=119)).isoformat()  # the last day
    tiny_config.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(
        ConfigError,
        match=r"data_params.training_end_date: scenario 'churn' \(scenarios\[0\]\) is tested on .* set "
        r"training_end_date to \d{4}-\d\d-\d\d or earlier",
    ):
        check_config_against_data(load_config(tiny_config), tiny_config)


def test_a_typo_in_a_data_location_names_the_yaml_path_without_the_database_type(tiny_config: Path) -> None:
    raw = yaml.safe_load(tiny_config.read_text())
    raw["data_sources"][1]["data_location"]["pth"] = "x"
    tiny_config.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ConfigError, match=r"data_sources\[1\]\.data_location\.pth: unknown key 'pth'"):
        load_config(tiny_config)
