"""List-valued columns (a movie's genres): multi-hot indicators in the cache and the features, a multilabel
target over their values, and clear errors (validate) or notes (suggest-config) for what cannot use them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import ConfigError
from basemodel_pipeline.pipeline import run_cache, run_extract, run_pretrain
from basemodel_pipeline.progress import NullProgress
from basemodel_pipeline.scenarios.finetune import finetune
from basemodel_pipeline.sources.data_checks import check_config_against_data
from basemodel_pipeline.workspace import cache_dir

TAGS = {"GROCERY": ["food", "daily"], "PRODUCE": ["food", "fresh"], "MEAT": ["food", "fresh", "protein"]}


def _with_tags(config: Path, scenario: dict) -> Path:
    """The tiny dataset with a list column `tags` on products (joined to every transaction)."""
    products = config.parent / "data" / "products.parquet"
    table = pq.read_table(products)
    tags = [TAGS.get(d, ["other"]) for d in table.column("department").to_pylist()]
    pq.write_table(table.append_column("tags", pa.array(tags, pa.list_(pa.string()))), products)
    raw = yaml.safe_load(config.read_text())
    for src in raw["data_sources"]:
        if src["name"] == "products" and src.get("allowed_columns"):
            src["allowed_columns"].append("tags")
    raw["scenarios"] = [scenario]
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


TAG_TARGET = {"kind": "multilabel", "source": "transactions", "column": "tags", "horizon_days": 14}


def test_a_list_column_is_multi_hot_in_the_cache_and_a_multilabel_target(tiny_config: Path) -> None:
    config = _with_tags(tiny_config, {"name": "tags_next_14d", "task": "multilabel", "target": TAG_TARGET})
    cfg = load_config(config)
    check_config_against_data(cfg, config)
    run_extract(cfg)
    run_cache(cfg)
    src = EventCache(cache_dir(cfg)).source("transactions")
    indicators = {i.list_value: i.name for i in src.list_indicators("tags")}
    assert set(indicators) == {"food", "daily", "fresh", "protein", "other"}
    fresh = np.asarray(src.columns[indicators["fresh"]])
    dept = np.asarray(src.columns["department"])
    values = np.array(src.vocab("department"), dtype=object)
    expect = np.isin(values[np.maximum(dept - 1, 0)], ["PRODUCE", "MEAT"]) & (dept > 0)
    np.testing.assert_array_equal(fresh > 0, expect)  # each event's list, as 0/1
    run_pretrain(cfg)
    out = finetune(cfg, cfg.scenario("tags_next_14d"), NullProgress())
    meta = json.loads((Path(out["path"]) / "model.json").read_text())
    assert set(meta["target"]["classes"]) <= set(indicators) and "food" in meta["target"]["classes"]
    assert np.isfinite(out["test_model"])


@pytest.mark.parametrize(
    ("scenario", "field"),
    [
        (
            {"name": "t", "task": "multiclass", "target": {**TAG_TARGET, "kind": "multiclass"}},
            "target.column",
        ),
        (
            {
                "name": "t",
                "task": "binary",
                "target": {
                    "kind": "binary",
                    "source": "transactions",
                    "horizon_days": 14,
                    "filter": [{"column": "tags", "value": "food"}],
                },
            },
            "target.filter[0].column",
        ),
    ],
)
def test_validate_rejects_a_list_column_where_it_cannot_be_used(
    tiny_config: Path, scenario: dict, field: str
) -> None:
    config = _with_tags(tiny_config, scenario)
    with pytest.raises(
        ConfigError, match=rf"scenarios\[0\]\.{re.escape(field)}: column 'tags' .* holds lists of values"
    ):
        check_config_against_data(load_config(config), config)


def test_suggest_config_keeps_a_list_column_and_says_what_it_becomes(
    tiny_config: Path, tmp_path: Path
) -> None:
    from basemodel_pipeline.sources.suggest import suggest_config

    config = _with_tags(tiny_config, {"name": "tags_next_14d", "task": "multilabel", "target": TAG_TARGET})
    cfg = load_config(config)
    out = suggest_config(cfg, config, tmp_path / "suggested.yaml")
    assert "list-valued" in "; ".join(out["flagged"]["products"]["tags"])
    suggested = yaml.safe_load((tmp_path / "suggested.yaml").read_text())
    products = next(s for s in suggested["data_sources"] if s["name"] == "products")
    assert "tags" not in products.get("disallowed_columns", [])
    assert "tags" in (products.get("allowed_columns") or ["tags"])
