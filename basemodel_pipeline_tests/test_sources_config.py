"""Config of data locations: one model per backend, secrets from ${ENV} kept out of dumps, docs examples."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import TypeAdapter

from basemodel_pipeline.config import data_fingerprint, load_config
from basemodel_pipeline.config.sources import DataLocation
from basemodel_pipeline.errors import ConfigError

DOCS = Path(__file__).resolve().parents[1] / "docs" / "connectors.md"


def docs_locations() -> list[dict]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.S)
    return [yaml.safe_load(b)["data_location"] for b in blocks if b.startswith("data_location:")]


def test_every_backend_has_a_docs_example_that_validates() -> None:
    examples = docs_locations()
    kinds = {e["database_type"] for e in examples}
    assert kinds == {"parquet", "snowflake", "bigquery", "clickhouse", "databricks", "synapse", "hive"}
    adapter = TypeAdapter(DataLocation)
    for example in examples:
        location = adapter.validate_python(example)
        assert location.database_type == example["database_type"]


def warehouse_config(tiny_config: Path, params: dict) -> Path:
    raw = yaml.safe_load(tiny_config.read_text())
    raw["data_sources"][0]["data_location"] = {
        "database_type": "snowflake",
        "table_name": "EVENTS",
        "connection_params": params,
    }
    tiny_config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return tiny_config


PARAMS = {"account": "acme", "user": "u", "password": "${SF_PW}", "database": "DB", "schema": "S"}


def test_secrets_come_from_env_and_stay_out_of_dumps_and_fingerprints(tiny_config, monkeypatch) -> None:
    monkeypatch.setenv("SF_PW", "first-Secret-1")
    cfg = load_config(warehouse_config(tiny_config, PARAMS))
    params = cfg.source("transactions").data_location.connection_params
    assert params.password == "first-Secret-1" and params.schema_name == "S"
    assert "first-Secret-1" not in str(cfg.model_dump())
    before = data_fingerprint(cfg)
    monkeypatch.setenv("SF_PW", "rotated-Secret-2")
    assert data_fingerprint(load_config(tiny_config)) == before  # a rotated password keeps the cache


def test_missing_connection_param_names_the_yaml_path(tiny_config) -> None:
    params = {k: v for k, v in PARAMS.items() if k not in ("account", "password")}
    with pytest.raises(ConfigError) as info:
        load_config(warehouse_config(tiny_config, params))
    assert "data_sources[0].data_location.connection_params.account: required field is missing" in str(
        info.value
    )


def test_unknown_database_type_lists_the_supported_ones(tiny_config) -> None:
    raw = yaml.safe_load(tiny_config.read_text())
    raw["data_sources"][0]["data_location"] = {"database_type": "oracle", "table_name": "x"}
    tiny_config.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ConfigError) as info:
        load_config(tiny_config)
    message = str(info.value)
    assert "data_sources[0].data_location" in message and "'snowflake'" in message and "'oracle'" in message


def test_unset_secret_variable_is_a_clear_error(tiny_config, monkeypatch) -> None:
    monkeypatch.delenv("SF_PW", raising=False)
    with pytest.raises(
        ConfigError, match=r"data_location.connection_params.password: environment variable SF_PW"
    ):
        load_config(warehouse_config(tiny_config, PARAMS))
