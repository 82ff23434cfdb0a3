"""Write a synthetic_scale dataset: households in blocks streamed to Parquet with bounded memory, the
products and demographics tables, config.yaml (the demo config fitted to the date range) and the ground truth
(ground_truth.json, ground_truth/customers.parquet).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import yaml

from basemodel_pipeline.demo.datasets import DEMO_CONFIG
from basemodel_pipeline.demo.synthetic import AGES, INCOMES, WEEKDAY_WEIGHT
from basemodel_pipeline.demo.synthetic_scale.households import household_block
from basemodel_pipeline.demo.synthetic_scale.world import (
    BRAND_BOOST,
    CHURN_FRACTION,
    FAVOURITE_SHARE,
    FAVOURITE_WEIGHTS,
    MEAN_EXTRA_ITEMS,
    N_FAVOURITES,
    N_SEGMENTS,
    PRODUCT_ID_OFFSET,
    RATE_SHAPE,
    TRANSACTIONS_SCHEMA,
    World,
    churn_bounds,
)

MAX_BLOCK_CUSTOMERS = 50_000
BASKET_ID_OFFSET = 1_000_000


def scale_config_text(start: dt.date, days: int, transactions_path: str = "data/transactions") -> str:
    """DEMO_CONFIG (demo training parameters) with data_params fitted to [start, start + days)."""
    if days < 120:
        raise ValueError(
            f"days={days}: need at least 120 days for training, validation and a 28-day test window"
        )
    cfg = yaml.safe_load(DEMO_CONFIG)
    cfg["data_sources"][0]["data_location"]["path"] = transactions_path
    training_end = days - 32  # + 28-day window <= last data day (start + days - 1)
    cfg["data_params"] = {
        "data_start_date": start,
        "training_start_date": start + dt.timedelta(days=28),
        "validation_start_date": start + dt.timedelta(days=max(28 + 7, training_end - max(28, days // 6))),
        "training_end_date": start + dt.timedelta(days=training_end),
        "split_interval_days": 7,
    }
    header = "# Synthetic dataset (basemodel_pipeline.demo.synthetic_scale); shaped like the demo config.\n"
    return header + yaml.safe_dump(cfg, sort_keys=False)


def block_size(n_customers: int, n_events: int, block_events: int) -> int:
    per_customer = max(1.0, n_events / max(1, n_customers))
    return int(max(1, min(MAX_BLOCK_CUSTOMERS, n_customers, block_events // per_customer)))


def generate_dataset(
    directory: Path,
    n_customers: int,
    n_events: int,
    n_products: int = 20_000,
    n_brands: int = 2_000,
    days: int = 365,
    start: dt.date = dt.date(2023, 1, 1),
    seed: int = 0,
    rows_per_file: int = 2_000_000,
    progress: Callable[[int, int, int], None] | None = None,
    block_events: int = 1_000_000,
) -> dict:
    """Write the dataset into `directory`; `n_events` is an approximate target (expected value).

    Households are generated in blocks of about `block_events` events (at most 50k households), each
    written as Parquet row groups, so peak memory does not grow with `n_events`. `progress(done_customers,
    n_customers, events_written)` is called after each block. Deterministic for the same arguments.
    Returns {"events", "customers", "baskets", "files", "bytes", "config"}.
    """
    if n_customers < 1 or n_events < 1:
        raise ValueError("n_customers and n_events must be positive")
    directory = Path(directory)
    config_text = scale_config_text(start, days)
    data = directory / "data"
    tx_dir = data / "transactions"
    truth_dir = directory / "ground_truth"
    for d in (tx_dir, truth_dir):
        d.mkdir(parents=True, exist_ok=True)
    for old in tx_dir.glob("part-*.parquet"):
        old.unlink()
    world = World(np.random.default_rng([seed, 0]), n_customers, n_events, n_products, n_brands, days, start)
    pq.write_table(world.products_table(), data / "products.parquet")
    per_block = block_size(n_customers, n_events, block_events)

    files: list[Path] = []
    writer: pq.ParquetWriter | None = None
    in_file = 0
    events = baskets = 0
    demo_writer = truth_writer = None
    try:
        for b, first in enumerate(range(0, n_customers, per_block)):
            n = min(per_block, n_customers - first)
            rng = np.random.default_rng([seed, 1, b])
            tx, demo, truth, nb = household_block(world, rng, first + 1, n, BASKET_ID_OFFSET + baskets)
            baskets += nb
            offset = 0
            while offset < tx.num_rows:
                if writer is None:
                    files.append(tx_dir / f"part-{len(files):05d}.parquet")
                    writer = pq.ParquetWriter(files[-1], TRANSACTIONS_SCHEMA)
                    in_file = 0
                take = min(rows_per_file - in_file, tx.num_rows - offset)
                writer.write_table(tx.slice(offset, take))
                offset += take
                in_file += take
                if in_file >= rows_per_file:
                    writer.close()
                    writer = None
            events += tx.num_rows
            if demo_writer is None:
                demo_writer = pq.ParquetWriter(data / "demographics.parquet", demo.schema)
                truth_writer = pq.ParquetWriter(truth_dir / "customers.parquet", truth.schema)
            demo_writer.write_table(demo)
            truth_writer.write_table(truth)
            del tx, demo, truth
            if progress is not None:
                progress(first + n, n_customers, events)
        if not files:  # no events at all: still a readable (empty) transactions file
            files.append(tx_dir / "part-00000.parquet")
            writer = pq.ParquetWriter(files[-1], TRANSACTIONS_SCHEMA)
    finally:
        for wr in (writer, demo_writer, truth_writer):
            if wr is not None:
                wr.close()

    config = directory / "config.yaml"
    config.write_text(config_text)
    _write_ground_truth(directory / "ground_truth.json", world, n_customers, n_events, events, seed, n_brands)
    written = [*files, data / "products.parquet", data / "demographics.parquet"]
    return {
        "events": events,
        "customers": n_customers,
        "baskets": baskets,
        "files": len(files),
        "bytes": sum(f.stat().st_size for f in written),
        "config": str(config),
    }


def _write_ground_truth(path: Path, w: World, n_customers: int, target: int, events: int, seed: int,
                        n_brands: int) -> None:  # fmt: skip
    lo, hi = churn_bounds(w.days)
    top = np.argsort(-w.segment_category, axis=1)[:, :5]
    truth = {
        "generator": "basemodel_pipeline.demo.synthetic_scale",
        "seed": seed,
        "customers": n_customers,
        "events_target": target,
        "events": events,
        "start": w.start.isoformat(),
        "days": w.days,
        "per_customer": "ground_truth/customers.parquet",
        "ids": {
            "household_id": "1..customers",
            "product_id": f"{PRODUCT_ID_OFFSET} + product index",
            "category_index": "product_category '<DEPARTMENT> <k>' = DEPARTMENTS[i // 16], k = i % 16",
        },
        "churn": {
            "fraction": CHURN_FRACTION,
            "day_range": [lo, hi],
            "rule": "a churned household has no events on or after start + churn_day (churn_date)",
        },
        "seasonality": {
            "weekday_weight_monday_first": WEEKDAY_WEIGHT.tolist(),
            "december_multiplier": 1.3,
        },
        "baskets": {
            "items_per_basket": f"1 + Poisson(mu), mu ~ Gamma(2, {MEAN_EXTRA_ITEMS / 2})",
            "rate": f"baskets/day ~ Gamma({RATE_SHAPE}, 1/{RATE_SHAPE}) * {w.rate_scale:.6g} * day weight",
            "same_timestamp_and_store_within_basket": True,
        },
        "stores": {"n_stores": w.n_stores, "home_store_share": 0.85},
        "preferences": {
            "favourite_categories": N_FAVOURITES,
            "favourite_share": FAVOURITE_SHARE,
            "favourite_weights": FAVOURITE_WEIGHTS.tolist(),
            "loyalty": "share of items that are the household's staple product in the category ~ Beta(2, 3)",
        },
        "prices": {"per_event_noise": "base * LogNormal(0, 0.05)", "promo_share": 0.2, "coupon_share": 0.02},
        "segments": [
            {
                "segment": k,
                "weight": float(w.segment_weight[k]),
                "top_category_indices": top[k].tolist(),
                "top_category_shares": [float(w.segment_category[k, c]) for c in top[k]],
                "favoured_brands": [f"Brand {b:05d}" for b in sorted(w.segment_brands[k].tolist())],
                "brand_boost": BRAND_BOOST,
                "age_distribution": dict(zip(AGES, w.segment_age[k].round(4).tolist(), strict=True)),
                "income_distribution": dict(zip(INCOMES, w.segment_income[k].round(4).tolist(), strict=True)),
            }
            for k in range(N_SEGMENTS)
        ],
        "n_brands": n_brands,
    }
    path.write_text(json.dumps(truth, indent=2))
