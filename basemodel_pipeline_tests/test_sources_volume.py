"""Data-volume report from the extracts, against the reference product's guidelines."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from basemodel_pipeline.cli import app
from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.pipeline import run_extract
from basemodel_pipeline.sources.volume import volume_report


def test_volume_report_measures_the_extracts(tiny_config: Path) -> None:
    cfg = load_config(tiny_config)
    with pytest.raises(UserError, match="run `basemodel extract CONFIG` first"):
        volume_report(cfg)
    run_extract(cfg, "transactions")
    report = volume_report(cfg)["transactions"]
    data = cfg.source("transactions").data_location.path
    events, entities, first, last = duckdb.sql(
        f"SELECT count(*), count(DISTINCT household_id), min(transaction_timestamp), max(transaction_timestamp) "
        f"FROM '{data}' WHERE quantity > 0"
    ).fetchone()
    assert (report["events"], report["main_entities"]) == (events, entities)
    assert (report["first_day"], report["last_day"]) == (first.date().isoformat(), last.date().isoformat())
    assert report["months_of_history"] == pytest.approx(((last - first).days + 1) / (365.25 / 12), abs=0.05)
    assert report["events_per_month"] == pytest.approx(events / report["months_of_history"], rel=0.01)
    # 60 entities and a few thousand events: below the entity and volume guidelines, enough history
    assert report["checks"] == {
        "main entities >= 10,000": False,
        "events per month >= 100,000": False,
        f"history >= {3 if report['interactions'] == 'frequent' else 12} months ({report['interactions']} interactions)": (
            report["interactions"] == "frequent"
        ),
    }
    assert not report["meets_guidelines"]


def test_cli_data_report(tiny_config: Path) -> None:
    run_extract(load_config(tiny_config), "transactions")
    result = CliRunner().invoke(app, ["data-report", str(tiny_config)])
    assert result.exit_code == 0, result.output
    assert "Data volume" in result.output and "below" in result.output


def test_cache_sizing_and_cli(tiny_config: Path) -> None:
    from basemodel_pipeline.cache.sizing import cache_sizing
    from basemodel_pipeline.pipeline import run_cache

    cfg = load_config(tiny_config)
    with pytest.raises(UserError, match="run `basemodel cache CONFIG` first"):
        cache_sizing(cfg)
    run_extract(cfg)
    meta = run_cache(cfg)
    info = cache_sizing(cfg)
    data = tiny_config.parent / "data"
    assert info["source_bytes"] == sum(p.stat().st_size for p in data.glob("*.parquet"))
    assert info["cache_bytes"] == meta["bytes"] > 0
    assert (info["entities"], info["events"]) == (meta["entities"], meta["events"])
    held = max(info["extract_bytes"], info["source_bytes"]) + info["cache_bytes"] + info["checkpoint_bytes"]
    assert info["recommended_working_volume_bytes"] >= int(held * 1.2)  # never smaller than what it holds
    assert info["recommended_working_volume_bytes"] > info["cache_bytes"] + info["extract_bytes"]
    result = CliRunner().invoke(app, ["cache-info", str(tiny_config)])
    assert result.exit_code == 0, result.output
    assert "recommended_working_volume_bytes" in result.output


def test_monthly_median_counts_months_without_events() -> None:
    """Sparse data: one event every three months is 1/3 per month, not 1 (only months with events)."""
    import datetime as dt

    import pyarrow as pa

    from basemodel_pipeline.sources.volume import monthly_median

    months = [dt.datetime(2024, m, 1) for m in (1, 4, 7, 10)]
    sparse = pa.table({"e": ["a"] * 4 + ["b"] * 4, "m": months * 2, "n": [1] * 8})
    assert monthly_median(sparse, dt.datetime(2024, 12, 15)) == 0.0  # 16 of 24 entity-months are empty
    dense = pa.table({"e": ["a"] * 12, "m": [dt.datetime(2024, m, 1) for m in range(1, 13)], "n": [5] * 12})
    assert monthly_median(dense, dt.datetime(2024, 12, 15)) == 5.0
