"""A scalable synthetic retail dataset (50M+ events) streamed to Parquet with bounded memory.

Same tables and columns as the tiny generator (basemodel_pipeline.synthetic), at benchmark scale:

- ``data/transactions/part-NNNNN.parquet``: one row per basket item, sorted by household then time;
- ``data/products.parquet``, ``data/demographics.parquet``;
- ``config.yaml``: the demo config (basemodel_pipeline.demo.DEMO_CONFIG) with dates fitted to the range;
- ``ground_truth.json`` (the planted signals) and ``ground_truth/customers.parquet`` (per household:
  segment, churn day, visit rate, loyalty, home store, favourite categories, time of day).

Planted signals: households belong to latent segments (Dirichlet category mixtures and favoured brands);
each has a few favourite categories and "staple" products it rebuys (loyalty); visits follow a weekly
pattern plus a December bump; a fraction churns (no events on or after its churn day); each household has a
home store and a typical time of day; prices are per product with noise and promotions; demographics
depend on the segment. Households are generated in vectorised blocks (numpy only, no per-event Python
loop), so peak memory is one block's arrays whatever the number of events. Deterministic for a seed.

    python -m basemodel_pipeline.synthetic_scale --out DIR --customers 500000 --events 50000000
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from basemodel_pipeline.demo import DEMO_CONFIG
from basemodel_pipeline.synthetic import AGES, INCOMES, WEEKDAY_WEIGHT

DEPARTMENTS = (
    "GROCERY", "DRUG GM", "PRODUCE", "MEAT", "DELI", "PASTRY",
    "NUTRITION", "SEAFOOD", "FROZEN", "BEVERAGE", "HOUSEHOLD", "PET",
)  # fmt: skip
N_SEGMENTS = 8
CATEGORIES_PER_DEPARTMENT = 16
N_FAVOURITES = 3
FAVOURITE_SHARE = 0.5  # share of items from the household's favourite categories
FAVOURITE_WEIGHTS = np.array([0.5, 0.3, 0.2])
CHURN_FRACTION = 0.3
BRANDS_PER_SEGMENT = 40
BRAND_BOOST = 8.0  # popularity multiplier of a segment's favoured brands
MEAN_EXTRA_ITEMS = 3.0  # items per basket = 1 + Poisson(mu), mu ~ Gamma(2, MEAN_EXTRA_ITEMS / 2)
RATE_SHAPE = 2.0  # relative visit rate ~ Gamma(RATE_SHAPE, 1 / RATE_SHAPE) (mean 1)
MAX_BLOCK_CUSTOMERS = 50_000
TRANSACTIONS_SCHEMA = pa.schema(
    [
        ("household_id", pa.int64()),
        ("store_id", pa.int64()),
        ("basket_id", pa.int64()),
        ("product_id", pa.int64()),
        ("quantity", pa.int64()),
        ("sales_value", pa.float64()),
        ("retail_disc", pa.float64()),
        ("coupon_disc", pa.float64()),
        ("transaction_timestamp", pa.timestamp("us")),
    ]
)
PRODUCT_ID_OFFSET = 100_000
BASKET_ID_OFFSET = 1_000_000


def _day_weights(start: dt.date, days: int) -> np.ndarray:
    """Expected relative visits per day: weekly pattern times a December bump."""
    dates = np.datetime64(start, "D") + np.arange(days)
    weekday = (start.weekday() + np.arange(days)) % 7
    month = dates.astype("datetime64[M]").astype(np.int64) % 12  # 0 = January
    return WEEKDAY_WEIGHT[weekday] * np.where(month == 11, 1.3, 1.0)


def _churn_bounds(days: int) -> tuple[int, int]:
    lo = max(1, days // 4)
    return lo, max(lo + 1, days - 10)


class _World:
    """Everything shared by all households: products, segments, stores, calibration."""

    def __init__(self, rng: np.random.Generator, n_customers: int, n_events: int, n_products: int,
                 n_brands: int, days: int, start: dt.date) -> None:  # fmt: skip
        self.days, self.start = days, start
        n_cat = len(DEPARTMENTS) * CATEGORIES_PER_DEPARTMENT
        self.n_categories = n_cat
        # products, sorted by category so each category is a contiguous block
        cat = rng.integers(0, n_cat, n_products)
        if n_products >= n_cat:  # every category has a product
            cat[:n_cat] = np.arange(n_cat)
        cat = np.sort(cat)
        self.product_category = cat
        self.cat_count = np.bincount(cat, minlength=n_cat)
        self.cat_first = np.concatenate([[0], np.cumsum(self.cat_count)[:-1]])
        brand_manufacturer = rng.integers(1, max(2, n_brands // 4) + 1, n_brands)
        self.product_brand = rng.integers(0, n_brands, n_products)
        self.product_manufacturer = brand_manufacturer[self.product_brand]
        popularity = rng.pareto(1.5, n_products) + 0.05
        cat_price = rng.lognormal(1.0, 0.5, n_cat)
        self.base_price = np.round(cat_price[cat] * rng.lognormal(0.0, 0.35, n_products), 2).clip(0.1)
        # segments: sparse category mixtures, favoured brands, demographics, price sensitivity
        self.segment_weight = rng.dirichlet(np.full(N_SEGMENTS, 5.0))
        seg_cat = 0.9 * rng.dirichlet(np.full(n_cat, 0.1), N_SEGMENTS) + 0.1 / n_cat
        self.segment_category = seg_cat
        self.segment_brands = np.stack(
            [
                rng.choice(n_brands, min(BRANDS_PER_SEGMENT, n_brands), replace=False)
                for _ in range(N_SEGMENTS)
            ]
        )
        boost = np.ones((N_SEGMENTS, n_brands))
        np.put_along_axis(boost, self.segment_brands, BRAND_BOOST, axis=1)
        seg_prod = popularity[None, :] * boost[:, self.product_brand]
        # row-wise CDFs over products, each row shifted by 2*segment so one searchsorted serves all rows
        cum = np.cumsum(seg_prod, axis=1)
        cum /= cum[:, -1:]
        self.prod_cdf = cum
        self.prod_cdf_flat = (cum + 2.0 * np.arange(N_SEGMENTS)[:, None]).ravel()
        cat_cum = np.cumsum(seg_cat, axis=1)
        cat_cum /= cat_cum[:, -1:]
        self.cat_cdf_flat = (cat_cum + 2.0 * np.arange(N_SEGMENTS)[:, None]).ravel()
        self.segment_age = rng.dirichlet(np.full(len(AGES), 0.7), N_SEGMENTS)
        self.segment_income = rng.dirichlet(np.full(len(INCOMES), 0.7), N_SEGMENTS)
        self.n_stores = int(min(1000, max(8, n_customers // 1000)))
        # calendar and calibration: expected events per household = scale * E[rate] * E[W(churn)] * E[items]
        self.day_weight = _day_weights(start, days)
        self.cum_weight = np.cumsum(self.day_weight)
        lo, hi = _churn_bounds(days)
        mean_w = (1 - CHURN_FRACTION) * self.cum_weight[-1] + CHURN_FRACTION * self.cum_weight[
            lo - 1 : hi - 1
        ].mean()
        self.rate_scale = n_events / max(1, n_customers) / (mean_w * (1.0 + MEAN_EXTRA_ITEMS))

    def sample_rows(self, flat_cdf: np.ndarray, width: int, seg: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Inverse CDF per row: index in [0, width) for u in [0, 1] under segment `seg`'s distribution."""
        idx = np.searchsorted(flat_cdf, u + 2.0 * seg, side="right") - seg * width
        return idx.clip(0, width - 1)

    def products_table(self) -> pa.Table:
        n = len(self.product_category)
        cat = self.product_category
        dept = cat // CATEGORIES_PER_DEPARTMENT
        dept_names = np.array(DEPARTMENTS)
        cat_names = np.char.add(
            np.char.add(dept_names[np.arange(self.n_categories) // CATEGORIES_PER_DEPARTMENT], " "),
            (np.arange(self.n_categories) % CATEGORIES_PER_DEPARTMENT).astype(str),
        )
        brand_names = np.char.add("Brand ", np.char.zfill(self.product_brand.astype(str), 5))
        return pa.table(
            {
                "product_id": pa.array(np.arange(n, dtype=np.int64) + PRODUCT_ID_OFFSET),
                "manufacturer_id": pa.array(self.product_manufacturer.astype(np.int64)),
                "department": pa.array(dept_names[dept]),
                "brand": pa.array(brand_names),
                "product_category": pa.array(cat_names[cat]),
            }
        )


def _mix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A cheap deterministic hash of two int arrays to uint64 (splitmix64 finaliser)."""
    x = a.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + b.astype(np.uint64) * np.uint64(
        0xBF58476D1CE4E5B9
    )
    x ^= x >> np.uint64(31)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(29)
    return x


def _block(w: _World, rng: np.random.Generator, first_id: int, n: int, basket_offset: int):
    """Households first_id .. first_id+n-1: (transactions, demographics, ground truth) tables."""
    days = w.days
    hh = np.arange(first_id, first_id + n, dtype=np.int64)
    seg = rng.choice(N_SEGMENTS, n, p=w.segment_weight)
    rate = rng.gamma(RATE_SHAPE, 1.0 / RATE_SHAPE, n) * w.rate_scale
    lo, hi = _churn_bounds(days)
    churned = rng.random(n) < CHURN_FRACTION
    churn_day = np.where(churned, rng.integers(lo, hi, n), days)
    mu = rng.gamma(2.0, MEAN_EXTRA_ITEMS / 2.0, n)
    loyalty = rng.beta(2.0, 3.0, n)
    home_store = rng.integers(1, w.n_stores + 1, n)
    hour = rng.normal(14.0, 2.5, n).clip(8.0, 20.0)
    fav = w.sample_rows(
        w.cat_cdf_flat, w.n_categories, np.repeat(seg, N_FAVOURITES), rng.random(n * N_FAVOURITES)
    )
    fav = fav.reshape(n, N_FAVOURITES)
    # baskets: Poisson count over the active days, days drawn by inverse CDF of the day weights
    active_w = w.cum_weight[churn_day - 1]
    k = rng.poisson(rate * active_w)
    owner = np.repeat(np.arange(n), k)
    n_baskets = len(owner)
    day = np.searchsorted(w.cum_weight, rng.random(n_baskets) * active_w[owner], side="right")
    day = np.minimum(day, churn_day[owner] - 1)
    seconds = day * 86400 + (rng.normal(hour[owner], 1.5) * 3600).clip(7 * 3600, 22 * 3600 - 1).astype(
        np.int64
    )
    order = np.argsort(owner.astype(np.int64) * (days * 86400) + seconds, kind="stable")
    seconds = seconds[order]  # owner is already sorted, so owner[order] == owner
    store = np.where(
        rng.random(n_baskets) < 0.85, home_store[owner], rng.integers(1, w.n_stores + 1, n_baskets)
    )
    # items: same timestamp and store within a basket
    size = 1 + rng.poisson(mu[owner])
    basket = np.repeat(np.arange(n_baskets), size)
    m = len(basket)
    item_owner = owner[basket]
    item_seg = seg[item_owner]
    from_fav = rng.random(m) < FAVOURITE_SHARE
    fav_slot = np.searchsorted(np.cumsum(FAVOURITE_WEIGHTS), rng.random(m), side="right").clip(
        max=N_FAVOURITES - 1
    )
    cat = np.where(
        from_fav,
        fav[item_owner, fav_slot],
        w.sample_rows(w.cat_cdf_flat, w.n_categories, item_seg, rng.random(m)),
    )
    # product within the category: the household's staple (rebuy, loyalty) or the segment's brand-tilted popularity
    first, count = w.cat_first[cat], w.cat_count[cat]
    staple = first + (_mix(hh[item_owner], cat) % count.astype(np.uint64)).astype(np.int64)
    n_prod = w.prod_cdf.shape[1]
    lo_c = np.where(first > 0, w.prod_cdf[item_seg, np.maximum(first - 1, 0)], 0.0)
    hi_c = w.prod_cdf[item_seg, first + count - 1]
    pick = w.sample_rows(w.prod_cdf_flat, n_prod, item_seg, lo_c + rng.random(m) * (hi_c - lo_c))
    pick = pick.clip(first, first + count - 1)
    product = np.where(rng.random(m) < loyalty[item_owner], staple, pick)
    # amounts
    quantity = np.where(rng.random(m) < 0.01, 0, 1 + rng.poisson(0.3, m))
    price = np.round(w.base_price[product] * rng.lognormal(0.0, 0.05, m), 2)
    sales = np.round(price * quantity, 2)
    promo = rng.random(m) < 0.2
    retail_disc = np.where(promo, -np.round(sales * rng.uniform(0.05, 0.35, m), 2), 0.0)
    coupon_disc = np.where(rng.random(m) < 0.02, -np.round(rng.uniform(0.25, 2.0, m), 2), 0.0)
    t0 = np.datetime64(w.start, "us")
    ts = t0 + (seconds[basket] * 1_000_000).astype("timedelta64[us]")
    transactions = pa.Table.from_arrays(
        [
            pa.array(hh[item_owner]),
            pa.array(store[basket].astype(np.int64)),
            pa.array(basket + basket_offset),
            pa.array(product + PRODUCT_ID_OFFSET),
            pa.array(quantity.astype(np.int64)),
            pa.array(sales),
            pa.array(retail_disc + 0.0),  # + 0.0: no negative zeros
            pa.array(coupon_disc),
            pa.array(ts, pa.timestamp("us")),
        ],
        schema=TRANSACTIONS_SCHEMA,
    )
    # demographics (80% of households), drawn from the segment's age and income distributions
    has = rng.random(n) < 0.8
    age = (rng.random(n)[:, None] > np.cumsum(w.segment_age, axis=1)[seg]).sum(axis=1).clip(max=len(AGES) - 1)
    inc = (rng.random(n)[:, None] > np.cumsum(w.segment_income, axis=1)[seg]).sum(axis=1)
    inc = inc.clip(max=len(INCOMES) - 1)
    demographics = pa.table(
        {
            "household_id": pa.array(hh[has]),
            "age": pa.array(np.array(AGES)[age[has]]),
            "income": pa.array(np.array(INCOMES)[inc[has]]),
        }
    )
    churn_date = np.datetime64(w.start, "D") + churn_day
    truth = pa.table(
        {
            "household_id": pa.array(hh),
            "segment": pa.array(seg.astype(np.int64)),
            "churned": pa.array(churned),
            "churn_day": pa.array(np.where(churned, churn_day, -1).astype(np.int64)),
            "churn_date": pa.array(np.where(churned, churn_date, np.datetime64("NaT")), pa.date32()),
            "baskets_per_day": pa.array(rate),
            "mean_items_per_basket": pa.array(1.0 + mu),
            "loyalty": pa.array(loyalty),
            "home_store": pa.array(home_store.astype(np.int64)),
            "hour_of_day": pa.array(hour),
            **{f"favourite_category_{i}": pa.array(fav[:, i].astype(np.int64)) for i in range(N_FAVOURITES)},
        }
    )
    return transactions, demographics, truth, n_baskets


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
    header = "# Synthetic dataset (basemodel_pipeline.synthetic_scale); shaped like the demo config.\n"
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
    world = _World(np.random.default_rng([seed, 0]), n_customers, n_events, n_products, n_brands, days, start)
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
            tx, demo, truth, nb = _block(world, rng, first + 1, n, BASKET_ID_OFFSET + baskets)
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


def _write_ground_truth(path: Path, w: _World, n_customers: int, target: int, events: int, seed: int,
                        n_brands: int) -> None:  # fmt: skip
    lo, hi = _churn_bounds(w.days)
    top = np.argsort(-w.segment_category, axis=1)[:, :5]
    truth = {
        "generator": "basemodel_pipeline.synthetic_scale",
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m basemodel_pipeline.synthetic_scale", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--customers", required=True, type=int)
    parser.add_argument("--events", required=True, type=int, help="approximate number of events")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--products", type=int, default=20_000)
    parser.add_argument("--rows-per-file", type=int, default=2_000_000)
    args = parser.parse_args(argv)

    def report(done: int, total: int, events: int) -> None:
        print(f"{done}/{total} customers, {events} events", file=sys.stderr)

    result = generate_dataset(
        args.out, args.customers, args.events, n_products=args.products, days=args.days, seed=args.seed,
        rows_per_file=args.rows_per_file, progress=report,
    )  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
