"""`basemodel suggest-config`: column types, ID-like/constant/leakage/time-series flags, join key checks."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from basemodel_pipeline.cli import app
from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.sources.data_checks import check_config_against_data
from basemodel_pipeline.sources.suggest import suggest_config


def rewrite(path: Path, edit) -> None:
    pq.write_table(edit(pq.read_table(path)), path)


@pytest.fixture
def messy_config(tiny_config: Path) -> Path:
    data = tiny_config.parent / "data"

    def events(t: pa.Table) -> pa.Table:
        n = t.num_rows
        t = t.append_column("event_uuid", pa.array([f"e{i:06d}" for i in range(n)]))
        return t.append_column("channel", pa.array(["web"] * n))

    def demographics(t: pa.Table) -> pa.Table:
        n = t.num_rows
        ids = t["household_id"].to_pylist()
        t = t.append_column("churned", pa.array([i % 2 == 0 for i in range(n)]))
        t = t.append_column("last_purchase_date", pa.array([dt.date(2023, 3, 1)] * n))
        return t.append_column("balance", pa.array([float(i) for i in ids]))

    rewrite(data / "transactions.parquet", events)
    rewrite(data / "demographics.parquet", demographics)
    raw = yaml.safe_load(tiny_config.read_text())
    raw["data_sources"][0].pop("allowed_columns")
    tiny_config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return tiny_config


def test_suggest_flags_columns_and_writes_a_loadable_config(messy_config: Path) -> None:
    out = messy_config.parent / "suggested_config.yaml"
    result = suggest_config(load_config(messy_config), messy_config, out)
    flags = result["flagged"]
    assert any(f.startswith("ID-like: unique") for f in flags["transactions"]["event_uuid"])
    assert flags["transactions"]["channel"] == ["constant"]
    assert any(f.startswith("leakage-like") for f in flags["demographics"]["churned"])
    assert any(f.startswith("time-series candidate") for f in flags["demographics"]["last_purchase_date"])
    assert any(f.startswith("time-series candidate") for f in flags["demographics"]["balance"])
    suggested = yaml.safe_load(out.read_text())
    events = suggested["data_sources"][0]
    assert {"event_uuid", "channel"} <= set(events["disallowed_columns"])
    assert (
        events["column_types"]["sales_value"] == "numeric"
        and events["column_types"]["store_id"] == "categorical"
    )
    assert "# transactions (" in out.read_text() and "event_uuid: ID-like" in out.read_text()
    cfg = load_config(out)
    check_config_against_data(cfg, out)


def test_join_keys_that_never_match_are_an_error_with_examples(tiny_config: Path) -> None:
    rewrite(
        tiny_config.parent / "data" / "products.parquet",
        lambda t: t.set_column(
            0, "product_id", pc.binary_join_element_wise("P-", pc.cast(t["product_id"], pa.string()), "")
        ),
    )
    with pytest.raises(DataError) as info:
        suggest_config(load_config(tiny_config), tiny_config, tiny_config.parent / "s.yaml")
    message = str(info.value)
    assert "data_sources[0].joined_data_sources[0].join_on" in message and "never match" in message
    assert "products has 'P-" in message and "transactions has '" in message
    assert not (tiny_config.parent / "s.yaml").exists()


def test_join_keys_that_rarely_match_are_an_error(tiny_config: Path) -> None:
    rewrite(tiny_config.parent / "data" / "products.parquet", lambda t: t.slice(0, 10))
    with pytest.raises(DataError, match=r"rarely match \(\d+\.\d% of \d+ sampled ids\)"):
        suggest_config(load_config(tiny_config), tiny_config, tiny_config.parent / "s.yaml")


def test_cli_suggest_config(tiny_config: Path) -> None:
    result = CliRunner().invoke(app, ["suggest-config", str(tiny_config)])
    assert result.exit_code == 0, result.output
    assert (tiny_config.parent / "suggested_config.yaml").is_file()
