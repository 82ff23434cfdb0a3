"""Scenario config validation: unknown sources and columns, task/target consistency, Python target references."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from basemodel_pipeline.config import load_config
from basemodel_pipeline.config.data_checks import check_config_against_data
from basemodel_pipeline.demo import DEMO_CONFIG, FULL_CONFIG
from basemodel_pipeline.errors import ConfigError


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
            r"scenarios\[0\]\.target\.python\.function: String should match pattern",
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
    from basemodel_pipeline.scenarios.python_target import load_function

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
