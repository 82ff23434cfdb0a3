"""What every household of the synthetic_scale dataset shares: products, segments, stores, the calendar and
the calibration of visit rates to the requested number of events.

The constants here are the generator's planted signals (segments, favourite categories, churn, brands, basket
sizes) and the shape of the transactions table. World is built once per dataset from the seed's first
generator; synthetic_scale/households.py draws households against it.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa

from basemodel_pipeline.demo.synthetic import AGES, INCOMES, WEEKDAY_WEIGHT

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


def _day_weights(start: dt.date, days: int) -> np.ndarray:
    """Expected relative visits per day: weekly pattern times a December bump."""
    dates = np.datetime64(start, "D") + np.arange(days)
    weekday = (start.weekday() + np.arange(days)) % 7
    month = dates.astype("datetime64[M]").astype(np.int64) % 12  # 0 = January
    return WEEKDAY_WEIGHT[weekday] * np.where(month == 11, 1.3, 1.0)


def churn_bounds(days: int) -> tuple[int, int]:
    lo = max(1, days // 4)
    return lo, max(lo + 1, days - 10)


class World:
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
        lo, hi = churn_bounds(days)
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
