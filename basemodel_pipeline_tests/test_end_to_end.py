"""The whole asset graph, materialized in-process through Dagster on the tiny synthetic config."""

import json
from pathlib import Path

import dagster as dg
import pytest
from typer.testing import CliRunner

from basemodel_pipeline.config import load_config
from basemodel_pipeline.defs import build_definitions
from basemodel_pipeline.defs.materialize import RunFailed, materialize_all

pytestmark = pytest.mark.timeout(1800)


def test_whole_graph_materializes(tiny_config: Path) -> None:
    cfg = load_config(tiny_config)
    scenarios = [sc.name for sc in cfg.scenarios]
    with dg.instance_for_test() as instance:
        report = materialize_all(tiny_config, instance, env="ci")
        keys = build_definitions(str(tiny_config), env="ci").resolve_all_asset_keys()
        for key in keys:
            if key.to_user_string() == "workspace_retention":  # maintenance: its own daily schedule
                continue
            per_scenario = ("scenario_baselines", "scenario_model", "predictions")
            partitions = scenarios if key.to_user_string() in per_scenario else [None]
            for partition in partitions:
                event = instance.get_latest_materialization_event(key) if partition is None else None
                if partition is not None:
                    records = instance.fetch_materializations(
                        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1
                    ).records
                    event = records[0].event_log_entry if records else None
                assert event is not None, (key, partition)
        assert "foundation_model" in report.materialized
        assert {f"scenario_model[{s}]" for s in scenarios} <= set(report.materialized)
        assert all(seconds >= 0 for seconds in report.step_seconds.values())
        assert _unsynced(instance, tiny_config, scenarios) == []  # what the UI shows as "Unsynced": nothing

    summary = json.loads((tiny_config.parent / "reports" / "summary.json").read_text())
    assert set(summary["scenarios"]) == set(scenarios) == {"churn", "department_propensity"}
    for row in summary["scenarios"].values():
        assert {"metric", "model", "lightgbm_aggregates", "popularity"} <= set(row)


def _unsynced(instance: dg.DagsterInstance, config: Path, scenarios: list[str]) -> list[str]:
    """The materialized assets (and scenario partitions) Dagster's UI would label Unsynced, with why. Dagster
    has no public API for the stale status: its own resolver, in the tests only."""
    from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
    from dagster._core.loader import LoadingContextForTest

    defs = build_definitions(str(config), env="ci")
    graph = defs.resolve_asset_graph()
    resolver = CachingStaleStatusResolver(instance, graph, LoadingContextForTest(instance))
    found = []
    for key in defs.resolve_all_asset_keys():
        node = graph.get(key)
        partitions = scenarios if isinstance(node.partitions_def, dg.DynamicPartitionsDefinition) else [None]
        if node.partitions_def is not None and partitions == [None]:
            continue  # the day partitions of the extracts: their own data versions (test_orchestration_*)
        for partition in partitions:
            if resolver.get_status(key, partition) == StaleStatus.STALE:
                causes = [c.reason for c in resolver.get_stale_causes(key, partition)]
                found.append(f"{key.to_user_string()}[{partition}]: {causes}")
    return found


def test_failed_step_surfaces_its_message(tiny_config: Path) -> None:
    (tiny_config.parent / "data" / "transactions.parquet").unlink()
    with dg.instance_for_test() as instance, pytest.raises(RunFailed, match="transactions"):
        materialize_all(tiny_config, instance, env="ci")


def test_cli_demo_reports_a_failed_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`basemodel demo` exits non-zero with the failing step's message (the demo data is made unreadable)."""
    from basemodel_pipeline import cli
    from basemodel_pipeline.cli import workspace as cli_workspace  # where `demo` reads the config

    def broken(config: Path, instance: dg.DagsterInstance, **kwargs: object) -> None:
        raise RunFailed("extract, cache, pretrain: step extracts__transactions failed: boom")

    monkeypatch.setattr("basemodel_pipeline.defs.materialize.materialize_all", broken)
    monkeypatch.setattr(
        "basemodel_pipeline.demo.datasets.prepare_demo",
        lambda ws, full=False, dataset="completejourney": Path(ws) / "config.yaml",
    )
    monkeypatch.setattr(cli_workspace, "load_config", lambda path: None)
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    result = CliRunner().invoke(cli.app, ["demo", "--workspace", str(tmp_path / "ws")])
    assert result.exit_code == 1
    assert "boom" in result.stderr and "Traceback" not in result.stderr
    assert (tmp_path / "ws" / "dagster_home" / "dagster.yaml").exists()
