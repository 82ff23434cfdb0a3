"""The Dagster definitions load, with the expected assets, groups, kinds, partitions, pools and resources."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from basemodel_pipeline.defs import build_definitions
from basemodel_pipeline.defs.shared.launcher import Launcher
from basemodel_pipeline.defs.shared.resources import (
    BasemodelConfigResource,
    QualityGates,
    current_env,
    resources_for,
)
from basemodel_pipeline.errors import ConfigError

EXPECTED = {
    "extracts/transactions": ("extracts", {"duckdb", "parquet"}),
    "extracts/products": ("extracts", {"duckdb", "parquet"}),
    "extracts/demographics": ("extracts", {"duckdb", "parquet"}),
    "event_cache": ("cache", {"duckdb", "parquet"}),
    "foundation_model": ("models", {"pytorch"}),
    "scenario_baselines": ("models", {"lightgbm"}),
    "scenario_model": ("models", {"pytorch"}),
    "predictions": ("predictions", {"pytorch", "parquet"}),
    "metrics_summary": ("reports", {"json"}),
    "entity_embeddings": ("predictions", {"pytorch", "parquet", "numpy"}),
    "workspace_retention": ("maintenance", {"python"}),
}
# run by their own schedule (workspace_retention_daily), not by declarative automation
SCHEDULED = {"workspace_retention"}
# freshness checks warn about stale outputs (and alert); they never block
NON_BLOCKING_CHECKS = {("predictions", "freshness_check"), ("entity_embeddings", "freshness_check")}


def _graph(defs: dg.Definitions) -> dict[str, dg.AssetsDefinition]:
    return {key.to_user_string(): defs.get_assets_def(key) for key in defs.resolve_all_asset_keys()}


def test_module_loads_without_a_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Locally (BASEMODEL_ENV unset or local) a fresh checkout shows the demo config's graph."""
    monkeypatch.setenv("BASEMODEL_CONFIG", str(tmp_path / "missing.yaml"))
    monkeypatch.delenv("BASEMODEL_ENV", raising=False)
    monkeypatch.delenv("DAGSTER_CLOUD_DEPLOYMENT_NAME", raising=False)
    defs = build_definitions()
    defs.validate_loadable(defs)
    assert set(_graph(defs)) == set(EXPECTED)  # shape of the demo config


