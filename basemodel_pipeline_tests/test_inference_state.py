"""The per-entity state (inference/state.py): built once, advanced with new days, equal to a full recompute."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from basemodel_pipeline import pipeline
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import load_config
from basemodel_pipeline.dates import epoch_seconds
from basemodel_pipeline.features.sketch import FeatureEncoder
from basemodel_pipeline.inference.state import ensure_state
from basemodel_pipeline.workspace import cache_dir


def _encoder(cache: EventCache) -> FeatureEncoder:
    return FeatureEncoder.fit(
        cache, [7.0, 30.0], max_direct_vocab=8, partitions=2, buckets=8, aggregates=True,
        fourier_scales=[0.5, 2.0], calendar=True,
    )  # fmt: skip


@pytest.fixture
def built(tiny_config: Path):
    cfg = load_config(tiny_config)
    pipeline.run_extract(cfg)
    pipeline.run_cache(cfg)
    cache = EventCache(cache_dir(cfg))
    return cfg, cache, _encoder(cache)


def test_advanced_state_equals_a_full_recompute(built) -> None:
    cfg, cache, enc = built
    t0, t1 = cache.max_date - dt.timedelta(days=30), cache.max_date + dt.timedelta(days=1)
    first, info0 = ensure_state(Path(cfg.workspace), cache, enc.to_dict(), t0)
    assert info0["state"] == "built" and first.as_of == t0
    mid, info_mid = ensure_state(Path(cfg.workspace), cache, enc.to_dict(), t0 + dt.timedelta(days=11))
    assert info_mid["state"] == "advanced" and mid.manifest["updates"] == 1  # two steps: t0 -> +11 d -> t1
    state, info1 = ensure_state(Path(cfg.workspace), cache, enc.to_dict(), t1)
    assert info1["state"] == "advanced" and info1["new_events"] > 0
    entity = np.arange(cache.n_entities)
    direct = enc.history(cache, entity, np.full(len(entity), epoch_seconds(t1)))
    got = np.asarray(state.features, np.float32)
    assert got.shape == direct.shape
    # float16 storage: equal within its rounding (a few ulps of values up to ~12)
    np.testing.assert_allclose(got, direct, rtol=4e-3, atol=4e-3)
    # a state built from scratch at t1 agrees with the advanced one
    again, info2 = ensure_state(Path(cfg.workspace), cache, enc.to_dict(), t1)
    assert info2["state"] == "reused"
    np.testing.assert_array_equal(np.asarray(again.features), np.asarray(state.features))


def test_state_is_rebuilt_when_old_history_changes(built) -> None:
    cfg, cache, enc = built
    t1 = cache.max_date + dt.timedelta(days=1)
    ensure_state(Path(cfg.workspace), cache, enc.to_dict(), t1)
    # a late-arriving event on an old day: the cache is rebuilt and the stored state no longer describes it
    src = cfg.sources("event")[0]
    data = Path(cfg.workspace) / "data" / "transactions.parquet"
    table, day = _with_extra_row(pq.read_table(data), src.date_column.name)
    pq.write_table(table, data)
    pipeline.run_extract(cfg, days=(day, day + dt.timedelta(days=1)))  # re-extract the late day
    pipeline.run_cache(cfg)
    cache2 = EventCache(cache_dir(cfg))
    state, info = ensure_state(
        Path(cfg.workspace), cache2, enc.to_dict(), cache2.max_date + dt.timedelta(days=1)
    )
    assert info["state"] == "built"
    assert (
        sum(cache2.source(n).n_events for n in cache2.sources)
        == sum(cache.source(n).n_events for n in cache.sources) + 1
    )
    entity = np.arange(cache2.n_entities)
    direct = enc.history(cache2, entity, np.full(len(entity), epoch_seconds(state.as_of)))
    np.testing.assert_allclose(np.asarray(state.features, np.float32), direct, rtol=4e-3, atol=4e-3)


def _with_extra_row(table: pa.Table, date_column: str) -> tuple[pa.Table, dt.date]:
    """The table plus a copy of its last row moved 40 days into the past, and that row's day."""
    row = table.slice(table.num_rows - 1, 1).to_pylist()[0]
    row[date_column] = row[date_column] - dt.timedelta(days=40)
    late = pa.Table.from_pylist([row], schema=table.schema)
    return pa.concat_tables([table, late]), row[date_column].date()
