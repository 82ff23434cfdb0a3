"""The Dagster definitions load, with the expected assets, groups, kinds, partitions, pools and resources."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from basemodel_pipeline.defs import build_definitions
from basemodel_pipeline.defs.resources import BasemodelConfigResource, resources_for

EXPECTED = {
    "extracts/transactions": ("extracts", {"duckdb", "parquet"}),
    "extracts/products": ("extracts", {"duckdb", "parquet"}),
    "extracts/demographics": ("extracts", {"duckdb", "parquet"}),
    "event_cache": ("cache", {"duckdb", "parquet"}),
    "foundation_model": ("models", {"pytorch"}),
    "scenario_model": ("models", {"pytorch"}),
    "predictions": ("predictions", {"pytorch", "parquet"}),
    "metrics_summary": ("reports", {"json"}),
    "entity_embeddings": ("predictions", {"pytorch", "parquet", "numpy"}),
}


def _graph(defs: dg.Definitions) -> dict[str, dg.AssetsDefinition]:
    return {key.to_user_string(): defs.get_assets_def(key) for key in defs.resolve_all_asset_keys()}


def test_module_loads_without_a_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASEMODEL_CONFIG", str(tmp_path / "missing.yaml"))
    monkeypatch.delenv("BASEMODEL_ENV", raising=False)
    defs = build_definitions()
    defs.validate_loadable(defs)
    assert set(_graph(defs)) == set(EXPECTED)  # shape of the demo config


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
    for name in ("scenario_model", "predictions"):
        partitions = graph[name].partitions_def
        assert isinstance(partitions, dg.DynamicPartitionsDefinition) and partitions.name == "scenarios"
    for name in ("foundation_model", "scenario_model", "predictions"):
        assert graph[name].op.pool == "gpu"
    assert graph["event_cache"].op.pool == "cache_writer"
    deps = defs.resolve_asset_graph()
    cache_parents = {k.to_user_string() for k in deps.get(dg.AssetKey("event_cache")).parent_keys}
    assert cache_parents == {"extracts/transactions", "extracts/products", "extracts/demographics"}
    summary_parents = {k.to_user_string() for k in deps.get(dg.AssetKey("metrics_summary")).parent_keys}
    assert summary_parents == {"scenario_model"}


@pytest.mark.parametrize("env", ["local", "ci", "prod"])
def test_resources_per_environment(env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASEMODEL_CONFIG", "/somewhere/config.yaml")
    resources = resources_for(env)
    assert set(resources) == {"basemodel_config", "pipes_subprocess_client"}
    assert isinstance(resources["basemodel_config"], BasemodelConfigResource)
    assert isinstance(resources["pipes_subprocess_client"], dg.PipesSubprocessClient)
    if env == "ci":
        assert resources["pipes_subprocess_client"].env["CUDA_VISIBLE_DEVICES"] == ""
    if env == "prod":  # read at run time, not frozen into the definitions
        assert isinstance(resources["basemodel_config"].config_path, dg.EnvVar)
    else:
        assert resources["basemodel_config"].config_path == "/somewhere/config.yaml"


def test_unknown_environment_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASEMODEL_ENV", "staging")
    with pytest.raises(ValueError, match="BASEMODEL_ENV"):
        build_definitions()
