"""Featuriser building blocks: binary search, row chunks, Cleora embeddings, DLSH tables, learned encoders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from basemodel_pipeline.cache.store import EventCache, bisect_rows
from basemodel_pipeline.config import load_config
from basemodel_pipeline.features.cleora import cleora, incidence
from basemodel_pipeline.features.dlsh import dlsh_table, weighted_median
from basemodel_pipeline.features.kernels import entity_chunks, row_chunks, scan
from basemodel_pipeline.features.sketch import FeatureEncoder
from basemodel_pipeline.pipeline import run_cache, run_extract


@pytest.fixture(scope="module")
def cache(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> EventCache:
    d = tmp_path_factory.mktemp("kernels")
    shutil.copytree(tiny_dataset.parent / "data", d / "data")
    cfg = load_config(shutil.copy(tiny_dataset, d / "config.yaml"))
    run_extract(cfg)
    return EventCache(run_cache(cfg)["path"])


def test_bisect_rows_matches_searchsorted_per_entity() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 30, 50)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ts = np.concatenate([np.sort(rng.integers(0, 100, n)) for n in lengths]).astype(np.int64)
    e = rng.integers(0, 50, 500)
    t = rng.integers(-5, 110, 500)
    got = bisect_rows(*(torch.from_numpy(a) for a in (ts, offsets, e, t))).numpy()
    want = [
        offsets[q] + np.searchsorted(ts[offsets[q] : offsets[q + 1]], tq) for q, tq in zip(e, t, strict=True)
    ]
    np.testing.assert_array_equal(got, want)


def test_the_decayed_scan_is_the_recurrence_along_each_entitys_queries_bit_for_bit() -> None:
    """seg[j] += exp(-(t_j - t_{j-1}) * rate) * seg[j-1] within each run of one entity's queries (ragged runs,
    runs of one, a long run), computed one query at a time in the same float32 arithmetic."""
    rng = np.random.default_rng(0)
    lengths = np.array([1, 5, 1, 44, 3, 3, 0, 17, 2, 1, 9])
    lengths = lengths[lengths > 0]
    first = np.concatenate([[True] + [False] * (n - 1) for n in lengths])
    t = np.concatenate([np.cumsum(rng.integers(1, 20, n)) * 86400 for n in lengths]).astype(np.int64)
    rates = torch.tensor([np.log(2) / (h * 86400) for h in (7.0, 30.0, 120.0)])
    seg = torch.from_numpy(rng.normal(size=(len(t), 3, 5)).astype(np.float32))
    want = seg.clone()
    gaps = torch.zeros(len(t), dtype=torch.float32)
    gaps[1:] = torch.from_numpy(t[1:] - t[:-1]).to(torch.float32)
    decay = torch.exp(-gaps.unsqueeze(1) * rates.unsqueeze(0)).unsqueeze(2)
    for j in range(len(t)):
        if not first[j]:
            want[j] += decay[j] * want[j - 1]
    got = scan(seg, torch.from_numpy(t), torch.from_numpy(first), rates)
    assert got is seg  # in place
    assert torch.equal(got, want)


def test_row_chunks_cover_queries_and_respect_entities_and_budget() -> None:
    rng = np.random.default_rng(1)
    entity = np.sort(rng.integers(0, 40, 300))
    lengths = torch.from_numpy(rng.integers(0, 50, 300))
    first = torch.from_numpy(np.r_[True, entity[1:] != entity[:-1]])
    chunks = row_chunks(lengths, first, max_rows=400)
    assert chunks[0][0] == 0 and chunks[-1][1] == 300
    assert all(a == b for (_, a), (b, _) in zip(chunks, chunks[1:], strict=False))
    for a, b in chunks:
        assert bool(first[a])  # never cuts an entity's queries
        one_entity = len(set(entity[a:b])) == 1
        assert int(lengths[a:b].sum()) <= 400 or one_entity
    assert entity_chunks(entity, 37)[-1][1] == 300


def test_cleora_puts_co_occurring_values_together() -> None:
    # two communities of values: 1..10 co-occur among themselves, 11..20 among themselves
    rng = np.random.default_rng(2)
    rows, cols = [], []
    for edge in range(400):
        lo = 1 if edge % 2 else 11
        members = rng.choice(np.arange(lo, lo + 10), 3, replace=False)
        rows += [edge] * 3
        cols += list(members)
    B = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(400, 21))
    E = cleora(B, dim=16, iterations=3, seed=0)
    np.testing.assert_allclose(np.linalg.norm(E, axis=1), 1.0, rtol=1e-5)
    sim = E @ E.T
    within = (sim[1:11, 1:11].sum() - 10) / 90
    across = sim[1:11, 11:21].mean()
    assert within > across + 0.5
    np.testing.assert_array_equal(E, cleora(B, dim=16, iterations=3, seed=0))  # deterministic
    table = dlsh_table(E, np.asarray(B.sum(0)).ravel(), partitions=4, width=8, seed=0)
    assert table.shape == (4, 21) and table.min() >= 0 and table.max() < 8 and np.all(table[:, 0] == 0)
    same_within = np.mean(
        [np.mean(table[:, i] == table[:, j]) for i in range(1, 11) for j in range(1, 11) if i != j]
    )
    same_across = np.mean([np.mean(table[:, i] == table[:, j]) for i in range(1, 11) for j in range(11, 21)])
    assert same_within > same_across


def test_dlsh_rejects_widths_that_are_not_powers_of_two() -> None:
    with pytest.raises(ValueError, match="power-of-two"):
        dlsh_table(np.zeros((3, 2), np.float32), np.ones(3), partitions=1, width=12, seed=0)


def test_weighted_median() -> None:
    x = np.array([[1.0], [2.0], [3.0], [10.0]])
    assert weighted_median(x, np.array([1.0, 1.0, 1.0, 1.0]))[0] == 2.0
    assert weighted_median(x, np.array([1.0, 1.0, 1.0, 10.0]))[0] == 10.0


def test_incidence_counts_each_value_once_per_basket(cache: EventCache) -> None:
    src = cache.source("transactions")
    col = next(c for c, i in src.info.items() if i.type == "categorical")
    B = incidence(src, col, max_events=10**9, seed=0)
    assert B.shape[1] == src.info[col].vocab_size + 1
    assert set(np.unique(B.data)) == {1.0}
    assert B[:, 0].nnz == 0  # the missing value is no vertex


def test_dlsh_encoder_round_trips_through_json(cache: EventCache) -> None:
    enc = FeatureEncoder.fit(cache, [7.0], max_direct_vocab=4, partitions=2, buckets=4, sketch="dlsh")
    hashed = [c for s in enc.sources for c in s.columns if c.kind == "hashed"]
    assert hashed and all(c.method == "dlsh" and c.table_b64 for c in hashed)
    again = FeatureEncoder.from_dict(json.loads(json.dumps(enc.to_dict())))
    e = np.arange(cache.n_entities)
    t = np.full(len(e), int(cache.source("transactions").ts.max()))
    np.testing.assert_array_equal(enc.history(cache, e, t), again.history(cache, e, t))


def test_calendar_and_fourier_channels(cache: EventCache) -> None:
    import datetime as dt

    enc = FeatureEncoder.fit(
        cache, [7.0], max_direct_vocab=4, partitions=2, buckets=4, fourier_scales=[0.5, 2.0], calendar=True
    )
    plan = enc.sources[0]
    src = cache.source(plan.name)
    rows = np.arange(0, src.n_events, max(1, src.n_events // 25))
    chans, vals = enc.event_channels(plan, src, rows)
    k = 1
    for col in plan.columns:
        block_c, block_v = chans[:, k : k + col.values_per_event], vals[:, k : k + col.values_per_event]
        if col.kind == "weekday":
            want = [dt.datetime.fromtimestamp(int(src.ts[r]), dt.UTC).weekday() for r in rows]
            np.testing.assert_array_equal(block_c[:, 0] - col.offset, want)
        elif col.kind == "hour":
            want = [dt.datetime.fromtimestamp(int(src.ts[r]), dt.UTC).hour // 4 for r in rows]
            np.testing.assert_array_equal(block_c[:, 0] - col.offset, want)
        elif col.kind == "fourier":
            x = np.asarray(src.columns[col.name][rows], np.float64)
            s = np.sign(x) * np.log1p(np.abs(x))
            want = np.column_stack([np.sin(0.5 * s), np.sin(2.0 * s), np.cos(0.5 * s), np.cos(2.0 * s)])
            np.testing.assert_allclose(block_v, want, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(block_c[0], col.offset + np.arange(4))
        k += col.values_per_event
    kinds = {c.kind for c in plan.columns}
    assert {"weekday", "fourier"} <= kinds
    assert chans.max() < plan.channels


def test_direct_and_incremental_history_sums_agree_and_auto_picks_the_cheaper(cache: EventCache) -> None:
    """Summing each query's whole history (direct) and the segments + decayed scan (incremental) give the same
    decayed sums. auto: daily split points over the data's first two weeks (a few events before each) are
    summed directly; 30 split points over the whole year of the tiny data (long histories) incrementally."""
    from basemodel_pipeline.features import kernels

    enc = FeatureEncoder.fit(cache, [7.0, 30.0], max_direct_vocab=4, partitions=2, buckets=4)
    plan = enc.sources[0]
    st = kernels.source_tensors(cache.source(plan.name), torch.device("cpu"))
    ts = np.asarray(cache.source(plan.name).ts)
    rates = enc._rates(torch.device("cpu"))

    def channel_fn(rows, owner, a):
        return enc.event_channels_t(plan, st, rows)

    def queries(first: int, last: int) -> tuple[torch.Tensor, torch.Tensor]:
        times = np.linspace(first, last, 30).astype(np.int64)
        e = np.repeat(np.arange(cache.n_entities), len(times))
        return torch.from_numpy(e), torch.from_numpy(np.tile(times, cache.n_entities))

    real, scanned = kernels.scan, []
    kernels.scan = lambda *args: scanned.append(1) or real(*args)
    try:
        for (first, last), expected in (
            ((ts.min(), ts.min() + 14 * 86400), "direct"),
            ((ts.min(), ts.max() + 86400), "incremental"),
        ):
            e, t = queries(first, last)
            sums = {
                mode: kernels.incremental_sums(st, e, t, rates, plan.channels, channel_fn, mode)[0]
                for mode in ("direct", "incremental", "auto")
            }
            torch.testing.assert_close(sums["direct"], sums["incremental"], rtol=1e-5, atol=1e-4)
            assert sums["direct"].abs().sum() > 0
            assert torch.equal(sums["auto"], sums[expected]), expected
            scanned.clear()
            kernels.incremental_sums(st, e, t, rates, plan.channels, channel_fn)
            assert bool(scanned) == (expected == "incremental")
    finally:
        kernels.scan = real