@pytest.mark.parametrize("env", ["ci", "prod"])
def test_outside_local_a_missing_config_fails_loudly(
    env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A misconfigured deployment shows one line saying what to fix, never the demo graph."""
    monkeypatch.setenv("BASEMODEL_ENV", env)
    monkeypatch.setenv("BASEMODEL_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(
        ConfigError, match=rf"missing.yaml: config file not found.*BASEMODEL_ENV={env}"
    ) as err:
        build_definitions()
    assert "\n" not in str(err.value)
    monkeypatch.delenv("BASEMODEL_CONFIG")
    with pytest.raises(ConfigError, match=rf"BASEMODEL_CONFIG is not set.*BASEMODEL_ENV={env}") as err:
        build_definitions()
    assert "\n" not in str(err.value)


def test_a_dagster_plus_deployment_is_production_unless_told_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BASEMODEL_ENV", raising=False)
    monkeypatch.setenv("DAGSTER_CLOUD_DEPLOYMENT_NAME", "prod")
    monkeypatch.setenv("BASEMODEL_CONFIG", str(tmp_path / "missing.yaml"))
    assert current_env() == "prod"
    with pytest.raises(ConfigError, match="config file not found"):
        build_definitions()
    monkeypatch.setenv(
        "BASEMODEL_ENV", "local"
    )  # a developer's branch deployment may opt in to the demo graph
    assert set(_graph(build_definitions())) == set(EXPECTED)


@pytest.mark.parametrize("env", ["local", "prod"])
def test_an_invalid_config_fails_loudly_everywhere(
    env: str, tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny_config.write_text(tiny_config.read_text().replace("horizon_days: 28", "horizon_days: -1", 1))
    monkeypatch.setenv("BASEMODEL_CONFIG", str(tiny_config))
    monkeypatch.setenv("BASEMODEL_ENV", env)
    with pytest.raises(ConfigError, match=r"horizon_days: Input should be greater than 0") as err:
        build_definitions()
    assert "\n" not in str(err.value)


def test_definitions_module_is_loadable() -> None:
    from basemodel_pipeline import definitions

    dg.Definitions.validate_loadable(definitions.defs)


def test_assets_groups_kinds_partitions(tiny_dataset: Path) -> None:
    defs = build_definitions(str(tiny_dataset), env="local")
    graph = _graph(defs)
    assert set(graph) == set(EXPECTED)
    for name, (group, kinds) in EXPECTED.items():
        key = dg.AssetKey.from_user_string(name)
        spec = graph[name].specs_by_key[key]
        assert spec.group_name == group, name
        assert set(spec.kinds) == kinds, name
        assert graph[name].descriptions_by_key.get(key), f"{name} has no description"
    for name in ("scenario_baselines", "scenario_model", "predictions"):
        partitions = graph[name].partitions_def
        assert isinstance(partitions, dg.DynamicPartitionsDefinition) and partitions.name == "scenarios"
    days = graph["extracts/transactions"].partitions_def
    assert isinstance(days, dg.DailyPartitionsDefinition)
    assert days.start.date().isoformat() == "2023-01-01"  # data_start_date of the tiny config
    assert graph["extracts/transactions"].backfill_policy == dg.BackfillPolicy.single_run()
    assert graph["extracts/products"].partitions_def is None  # attribute tables: whole
    for name in ("foundation_model", "scenario_model", "predictions", "entity_embeddings"):
        assert graph[name].op.pool == "gpu"
    assert graph["scenario_baselines"].op.pool == "cpu"  # LightGBM on CPUs never holds the GPU slot
    assert graph["event_cache"].op.pool == "cache_writer"
    for name in ("transactions", "products", "demographics"):  # one writer per source's extract
        assert graph[f"extracts/{name}"].op.pool == f"extract_{name}"
    deps = defs.resolve_asset_graph()
    cache_parents = {k.to_user_string() for k in deps.get(dg.AssetKey("event_cache")).parent_keys}
    assert cache_parents == {"extracts/transactions", "extracts/products", "extracts/demographics"}
    summary_parents = {k.to_user_string() for k in deps.get(dg.AssetKey("metrics_summary")).parent_keys}
    assert summary_parents == {"scenario_model"}
    model_parents = {k.to_user_string() for k in deps.get(dg.AssetKey("scenario_model")).parent_keys}
    assert model_parents == {"foundation_model", "event_cache", "scenario_baselines"}
    for name, asset in graph.items():
        if not name.startswith("extracts/") and name not in SCHEDULED:
            assert asset.automation_conditions_by_key[asset.key] is not None, f"{name} has no automation"


def test_checks_sensors_schedule_jobs(tiny_dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BASEMODEL_AUTOMATION", raising=False)
    monkeypatch.delenv("BASEMODEL_LAUNCHER", raising=False)
    defs = build_definitions(str(tiny_dataset), env="local")
    checks = {(k.asset_key.to_user_string(), k.name) for k in defs.resolve_asset_graph().asset_check_keys}
    for source in ("transactions", "products", "demographics"):
        assert {
            (f"extracts/{source}", "schema_unchanged"),
            (f"extracts/{source}", "volume_within_guidelines"),
        } <= checks
    assert {
        ("event_cache", "manifest_sha256"),
        ("foundation_model", "loss_finite_and_improving"),
        ("scenario_model", "test_metric_above_floor"),
        ("scenario_model", "beats_popularity"),
        ("scenario_model", "refit_outputs_finite"),
    } <= checks
    assert checks >= NON_BLOCKING_CHECKS
    graph = defs.resolve_asset_graph()
    volume = {
        (f"extracts/{s}", "volume_within_guidelines") for s in ("transactions", "products", "demographics")
    }
    for key in checks - volume - NON_BLOCKING_CHECKS:
        assert graph.get(dg.AssetCheckKey(dg.AssetKey.from_user_string(key[0]), key[1])).blocking, key
    sensors = {s.name: s for s in defs.sensors or []}
    assert set(sensors) == {
        "scenario_registry_sensor",
        "scenario_retrain_sensor",
        "new_data_sensor",
        "basemodel_automation",
        "alert_on_run_failure",
        "alert_on_check_failure",
        "freshness_checks_sensor",
    }
    assert all(s.default_status == dg.DefaultSensorStatus.RUNNING for s in sensors.values())
    schedule = defs.resolve_schedule_def("nightly_refresh")
    assert schedule.cron_schedule == "0 2 * * *" and schedule.job_name == "refresh"
    retention = defs.resolve_schedule_def("workspace_retention_daily")
    assert retention.cron_schedule == "0 5 * * *" and retention.job_name == "prune_workspace"
    assert retention.default_status == dg.DefaultScheduleStatus.RUNNING
    assert {j.name for j in defs.resolve_all_job_defs()} >= {
        "refresh",
        "refresh_and_train",
        "prune_workspace",
    }
    assert defs.resolve_job_def("refresh_and_train").tags["dagster/max_runtime"] == str(24 * 3600)


def test_docker_backend_adds_cleanup_sensors(tiny_dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASEMODEL_LAUNCHER", "docker")
    monkeypatch.setenv("BASEMODEL_AUTOMATION", "stopped")
    defs = build_definitions(str(tiny_dataset), env="prod")
    sensors = {s.name: s for s in defs.sensors or []}
    assert {
        "remove_containers_on_success",
        "remove_containers_on_failure",
        "remove_containers_on_canceled",
    } <= set(sensors)
    assert sensors["new_data_sensor"].default_status == dg.DefaultSensorStatus.STOPPED
    for name in ("alert_on_run_failure", "alert_on_check_failure", "freshness_checks_sensor"):
        assert sensors[name].default_status == dg.DefaultSensorStatus.STOPPED
    retention = defs.resolve_schedule_def("workspace_retention_daily")
    assert retention.default_status == dg.DefaultScheduleStatus.STOPPED


@pytest.mark.parametrize("env", ["local", "ci", "prod"])
def test_resources_per_environment(env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASEMODEL_CONFIG", "/somewhere/config.yaml")
    monkeypatch.delenv("BASEMODEL_LAUNCHER", raising=False)
    monkeypatch.delenv("BASEMODEL_UPLOAD_URL", raising=False)
    resources = resources_for(env)
    assert set(resources) == {"basemodel_config", "launcher", "quality_gates"}
    assert isinstance(resources["basemodel_config"], BasemodelConfigResource)
    assert isinstance(resources["launcher"], Launcher) and resources["launcher"].backend == "subprocess"
    assert isinstance(resources["quality_gates"], QualityGates)
    if env == "ci":
        assert resources["launcher"].env["CUDA_VISIBLE_DEVICES"] == ""
        assert resources["quality_gates"].metric_floor == 0.0
        assert resources["quality_gates"].args() == [
            "--gates",
            '{"metric_floor": 0.0, "popularity_margin": -1.0}',
        ]
    else:  # the config's quality_gates section decides
        assert resources["quality_gates"].metric_floor is None and resources["quality_gates"].args() == []
    if env == "prod":  # read at run time, not frozen into the definitions
        assert isinstance(resources["basemodel_config"].config_path, dg.EnvVar)
    else:
        assert resources["basemodel_config"].config_path == "/somewhere/config.yaml"


def test_unknown_environment_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASEMODEL_ENV", "staging")
    with pytest.raises(ValueError, match="BASEMODEL_ENV"):
        build_definitions()


def test_unknown_launcher_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASEMODEL_LAUNCHER", "slurm")
    with pytest.raises(
        ValueError, match="BASEMODEL_LAUNCHER='slurm' is not one of subprocess, docker, k8s, ecs"
    ):
        resources_for("local", "/somewhere/config.yaml")


def test_each_domain_exposes_defs_and_the_root_merges_every_one() -> None:
    """One folder per domain under defs/, each with `defs(deployment)`; shared/ holds the infrastructure and
    defines nothing; the root merges every domain (a new folder it forgets fails here)."""
    import importlib
    import pkgutil

    import basemodel_pipeline.defs as root

    folders = {m.name for m in pkgutil.iter_modules(root.__path__) if m.ispkg} - {"shared"}
    merged = {d.__name__.rpartition(".")[2] for d in (*root.PIPELINE, *root.OPERATIONS)}
    assert folders == merged
    for name in folders:
        assert callable(importlib.import_module(f"basemodel_pipeline.defs.{name}").defs), name
    shared = importlib.import_module("basemodel_pipeline.defs.shared")
    assert not hasattr(shared, "defs")


def test_a_historical_data_sets_day_partitions_end_at_its_last_day(tiny_config: Path) -> None:
    """With data_params.data_end_date the UI shows only the days that can hold data (not every day to today,
    mostly empty and never filled); without it the partitions run to today, as new days arrive."""
    import datetime as dt

    live = build_definitions(str(tiny_config), env="local")
    days = _graph(live)["extracts/transactions"].partitions_def
    assert days.get_last_partition_key() >= dt.date.today().isoformat()
    tiny_config.write_text(
        tiny_config.read_text().replace(
            "  split_interval_days: 7", "  split_interval_days: 7\n  data_end_date: 2023-04-30"
        )
    )
    historical = build_definitions(str(tiny_config), env="local")
    days = _graph(historical)["extracts/transactions"].partitions_def
    assert days.get_last_partition_key() == "2023-04-30"
    assert days.get_first_partition_key() == "2023-01-01"
