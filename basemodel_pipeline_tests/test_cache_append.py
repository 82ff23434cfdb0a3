"""Cache appends (new days without a rebuild), shards, preflight, and crash safety under SIGKILL."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import signal
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.cache.versions import versions_dir
from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.pipeline import run_cache, run_extract
from basemodel_pipeline.workspace import cache_dir


def decoded(cache: EventCache) -> dict[str, dict[str, np.ndarray]]:
    """Per source: entity id, time and decoded value of every event, grouped by entity id (stable)."""
    out = {}
    ids = cache.entity_ids
    for name, src in cache.sources.items():
        cols = {"entity": np.repeat(ids, np.diff(src.offsets)), "ts": np.asarray(src.ts)}
        for c, info in src.info.items():
            values = np.asarray(src.columns[c])
            if info.type == "categorical":
                vocab = np.array(["<missing>", *src.vocab(c)], dtype=object)
                cols[c] = vocab[values]
            else:
                cols[c] = values
        order = np.argsort(cols["entity"], kind="stable")
        out[name] = {k: v[order] for k, v in cols.items()}
    return out


def assert_same_events(a: EventCache, b: EventCache) -> None:
    assert_same_decoded(decoded(a), decoded(b))
    ia, ib = a.entity_index(a.entity_ids), b.entity_index(a.entity_ids)
    for col in a.attributes:
        va, vb = a.attributes[col][ia], b.attributes[col][ib]
        if a.attribute_info[col].type == "categorical":
            va = np.array(["<missing>", *_attr_vocab(a, col)], dtype=object)[va]
            vb = np.array(["<missing>", *_attr_vocab(b, col)], dtype=object)[vb]
        np.testing.assert_array_equal(va, vb, err_msg=f"attribute {col}")


def assert_same_decoded(da: dict, db: dict) -> None:
    assert da.keys() == db.keys()
    for name in da:
        assert da[name].keys() == db[name].keys()
        for col in da[name]:
            np.testing.assert_array_equal(da[name][col], db[name][col], err_msg=f"{name}.{col}")


def _attr_vocab(cache: EventCache, col: str) -> list[str]:
    file = cache.manifest["attributes"]["columns"][col]["file"]
    return [
        v
        for s in cache.segments
        if (f := s / "vocab" / "__attributes" / f"{file}.parquet").exists()
        for v in pq.read_table(f).column("value").to_pylist()
    ]


def clean_build(cfg) -> EventCache:
    """A cache built from scratch from a copy of the workspace's data and extracts."""
    work = Path(cfg.workspace)
    clean = work / "clean_copy"
    shutil.copytree(work / "data", clean / "data")
    shutil.copytree(work / "extracts", clean / "extracts")
    return EventCache(
        run_cache(load_config(shutil.copy(work / "config.yaml", clean / "config.yaml")))["path"]
    )


def delete_cache(cfg) -> None:
    """Remove the cache pointer, so the next build numbers entities afresh (its versions are deleted by the
    next build once no reader holds them)."""
    final = cache_dir(cfg)
    final.unlink()
    assert versions_dir(final).is_dir()


Days = namedtuple("Days", "cfg dir held")


@pytest.fixture
def held_back(tiny_config: Path) -> Days:
    """Extracted tiny dataset with its last 3 transaction days moved aside (to be appended later)."""
    cfg = load_config(tiny_config)
    run_extract(cfg)
    d = Path(cfg.workspace) / "extracts" / "transactions"
    aside = Path(cfg.workspace) / "held"
    aside.mkdir()
    held = sorted(d.glob("*.parquet"))[-3:]
    for f in held:
        shutil.move(f, aside / f.name)
    return Days(cfg, d, [aside / f.name for f in held])


def new_day_with_new_values(days: Days) -> Path:
    """A day after the last one: the last day shifted by a day, some households and products new."""
    last = pq.read_table(days.held[-1])
    ts = pc.add(last.column("transaction_timestamp"), pa.scalar(dt.timedelta(days=1)))
    hh = last.column("household_id").to_numpy().copy()
    hh[::3] += 1_000_000
    prod = last.column("product_id").to_numpy().copy()
    prod[::5] += 5_000_000
    t = last.set_column(1, "transaction_timestamp", ts)
    t = t.set_column(0, "household_id", pa.array(hh)).set_column(2, "product_id", pa.array(prod))
    name = (dt.date.fromisoformat(days.held[-1].stem) + dt.timedelta(days=1)).isoformat()
    pq.write_table(t, days.dir / f"{name}.parquet")
    return days.dir / f"{name}.parquet"


