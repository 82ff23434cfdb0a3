"""Scenario partitions come from the config, not from a sensor: `basemodel sync-partitions CONFIG` registers
them in the instance of $DAGSTER_HOME (and drops a scenario that left the config), so a run launched from the
UI finds its partition while automation is stopped."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import yaml
from typer.testing import CliRunner

from basemodel_pipeline.cli import app
from basemodel_pipeline.defs.shared.partitions import scenarios_partitions


def test_sync_partitions_registers_the_configs_scenarios_without_any_sensor(
    tiny_config: Path, tmp_path: Path, monkeypatch
) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    wanted = [sc["name"] for sc in yaml.safe_load(tiny_config.read_text())["scenarios"]]

    result = CliRunner().invoke(app, ["sync-partitions", str(tiny_config)])
    assert result.exit_code == 0, result.output
    with dg.DagsterInstance.get() as instance:
        assert instance.get_dynamic_partitions(scenarios_partitions.name) == wanted
        instance.add_dynamic_partitions(scenarios_partitions.name, ["retired"])  # left the config

    result = CliRunner().invoke(app, ["sync-partitions", str(tiny_config)])
    assert result.exit_code == 0 and "removed retired" in result.output
    with dg.DagsterInstance.get() as instance:
        assert instance.get_dynamic_partitions(scenarios_partitions.name) == wanted
