"""Extracts and the event cache: round trip against the source Parquet, reuse, bad joins."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from basemodel_pipeline.cache.store import EventCache, expand_ranges
from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.pipeline import run_cache, run_extract


@pytest.fixture
def built(tiny_config: Path):
    cfg = load_config(tiny_config)
    run_extract(cfg)
    return cfg, run_cache(cfg)


def test_extract_writes_one_file_per_day_and_is_idempotent(built) -> None:
    cfg, _ = built
    days = sorted(p.name for p in (Path(cfg.workspace) / "extracts" / "transactions").glob("*.parquet"))
    assert days[0] == f"{cfg.data_params.data_start_date.isoformat()}.parquet"
    first = run_extract(cfg, "transactions")["transactions"]
    again = run_extract(cfg, "transactions")["transactions"]
    assert first["rows"] == again["rows"] > 0
    assert first["files"] == again["files"] == len(days)


def test_cache_round_trip_matches_source(built) -> None:
    cfg, meta = built
    cache = EventCache(meta["path"])
    src = cache.source("transactions")
    data = Path(cfg.source("transactions").data_location.path)
    ref = duckdb.sql(
        f"SELECT household_id, epoch(transaction_timestamp)::BIGINT AS ts, sales_value, product_id "
        f"FROM '{data}' WHERE quantity > 0 ORDER BY household_id, ts"
    ).fetchnumpy()
    assert src.n_events == len(ref["ts"]) == meta["events"]
    ids = cache.entity_ids
    assert list(ids) == sorted(set(ref["household_id"].tolist()))
    counts = np.diff(src.offsets)
    assert counts.sum() == src.n_events
    entity_of_event = np.repeat(ids, counts)
    np.testing.assert_array_equal(entity_of_event, ref["household_id"])
    np.testing.assert_array_equal(np.asarray(src.ts), ref["ts"])
    # per-entity sums are invariant to the order of simultaneous events
    np.testing.assert_allclose(
        np.add.reduceat(np.asarray(src.columns["sales_value"], np.float64), src.offsets[:-1]),
        np.add.reduceat(ref["sales_value"], src.offsets[:-1]),
        rtol=1e-5,
    )
    vocab = src.vocab("product_id")
    decoded = sorted(vocab[c - 1] for c in np.asarray(src.columns["product_id"]))
    assert decoded == sorted(str(v) for v in ref["product_id"])
    assert src.info["department"].type == "categorical"  # joined from products
    assert src.info["sales_value"].type == "numeric"
    assert "age" in cache.attribute_info
    assert meta["min_date"] == cfg.data_params.data_start_date.isoformat()


def test_cache_is_reused_until_an_extract_changes(built) -> None:
    cfg, meta = built
    assert not meta["reused"]
    assert run_cache(cfg)["reused"]
    day = sorted((Path(cfg.workspace) / "extracts" / "transactions").glob("*.parquet"))[-1]
    day.touch()  # the signature is the content, not the mtime
    assert run_cache(cfg)["reused"]
    first = sorted((Path(cfg.workspace) / "extracts" / "transactions").glob("*.parquet"))[0]
    table = pq.read_table(first)
    pq.write_table(table.slice(0, table.num_rows - 1), first)  # an old day changes: rebuild
    rebuilt = run_cache(cfg)
    assert not rebuilt["reused"] and rebuilt["appends"] == 0 and rebuilt["events"] == meta["events"] - 1


def test_positions_and_windows(built) -> None:
    _, meta = built
    cache = EventCache(meta["path"])
    src = cache.source("transactions")
    e = np.array([0, 0, 3])
    t = np.array([src.ts[src.offsets[0] + 2], 0, 10**12])
    pos = src.positions(e, t)
    assert pos[1] == src.offsets[0]  # before any event
    assert pos[2] == src.offsets[4]  # after every event of entity 3
    assert (np.asarray(src.ts)[src.offsets[0] : pos[0]] < t[0]).all() and src.ts[pos[0]] >= t[0]
    owner, rows = expand_ranges(np.array([2, 5, 5]), np.array([4, 5, 8]))
    assert owner.tolist() == [0, 0, 2, 2, 2] and rows.tolist() == [2, 3, 5, 6, 7]


def test_join_keys_that_never_match_are_an_error(tiny_config: Path) -> None:
    import pyarrow.parquet as pq

    products = tiny_config.parent / "data" / "products.parquet"
    table = pq.read_table(products)
    ids = [f"P{v:05d}" for v in table.column("product_id").to_pylist()]
    pq.write_table(table.set_column(0, "product_id", __import__("pyarrow").array(ids)), products)
    cfg = load_config(tiny_config)
    run_extract(cfg)
    with pytest.raises(DataError, match=r"joined with 'products'.*no event matches"):
        run_cache(cfg)


def test_max_date_is_last_event_day(built) -> None:
    _, meta = built
    cache = EventCache(meta["path"])
    last = max(int(s.ts.max()) for s in cache.sources.values())
    assert cache.max_date == dt.datetime.fromtimestamp(last, dt.UTC).date()


def test_a_moved_workspace_keeps_its_cache_and_models(tmp_path: Path) -> None:
    """Config, data and workspace built in A, copied to B and A deleted: nothing is rebuilt or retrained."""
    import shutil

    from basemodel_pipeline.config import data_fingerprint
    from basemodel_pipeline.demo.synthetic import write_tiny_dataset
    from basemodel_pipeline.pipeline import run_finetune, run_predict, run_pretrain

    a, b = tmp_path / "laptop" / "project", tmp_path / "server" / "volume"
    cfg = load_config(write_tiny_dataset(a))
    run_extract(cfg)
    built = run_cache(cfg)
    run_pretrain(cfg)
    run_finetune(cfg, "churn")

    shutil.copytree(a, b)
    shutil.rmtree(a)
    moved = load_config(b / "config.yaml")
    assert data_fingerprint(moved) == data_fingerprint(cfg)
    again = run_cache(moved)
    assert again["reused"] and again["data_version"] == built["data_version"]
    assert again["path"] == str(b / "cache" / built["fingerprint"])
    assert EventCache(again["path"]).n_entities == built["entities"]
    scored = run_predict(moved, "churn")
    assert scored["rows"] == built["entities"]
    for f in b.rglob("*"):  # no file the pipeline wrote names the old location
        if f.is_file() and f.suffix in (".json", ".yaml", ".txt", ""):
            assert str(a) not in f.read_text(errors="ignore"), f


def test_fingerprint_hashes_paths_relative_to_the_workspace_or_config(tmp_path: Path) -> None:
    from basemodel_pipeline.config import data_fingerprint, parse_config
    from basemodel_pipeline.demo.synthetic import tiny_config_text

    text = tiny_config_text(dt.date(2023, 1, 1), 120).replace("workspace: .", "workspace: work")

    def fingerprint(where: Path, edit: str = "") -> str:
        return data_fingerprint(
            parse_config(
                text.replace("data/products.parquet", edit or "data/products.parquet"), where / "c.yaml"
            )
        )

    here, there = fingerprint(tmp_path / "a"), fingerprint(tmp_path / "b" / "deeper")
    assert here == there  # data beside the config, workspace in a subdirectory: both moved together
    assert fingerprint(tmp_path / "a", "work/products.parquet") == fingerprint(
        tmp_path / "b", "work/products.parquet"
    )
    outside = str(tmp_path / "shared" / "products.parquet")  # outside both: the absolute path counts
    other = str(tmp_path / "other" / "products.parquet")
    assert fingerprint(tmp_path / "a", outside) == fingerprint(tmp_path / "b", outside)
    assert fingerprint(tmp_path / "a", outside) != fingerprint(tmp_path / "a", other)
    s3 = "s3://bucket/products/*.parquet"
    assert fingerprint(tmp_path / "a", s3) == fingerprint(tmp_path / "b", s3) != here


def test_columns_whose_names_differ_only_in_punctuation_keep_their_own_values(tiny_config: Path) -> None:
    """ "disc rate" and "disc_rate" once shared one cache file: one column's values silently replaced the other's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from basemodel_pipeline.cache.store import EventCache

    path = tiny_config.parent / "data" / "transactions.parquet"
    table = pq.read_table(path)
    n = table.num_rows
    table = table.append_column("disc rate", pa.array([1.0] * n)).append_column(
        "disc_rate", pa.array([2.0] * n)
    )
    pq.write_table(table, path)
    text = tiny_config.read_text().replace(
        "  - sales_value\n", "  - sales_value\n  - disc rate\n  - disc_rate\n", 1
    )
    tiny_config.write_text(text)
    cfg = load_config(tiny_config)
    run_extract(cfg)
    with EventCache(run_cache(cfg)["path"]) as cache:
        columns = cache.source("transactions").columns
        assert float(columns["disc rate"].max()) == 1.0 and float(columns["disc_rate"].min()) == 2.0


def test_columns_dropped_from_the_config_leave_the_cache_without_a_new_extract(tiny_config: Path) -> None:
    """Extracts written under the old config still hold the columns; the cache keeps only the config's."""
    import yaml

    run_extract(load_config(tiny_config))
    raw = yaml.safe_load(tiny_config.read_text())
    sources = {s["name"]: s for s in raw["data_sources"]}
    sources["transactions"]["allowed_columns"].remove("coupon_disc")
    sources["products"]["allowed_columns"].remove("brand")
    sources["demographics"]["disallowed_columns"] = ["income"]
    tiny_config.write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = load_config(tiny_config)
    with EventCache(run_cache(cfg)["path"]) as cache:
        columns = set(cache.source("transactions").info)
        assert "coupon_disc" not in columns and "brand" not in columns, columns
        assert {"retail_disc", "department"} <= columns, columns
        assert set(cache.attribute_info) == {"age"}, cache.attribute_info
        files = set(cache.manifest["files"])
    assert not [f for f in files if "coupon_disc" in f or "brand" in f or "income" in f], files
