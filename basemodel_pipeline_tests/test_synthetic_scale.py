"""The scalable synthetic generator (basemodel_pipeline.demo.synthetic_scale), at small sizes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from basemodel_pipeline.config import load_config
from basemodel_pipeline.demo.synthetic_scale import TRANSACTIONS_SCHEMA, generate_dataset

CUSTOMERS, EVENTS = 2_000, 100_000


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("scale")
    return out, generate_dataset(out, CUSTOMERS, EVENTS, n_products=3_000, n_brands=300, rows_per_file=40_000)


def test_files_and_schema(dataset: tuple[Path, dict]) -> None:
    out, result = dataset
    parts = sorted((out / "data" / "transactions").glob("part-*.parquet"))
    assert [p.name for p in parts][:2] == ["part-00000.parquet", "part-00001.parquet"]
    assert result["files"] == len(parts) >= 3  # rows_per_file=40k splits ~100k events
    for p in parts:
        assert pq.read_schema(p).equals(TRANSACTIONS_SCHEMA)
        assert pq.ParquetFile(p).metadata.num_rows <= 40_000
    products = pq.read_table(out / "data" / "products.parquet")
    assert products.column_names == [
        "product_id",
        "manufacturer_id",
        "department",
        "brand",
        "product_category",
    ]
    assert products.num_rows == 3_000
    demo = pq.read_table(out / "data" / "demographics.parquet")
    assert demo.column_names == ["household_id", "age", "income"]
    assert 0.7 * CUSTOMERS < demo.num_rows < 0.9 * CUSTOMERS
    tx = pq.read_table(out / "data" / "transactions")
    assert tx.num_rows == result["events"]
    assert set(tx["product_id"].to_numpy()) <= set(products["product_id"].to_numpy())
    assert result["customers"] == CUSTOMERS and result["bytes"] > 0


def test_event_count_near_target(dataset: tuple[Path, dict]) -> None:
    _, result = dataset
    assert abs(result["events"] - EVENTS) <= 0.1 * EVENTS


def test_baskets_share_timestamp_and_store(dataset: tuple[Path, dict]) -> None:
    out, result = dataset
    tx = pq.read_table(out / "data" / "transactions")
    per_basket = tx.group_by("basket_id").aggregate(
        [
            ("transaction_timestamp", "count_distinct"),
            ("store_id", "count_distinct"),
            ("household_id", "count"),
        ]
    )
    assert per_basket.num_rows == result["baskets"]
    assert max(per_basket["transaction_timestamp_count_distinct"].to_pylist()) == 1
    assert max(per_basket["store_id_count_distinct"].to_pylist()) == 1
    assert sum(per_basket["household_id_count"].to_pylist()) / per_basket.num_rows > 2  # several items


def test_deterministic(dataset: tuple[Path, dict], tmp_path: Path) -> None:
    out, result = dataset
    again = generate_dataset(
        tmp_path, CUSTOMERS, EVENTS, n_products=3_000, n_brands=300, rows_per_file=40_000
    )
    assert {k: v for k, v in again.items() if k != "config"} == {
        k: v for k, v in result.items() if k != "config"
    }
    for name in ["data/transactions", "data/products.parquet", "data/demographics.parquet"]:
        assert pq.read_table(tmp_path / name).equals(pq.read_table(out / name))
    assert (tmp_path / "ground_truth.json").read_text() == (out / "ground_truth.json").read_text()
    other = generate_dataset(tmp_path / "other", 200, 10_000, seed=1)
    first = generate_dataset(tmp_path / "first", 200, 10_000, seed=0)
    assert not pq.read_table(tmp_path / "other/data/transactions").equals(
        pq.read_table(tmp_path / "first/data/transactions")
    )
    assert other["customers"] == first["customers"]


def test_planted_churn(dataset: tuple[Path, dict]) -> None:
    out, _ = dataset
    truth = json.loads((out / "ground_truth.json").read_text())
    customers = pq.read_table(out / truth["per_customer"]).to_pandas()
    assert customers["household_id"].tolist() == list(range(1, CUSTOMERS + 1))
    churned = customers[customers["churned"]].set_index("household_id")
    assert 0.2 < len(churned) / CUSTOMERS < 0.4
    tx = pq.read_table(
        out / "data" / "transactions", columns=["household_id", "transaction_timestamp"]
    ).to_pandas()
    last = tx.groupby("household_id")["transaction_timestamp"].max().dt.date.rename("last")
    joined = churned.join(last, how="inner")
    assert len(joined) > 0.8 * len(churned)
    assert (joined["last"] < joined["churn_date"]).all()
    # non-churned households keep buying until near the end
    active = customers[~customers["churned"]].set_index("household_id").join(last, how="inner")
    assert (active["last"] > churned["churn_date"].min()).mean() > 0.9


def test_weekly_seasonality(dataset: tuple[Path, dict]) -> None:
    out, _ = dataset
    tx = pq.read_table(out / "data" / "transactions", columns=["transaction_timestamp"]).to_pandas()
    per_weekday = tx["transaction_timestamp"].dt.weekday.value_counts()
    assert per_weekday[5] > 1.5 * per_weekday[1]  # Saturday vs Tuesday (weights 1.6 vs 0.7)


def test_config_loads(dataset: tuple[Path, dict]) -> None:
    out, result = dataset
    cfg = load_config(result["config"])
    dp = cfg.data_params
    assert dp.training_start_date < dp.validation_start_date < dp.training_end_date
    assert (dp.training_end_date - dp.data_start_date).days + 28 <= 364
    tx = next(s for s in cfg.data_sources if s.name == "transactions")
    assert Path(tx.data_location.path) == out / "data" / "transactions"


def test_cli(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "basemodel_pipeline.demo.synthetic_scale", "--out", str(tmp_path), "--customers", "300",
         "--events", "20000", "--seed", "3"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["customers"] == 300 and result["files"] == 1
    assert (tmp_path / "config.yaml").is_file()


MEMORY_SCRIPT = """
import json, sys, tracemalloc
import pyarrow as pa
from basemodel_pipeline.demo.synthetic_scale import generate_dataset
tracemalloc.start()
r = generate_dataset(sys.argv[1], 2000, int(sys.argv[2]), n_products=3000, n_brands=300, block_events=10_000)
peak = tracemalloc.get_traced_memory()[1]
print(json.dumps({"numpy_peak": peak, "arrow_peak": pa.default_memory_pool().max_memory(), "events": r["events"]}))
"""


def _peak(directory: Path, events: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, str(directory), str(events)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_memory_bounded_in_events(tmp_path: Path) -> None:
    small = _peak(tmp_path / "small", 100_000)
    large = _peak(tmp_path / "large", 400_000)
    assert large["events"] > 3 * small["events"]
    # 4x the events, blocks of the same size: peak (numpy + Arrow) memory must not scale with events
    small_peak = small["numpy_peak"] + small["arrow_peak"]
    large_peak = large["numpy_peak"] + large["arrow_peak"]
    assert large_peak < 2 * small_peak, (small, large)


def test_arrow_schema_constant() -> None:
    assert TRANSACTIONS_SCHEMA.field("transaction_timestamp").type == pa.timestamp("us")