def test_append_new_days_equals_a_clean_build(held_back: Days, monkeypatch: pytest.MonkeyPatch) -> None:
    from basemodel_pipeline.cache import view

    monkeypatch.setattr(view, "CHUNK_ROWS", 500)  # the view is merged in many entity chunks
    cfg = held_back.cfg
    base = run_cache(cfg)
    before = EventCache(base["path"])
    old_ids = before.entity_ids.copy()
    old_vocab = before.source("transactions").vocab("product_id")
    shutil.copy(held_back.held[0], held_back.dir)
    one = run_cache(cfg)
    assert not one["reused"] and one["appends"] == 1 and one["appended"]["days"] == [held_back.held[0].stem]
    for f in held_back.held[1:]:
        shutil.copy(f, held_back.dir)
    new_day_with_new_values(held_back)
    two = run_cache(cfg)
    assert two["appends"] == 2 and two["entities"] > base["entities"]
    again = run_cache(cfg)  # Dagster's data version follows the content
    assert again["reused"] and again["data_version"] == two["data_version"] != one["data_version"]
    assert one["data_version"] != base["data_version"]
    appended = EventCache(two["path"])
    # existing entities keep their index, existing values their code; new ones come after
    np.testing.assert_array_equal(appended.entity_ids[: len(old_ids)], old_ids)
    assert appended.source("transactions").vocab("product_id")[: len(old_vocab)] == old_vocab
    assert appended.entity_index(np.array([10**12]))[0] == -1
    new_ids = appended.entity_ids[len(old_ids) :]
    assert (
        len(new_ids)
        and (appended.entity_index(new_ids) == np.arange(len(old_ids), appended.n_entities)).all()
    )
    assert appended.shards[-1] == (len(old_ids), appended.n_entities)
    assert appended.max_date.isoformat() == two["max_date"] > base["max_date"]
    assert [a["segment"] for a in appended.appended_since(dt.date.fromisoformat(base["max_date"]))] == [
        "0001",
        "0002",
    ]
    from basemodel_pipeline.defs.cache.checks import manifest_problems

    assert manifest_problems(appended.path)[0] == []  # segments checksummed; the derived view is not listed
    src = appended.source("transactions")
    assert src.n_events == two["events"] and src.offsets[-1] == src.n_events
    assert all(
        (np.diff(src.ts[a:b]) >= 0).all() for a, b in zip(src.offsets[:-1], src.offsets[1:], strict=True)
    )
    # the merged view equals a build from scratch of the same extracts (in a copy of the workspace)
    clean = clean_build(cfg)
    assert clean.manifest["appends"] == [] and clean.source("transactions").n_events == two["events"]
    assert_same_events(appended, clean)


def test_changed_or_late_old_day_rebuilds(held_back: Days) -> None:
    cfg = held_back.cfg
    middle = sorted(held_back.dir.glob("*.parquet"))[50]
    shutil.move(middle, held_back.held[0].parent / middle.name)
    run_cache(cfg)
    shutil.move(held_back.held[0].parent / middle.name, middle)  # a late-arriving old day
    late = run_cache(cfg)
    assert not late["reused"] and late["appends"] == 0
    shutil.copy(held_back.held[0], held_back.dir)
    assert run_cache(cfg)["appends"] == 1
    before = EventCache(cache_dir(cfg))
    ids, vocab = before.entity_ids.copy(), before.source("transactions").vocab("product_id")
    table = pq.read_table(middle)
    pq.write_table(table.slice(1), middle)  # an old day changes
    rebuilt = run_cache(cfg)
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in held_back.dir.glob("*.parquet"))
    assert rebuilt["appends"] == 0 and not rebuilt["reused"] and rebuilt["events"] == rows
    # a rebuild keeps the entity indices and codes of the cache it replaces
    after = EventCache(cache_dir(cfg))
    np.testing.assert_array_equal(after.entity_ids[: len(ids)], ids)
    assert after.source("transactions").vocab("product_id")[: len(vocab)] == vocab
    assert_same_events(after, clean_build(cfg))


def test_shards_are_contiguous_entity_ranges(tiny_config: Path) -> None:
    raw = tiny_config.read_text() + "cache: {shards: 4}\n"
    tiny_config.write_text(raw)
    cfg = load_config(tiny_config)
    run_extract(cfg)
    sharded = EventCache(run_cache(cfg)["path"])
    manifest = json.loads((sharded.path / "manifest.json").read_text())
    ranges = manifest["shards"]
    assert len(ranges) == 4 and ranges[0][0] == 0 and ranges[-1][1] == sharded.n_entities
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    ids = sharded.entity_ids
    for a, b in ranges:  # sorted by id inside each shard
        assert (np.diff(ids[a:b]) > 0).all()
    assert (sharded.entity_index(ids) == np.arange(len(ids))).all()
    assert (sharded.entity_index(np.array([-5])) == -1).all()
    delete_cache(cfg)
    with pytest.raises(UserError, match="no event cache"):
        EventCache(cache_dir(cfg))
    tiny_config.write_text(raw.replace("shards: 4", "shards: 1"))
    one = EventCache(run_cache(load_config(tiny_config))["path"])
    assert_same_events(sharded, one)


