"""A tiny, deterministic retail dataset shaped like The Complete Journey, with planted signals, for tests.

Signals: some households churn (stop buying) partway through, every household prefers a few departments,
and visits follow a weekly pattern (more on weekends). With ``fast_items`` most purchases are instead of
short-lived items: each product launches on a day of its own and its share of purchases halves every
FAST_HALF_LIFE_DAYS after it (what a recommender must follow when items come and go within days). Generation is vectorised numpy; files are Parquet.
The config is the demo config (basemodel_pipeline.demo.datasets.DEMO_CONFIG) with dates fitted to the generated range
and small training parameters, so tests exercise exactly what users run.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from basemodel_pipeline.demo.datasets import DEMO_CONFIG

DEPARTMENTS = ("GROCERY", "DRUG GM", "PRODUCE", "MEAT", "DELI", "PASTRY")
AGES = ("19-24", "25-34", "35-44", "45-54", "55-64", "65+")
INCOMES = ("Under 15K", "15-24K", "25-34K", "35-49K", "50-74K", "75-99K", "100-124K", "125K+")
WEEKDAY_WEIGHT = np.array([0.8, 0.7, 0.8, 0.9, 1.2, 1.6, 1.4])  # Monday..Sunday
N_PRODUCTS, N_STORES, N_MANUFACTURERS = 120, 8, 15
FAST_HALF_LIFE_DAYS = 3.0  # fast_items: a product's popularity halves this often after its launch
FAST_SHARE = 0.8  # fast_items: share of purchased items drawn by their launch-and-fade popularity


def _products(rng: np.random.Generator) -> pa.Table:
    dept = np.sort(rng.integers(0, len(DEPARTMENTS), N_PRODUCTS))  # sorted: each department is a block
    sub = rng.integers(0, 4, N_PRODUCTS)
    return pa.table(
        {
            "product_id": pa.array(np.arange(N_PRODUCTS, dtype=np.int64) + 1001),
            "manufacturer_id": pa.array(rng.integers(1, N_MANUFACTURERS + 1, N_PRODUCTS).astype(np.int64)),
            "department": pa.array([DEPARTMENTS[d] for d in dept]),
            "brand": pa.array(np.where(rng.random(N_PRODUCTS) < 0.7, "National", "Private")),
            "product_category": pa.array([f"{DEPARTMENTS[d]} {s}" for d, s in zip(dept, sub, strict=True)]),
        }
    )


def _fast_items(rng: np.random.Generator, item_day: np.ndarray, days: int) -> np.ndarray:
    """Product indices of purchases on `item_day`, each drawn by the launch-and-fade popularity of that day:
    product p launches on a day of its own and its weight halves every FAST_HALF_LIFE_DAYS after it."""
    launch = np.sort(rng.integers(0, days, N_PRODUCTS))
    age = np.arange(days)[:, None] - launch[None, :]
    weight = np.where(age >= 0, 0.5 ** (np.maximum(age, 0) / FAST_HALF_LIFE_DAYS), 0.0) + 1e-3
    cum = np.cumsum(weight, axis=1)
    u = rng.random(len(item_day)) * cum[item_day, -1]
    return np.minimum((cum[item_day] < u[:, None]).sum(axis=1), N_PRODUCTS - 1)


def _transactions(
    rng: np.random.Generator, products: pa.Table, n: int, days: int, start: dt.date, fast_items: bool = False
) -> pa.Table:
    # visits: household rate x weekday pattern, zero after a churner's last day
    rate = rng.uniform(0.08, 0.4, n)
    churn_day = np.where(rng.random(n) < 0.35, rng.integers(days // 4, days - 10, n), days)
    day = np.arange(days)
    weekday = (start.weekday() + day) % 7
    p_visit = rate[:, None] * WEEKDAY_WEIGHT[weekday][None, :] * (day[None, :] < churn_day[:, None])
    hh, vday = np.nonzero(rng.random((n, days)) < np.minimum(p_visit, 1.0))
    n_baskets = len(hh)
    # items per basket; each item's department follows the household's preference, product uniform within it
    size = 1 + rng.poisson(3.0, n_baskets)
    basket = np.repeat(np.arange(n_baskets), size)
    item_hh = hh[basket]
    pref = rng.dirichlet(np.full(len(DEPARTMENTS), 0.4), n).cumsum(axis=1)
    dept = (rng.random(len(basket))[:, None] > pref[item_hh]).sum(axis=1).clip(max=len(DEPARTMENTS) - 1)
    prod_dept = np.array([DEPARTMENTS.index(d) for d in products["department"].to_pylist()])
    first = np.searchsorted(prod_dept, np.arange(len(DEPARTMENTS)))
    count = np.bincount(prod_dept, minlength=len(DEPARTMENTS))
    dept = np.where(count[dept] > 0, dept, prod_dept[rng.integers(0, N_PRODUCTS, len(dept))])
    product_idx = first[dept] + (rng.random(len(dept)) * count[dept]).astype(np.int64)
    if fast_items:  # most items follow their launch-and-fade popularity instead of the household's taste
        fast = rng.random(len(basket)) < FAST_SHARE
        product_idx[fast] = _fast_items(rng, vday[basket][fast], days)
    # amounts, stores, times
    price = np.round(rng.lognormal(1.0, 0.6, N_PRODUCTS), 2)
    quantity = np.where(rng.random(len(basket)) < 0.01, 0, 1 + rng.poisson(0.4, len(basket)))
    sales = np.round(price[product_idx] * quantity, 2)
    home_store = rng.integers(1, N_STORES + 1, n)
    store = np.where(rng.random(n_baskets) < 0.85, home_store[hh], rng.integers(1, N_STORES + 1, n_baskets))
    seconds = vday * 86400 + rng.integers(8 * 3600, 21 * 3600, n_baskets)
    t0 = np.datetime64(start, "us")
    ts = t0 + (seconds[basket] * 1_000_000).astype("timedelta64[us]")
    order = np.argsort(ts, kind="stable")
    columns = {
        "household_id": (item_hh + 1).astype(np.int64),
        "store_id": store[basket].astype(np.int64),
        "basket_id": (basket + 50_000).astype(np.int64),
        "product_id": products["product_id"].to_numpy()[product_idx],
        "quantity": quantity.astype(np.int64),
        "sales_value": sales,
        "retail_disc": np.where(rng.random(len(basket)) < 0.3, -np.round(sales * 0.1, 2), 0.0),
        "coupon_disc": np.where(rng.random(len(basket)) < 0.02, -0.5, 0.0),
    }
    table = pa.table({k: pa.array(v[order]) for k, v in columns.items()})
    return table.append_column("transaction_timestamp", pa.array(ts[order], pa.timestamp("us")))


def _demographics(rng: np.random.Generator, n: int) -> pa.Table:
    ids = np.flatnonzero(rng.random(n) < 0.8) + 1  # like the real data, not every household has a profile
    return pa.table(
        {
            "household_id": pa.array(ids.astype(np.int64)),
            "age": pa.array([AGES[i] for i in rng.integers(0, len(AGES), len(ids))]),
            "income": pa.array([INCOMES[i] for i in rng.integers(0, len(INCOMES), len(ids))]),
        }
    )


def tiny_config_text(start: dt.date, days: int) -> str:
    """DEMO_CONFIG with data_params fitted to [start, start + days) and small training parameters."""
    if days < 70:
        raise ValueError(
            f"days={days}: need at least 70 days for training, validation and a 28-day test window"
        )
    cfg = yaml.safe_load(DEMO_CONFIG)
    cfg["data_params"] = {
        "data_start_date": start,
        "training_start_date": start + dt.timedelta(days=28),
        "validation_start_date": start + dt.timedelta(days=days // 2),
        "training_end_date": start + dt.timedelta(days=days - 32),  # + 28-day window <= last data day
        "split_interval_days": 7,
    }
    cfg["training_params"] = {
        "foundation": {
            "horizon_days": 28,
            "epochs": 2,
            "hidden_dim": 32,
            "num_blocks": 1,
            "sketch_width": 8,
            "split_points_per_entity": 2,
            "batch_size": 64,
        },
        # fp32 frozen passes: the test metrics fine-tuning measures equal those of `predict --precision fp32`
        "finetune": {"epochs": 2, "batch_size": 64, "patience": 2, "precision": "fp32"},
    }
    for scenario in cfg["scenarios"]:
        if "min_positive_entities" in scenario["target"]:
            scenario["target"]["min_positive_entities"] = 3
    # two epochs on a few hundred synthetic entities cannot make a useful model: any finite metric is served
    cfg["quality_gates"] = {"metric_floor": 0.0, "popularity_margin": None}
    header = "# Tiny synthetic dataset (basemodel_pipeline.demo.synthetic); shaped like the demo config.\n"
    return header + yaml.safe_dump(cfg, sort_keys=False)


def write_tiny_dataset(
    directory: Path,
    n_entities: int = 60,
    days: int = 120,
    seed: int = 0,
    start: dt.date = dt.date(2023, 1, 1),
    fast_items: bool = False,
) -> Path:
    """Write data/{transactions,products,demographics}.parquet and config.yaml into `directory`.

    Deterministic for a given (n_entities, days, seed, start, fast_items). Returns the config path.
    """
    directory = Path(directory)
    config_text = tiny_config_text(start, days)
    rng = np.random.default_rng(seed)
    products = _products(rng)
    tables = {
        "transactions": _transactions(rng, products, n_entities, days, start, fast_items),
        "products": products,
        "demographics": _demographics(rng, n_entities),
    }
    data = directory / "data"
    data.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        pq.write_table(table, data / f"{name}.parquet")
    config = directory / "config.yaml"
    config.write_text(config_text)
    return config
