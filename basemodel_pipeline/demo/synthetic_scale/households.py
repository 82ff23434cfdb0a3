"""One block of synthetic_scale households, vectorised with numpy: their baskets, items, amounts and
timestamps (the transactions), their demographics and their planted ground truth.

household_block draws everything for households first_id .. first_id+n-1 from one generator against the
shared World (synthetic_scale/world.py); synthetic_scale/dataset.py writes the blocks one after the other.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from basemodel_pipeline.demo.synthetic import AGES, INCOMES
from basemodel_pipeline.demo.synthetic_scale.world import (
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


def _mix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A cheap deterministic hash of two int arrays to uint64 (splitmix64 finaliser)."""
    x = a.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + b.astype(np.uint64) * np.uint64(
        0xBF58476D1CE4E5B9
    )
    x ^= x >> np.uint64(31)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(29)
    return x


def household_block(w: World, rng: np.random.Generator, first_id: int, n: int, basket_offset: int):
    """Households first_id .. first_id+n-1: (transactions, demographics, ground truth) tables."""
    days = w.days
    hh = np.arange(first_id, first_id + n, dtype=np.int64)
    seg = rng.choice(N_SEGMENTS, n, p=w.segment_weight)
    rate = rng.gamma(RATE_SHAPE, 1.0 / RATE_SHAPE, n) * w.rate_scale
    lo, hi = churn_bounds(days)
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