def test_preflight_stops_when_the_volume_is_too_small(tiny_config: Path) -> None:
    cfg = load_config(tiny_config)
    run_extract(cfg)
    usage = namedtuple("usage", "total used free")
    with pytest.raises(
        UserError, match=r"need about .* GiB .* which has 0\.00 GiB \(1,000 B\) free.*recommended"
    ):
        from basemodel_pipeline.cache.build import build_cache
        from basemodel_pipeline.progress import NullProgress

        build_cache(cfg, NullProgress(), disk_usage=lambda p: usage(10**6, 10**6 - 1000, 1000))
    assert not (cache_dir(cfg) / "manifest.json").exists()
    assert run_cache(cfg)["events"] > 0  # the real free space is enough


# --- crash safety: SIGKILL mid-build and mid-append -----------------------------------------------------


@pytest.fixture(scope="module")
def scale_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic_scale dataset big enough that a build takes a few seconds, extracted once."""
    out = tmp_path_factory.mktemp("scale")
    subprocess.run(
        [sys.executable, "-m", "basemodel_pipeline.demo.synthetic_scale", "--out", str(out), "--customers", "3000",
         "--events", "600000"],
        check=True, capture_output=True,
    )  # fmt: skip
    run_extract(load_config(out / "config.yaml"))
    return out


def _copy_workspace(src: Path, dst: Path) -> Path:
    shutil.copytree(src / "data", dst / "data")
    shutil.copytree(src / "extracts", dst / "extracts")
    return Path(shutil.copy(src / "config.yaml", dst / "config.yaml"))


def _kill_when(cmd: list[str], ready, timeout: float = 120.0) -> bool:
    """Start cmd, SIGKILL it as soon as ready() holds; False if it finished first."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if ready():
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    return False


def _cli(config: Path) -> list[str]:
    return [sys.executable, "-m", "basemodel_pipeline.cli", "cache", str(config)]


def test_sigkill_during_build_leaves_no_cache_and_rerun_completes(
    scale_dataset: Path, tmp_path: Path
) -> None:
    config = _copy_workspace(scale_dataset, tmp_path)
    cfg = load_config(config)
    final = cache_dir(cfg)

    def staging_has_events() -> bool:  # killed once the build writes arrays
        return any(p.suffix == ".npy" for p in final.parent.glob(f".{final.name}.*.tmp/events/*/*"))

    assert _kill_when(_cli(config), staging_has_events), "the build finished before it could be killed"
    assert not (final / "manifest.json").exists()
    with pytest.raises(UserError, match="no event cache"):
        EventCache(final)
    subprocess.run(_cli(config), check=True, capture_output=True)
    rebuilt = EventCache(final)
    assert not list(final.parent.glob(".*.tmp"))  # the leftovers were cleaned
    clean_cfg = _copy_workspace(scale_dataset, tmp_path / "clean")
    clean = EventCache(run_cache(load_config(clean_cfg))["path"])
    assert_same_events(rebuilt, clean)
    for name, src in rebuilt.sources.items():  # deterministic: the very same arrays
        np.testing.assert_array_equal(src.ts, clean.sources[name].ts)
        for c in src.columns:
            np.testing.assert_array_equal(src.columns[c], clean.sources[name].columns[c])


def test_sigkill_during_append_keeps_the_previous_cache(scale_dataset: Path, tmp_path: Path) -> None:
    config = _copy_workspace(scale_dataset, tmp_path)
    cfg = load_config(config)
    d = Path(cfg.workspace) / "extracts" / "transactions"
    days = sorted(d.glob("*.parquet"))
    aside = [shutil.move(f, tmp_path / f.name) for f in days[-90:]]
    base = run_cache(cfg)
    manifest = (cache_dir(cfg) / "manifest.json").read_text()
    for f in aside:
        shutil.copy(f, d)
    final = cache_dir(cfg)

    def append_started() -> bool:  # the new version is staged beside the cache, its segment being written
        return any(p.suffix == ".npy" for p in final.parent.glob(f".{final.name}.*.tmp/appends/*/events/*/*"))

    assert _kill_when(_cli(config), append_started), "the append finished before it could be killed"
    assert (cache_dir(cfg) / "manifest.json").read_text() == manifest
    intact = EventCache(cache_dir(cfg))
    assert intact.source("transactions").n_events == base["events"]
    subprocess.run(_cli(config), check=True, capture_output=True)
    appended = EventCache(cache_dir(cfg))
    assert len(appended.manifest["appends"]) == 1
    assert not list(final.parent.glob(".*.tmp"))  # the killed append's staging was cleaned
    clean_cfg = _copy_workspace(scale_dataset, tmp_path / "clean")
    assert_same_events(appended, EventCache(run_cache(load_config(clean_cfg))["path"]))


