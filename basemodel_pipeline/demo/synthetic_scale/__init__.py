"""A scalable synthetic retail dataset (50M+ events) streamed to Parquet with bounded memory.

Same tables and columns as the tiny generator (basemodel_pipeline.demo.synthetic), at benchmark scale:

- ``data/transactions/part-NNNNN.parquet``: one row per basket item, sorted by household then time;
- ``data/products.parquet``, ``data/demographics.parquet``;
- ``config.yaml``: the demo config (basemodel_pipeline.demo.datasets.DEMO_CONFIG) with dates fitted to the range;
- ``ground_truth.json`` (the planted signals) and ``ground_truth/customers.parquet`` (per household:
  segment, churn day, visit rate, loyalty, home store, favourite categories, time of day).

Planted signals: households belong to latent segments (Dirichlet category mixtures and favoured brands);
each has a few favourite categories and "staple" products it rebuys (loyalty); visits follow a weekly
pattern plus a December bump; a fraction churns (no events on or after its churn day); each household has a
home store and a typical time of day; prices are per product with noise and promotions; demographics
depend on the segment. Households are generated in vectorised blocks (numpy only, no per-event Python
loop), so peak memory is one block's arrays whatever the number of events. Deterministic for a seed.

    python -m basemodel_pipeline.demo.synthetic_scale --out DIR --customers 500000 --events 50000000

The package: synthetic_scale/world.py (what all households share: products, segments, stores, calendar,
calibration), synthetic_scale/households.py (one block of households and their events),
synthetic_scale/dataset.py (generate_dataset: the blocks streamed to Parquet, config.yaml, ground truth) and
synthetic_scale/cli.py (the command line; ``__main__.py`` runs it).
"""

from __future__ import annotations

from basemodel_pipeline.demo.synthetic_scale.cli import main
from basemodel_pipeline.demo.synthetic_scale.dataset import (
    BASKET_ID_OFFSET,
    MAX_BLOCK_CUSTOMERS,
    block_size,
    generate_dataset,
    scale_config_text,
)
from basemodel_pipeline.demo.synthetic_scale.world import (
    BRAND_BOOST,
    BRANDS_PER_SEGMENT,
    CATEGORIES_PER_DEPARTMENT,
    CHURN_FRACTION,
    DEPARTMENTS,
    FAVOURITE_SHARE,
    FAVOURITE_WEIGHTS,
    MEAN_EXTRA_ITEMS,
    N_FAVOURITES,
    N_SEGMENTS,
    PRODUCT_ID_OFFSET,
    RATE_SHAPE,
    TRANSACTIONS_SCHEMA,
)

__all__ = [
    "BASKET_ID_OFFSET",
    "BRAND_BOOST",
    "BRANDS_PER_SEGMENT",
    "CATEGORIES_PER_DEPARTMENT",
    "CHURN_FRACTION",
    "DEPARTMENTS",
    "FAVOURITE_SHARE",
    "FAVOURITE_WEIGHTS",
    "MAX_BLOCK_CUSTOMERS",
    "MEAN_EXTRA_ITEMS",
    "N_FAVOURITES",
    "N_SEGMENTS",
    "PRODUCT_ID_OFFSET",
    "RATE_SHAPE",
    "TRANSACTIONS_SCHEMA",
    "block_size",
    "generate_dataset",
    "main",
    "scale_config_text",
]