def _prefixed(path: Path, column: str, prefix: str) -> None:
    t = pq.read_table(path)
    i = t.schema.names.index(column)
    ids = pc.binary_join_element_wise(prefix, pc.cast(t.column(i), pa.string()), "")
    pq.write_table(t.set_column(i, column, ids), path)


def test_text_entity_ids_build_append_and_index(tiny_config: Path) -> None:
    """Text entity ids and text join keys take the DuckDB join paths (integer keys use lookup tables): both
    give the same events as the integer version of the data."""
    data = tiny_config.parent / "data"
    ints = tiny_config.parent / "ints"
    shutil.copytree(data, ints / "data")
    int_cfg = load_config(shutil.copy(tiny_config, ints / "config.yaml"))
    run_extract(int_cfg)
    by_int = decoded(EventCache(run_cache(int_cfg)["path"]))["transactions"]
    for name in ("transactions", "demographics"):
        _prefixed(data / f"{name}.parquet", "household_id", "H-")
    for name in ("transactions", "products"):
        _prefixed(data / f"{name}.parquet", "product_id", "P-")
    tiny_config.write_text(tiny_config.read_text() + "cache: {shards: 3}\n")
    cfg = load_config(tiny_config)
    run_extract(cfg)
    d = Path(cfg.workspace) / "extracts" / "transactions"
    last = sorted(d.glob("*.parquet"))[-1]
    held = shutil.move(last, tiny_config.parent / last.name)
    shutil.move(held, last)
    by_text = decoded(EventCache(run_cache(cfg)["path"]))["transactions"]
    delete_cache(cfg)
    shutil.move(last, held)
    as_text = np.array([f"H-{e}" for e in by_int["entity"]], dtype=object)
    order = np.argsort(as_text, kind="stable")
    np.testing.assert_array_equal(by_text["entity"], as_text[order])
    np.testing.assert_array_equal(
        by_text["product_id"], np.array([f"P-{v}" for v in by_int["product_id"]])[order]
    )
    for col in ("ts", "department", "sales_value", "store_id"):
        np.testing.assert_array_equal(by_text[col], by_int[col][order])
    base = EventCache(run_cache(cfg)["path"])
    assert base.manifest["entity_id_type"] == "string" and len(base.shards) == 3
    assert all(str(i).startswith("H-") for i in base.entity_ids)
    assert (base.entity_index(base.entity_ids) == np.arange(base.n_entities)).all()
    assert base.entity_index(np.array(["nobody"]))[0] == -1
    assert (base.attributes["age"] > 0).any()  # demographics matched on text ids
    shutil.move(held, last)
    appended = EventCache(run_cache(cfg)["path"])
    assert len(appended.manifest["appends"]) == 1
    np.testing.assert_array_equal(appended.entity_ids[: base.n_entities], base.entity_ids)
    clean = tiny_config.parent / "clean"
    shutil.copytree(data, clean / "data")
    shutil.copytree(Path(cfg.workspace) / "extracts", clean / "extracts")
    clean_cfg = load_config(shutil.copy(tiny_config, clean / "config.yaml"))
    assert_same_events(appended, EventCache(run_cache(clean_cfg)["path"]))


def test_max_appends_compacts_keeping_indices_and_codes(held_back: Days) -> None:
    cfg = held_back.cfg.model_copy(
        update={"cache": held_back.cfg.cache.model_copy(update={"max_appends": 1})}
    )
    run_cache(cfg)
    shutil.copy(held_back.held[0], held_back.dir)
    assert run_cache(cfg)["active_segments"] == 1
    before = EventCache(cache_dir(cfg))
    ids, vocab = before.entity_ids.copy(), before.source("transactions").vocab("product_id")
    shutil.copy(held_back.held[1], held_back.dir)
    new_day_with_new_values(held_back)
    again = run_cache(cfg)  # compacts the first segment into the base, then appends
    assert again["appends"] == 2 and again["active_segments"] == 1 and not again["reused"]
    after = EventCache(cache_dir(cfg))
    assert not (after.path / "appends" / "0001").exists() and after.manifest["compacted"]
    np.testing.assert_array_equal(after.entity_ids[: len(ids)], ids)
    assert after.source("transactions").vocab("product_id")[: len(vocab)] == vocab
    from basemodel_pipeline.defs.cache.checks import manifest_problems

    assert manifest_problems(after.path)[0] == []
    assert_same_events(after, clean_build(cfg))
