"""Sketch features: the incremental one-pass computation equals a brute-force sum over each history."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import load_config
from basemodel_pipeline.dates import DAY
from basemodel_pipeline.features.sketch import FeatureEncoder
from basemodel_pipeline.pipeline import run_cache, run_extract


@pytest.fixture(scope="module")
def cache(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> EventCache:
    import shutil

    d = tmp_path_factory.mktemp("feat")
    shutil.copytree(tiny_dataset.parent / "data", d / "data")
    cfg = load_config(shutil.copy(tiny_dataset, d / "config.yaml"))
    run_extract(cfg)
    return EventCache(run_cache(cfg)["path"])


def brute_force(enc: FeatureEncoder, cache: EventCache, e: int, t: int, half_life: float) -> np.ndarray:
    plan = enc.sources[0]
    src = cache.source(plan.name)
    lo, hi = src.offsets[e], src.offsets[e + 1]
    rows = np.arange(lo, hi)[np.asarray(src.ts[lo:hi]) < t]
    chans, vals = enc.event_channels(plan, src, rows)
    w = np.exp(-(t - np.asarray(src.ts)[rows]) / DAY * np.log(2) / half_life)
    raw = np.zeros(plan.channels)
    np.add.at(raw, chans.ravel(), (vals * w[:, None]).ravel())
    out = np.log1p(np.maximum(raw, 0))
    num = plan.numeric_channels()[1:]
    out[num] = np.sign(raw[num]) * np.log1p(np.abs(raw[num]))
    return out


def test_incremental_sketch_equals_brute_force(cache: EventCache) -> None:
    enc = FeatureEncoder.fit(cache, [7.0, 30.0], max_direct_vocab=8, partitions=2, buckets=4)
    assert any(c.kind == "hashed" for c in enc.sources[0].columns)
    assert any(c.kind == "direct" for c in enc.sources[0].columns)
    rng = np.random.default_rng(1)
    src = cache.source("transactions")
    lo, hi = int(src.ts.min()), int(src.ts.max())
    e = rng.integers(0, cache.n_entities, 200)
    t = rng.integers(lo, hi + 30 * DAY, 200)
    e[:5], t[:5] = e[5], t[5]  # duplicates of one query
    X = enc.history(cache, e, t, chunk=37)  # small chunks exercise the entity-boundary split
    assert X.shape == (200, enc.dim)
    C = enc.sources[0].channels
    for q in range(0, 200, 7):
        for h, half_life in enumerate(enc.half_lives_days):
            np.testing.assert_allclose(
                X[q, h * C : (h + 1) * C],
                brute_force(enc, cache, e[q], t[q], half_life),
                rtol=1e-4,
                atol=1e-5,
            )
    np.testing.assert_array_equal(X[0], X[5])


def test_encoder_round_trips_through_json(cache: EventCache) -> None:
    import json

    enc = FeatureEncoder.fit(cache, [7.0], max_direct_vocab=8, partitions=2, buckets=4, seed=3)
    again = FeatureEncoder.from_dict(json.loads(json.dumps(enc.to_dict())))
    e = np.arange(cache.n_entities)
    t = np.full(len(e), int(cache.source("transactions").ts.max()))
    np.testing.assert_array_equal(enc.history(cache, e, t), again.history(cache, e, t))


def test_no_history_gives_empty_sketch(cache: EventCache) -> None:
    enc = FeatureEncoder.fit(cache, [7.0], max_direct_vocab=8, partitions=2, buckets=4)
    X = enc.history(cache, np.array([0]), np.array([0]))
    C = enc.sources[0].channels
    assert np.all(X[0, :C] == 0)
    assert X[0, C + 3] == 0.0  # has-history flag


@pytest.mark.parametrize("sorted_queries", [True, False])
def test_history_written_into_a_half_precision_array_equals_the_float_features(
    cache: EventCache, sorted_queries: bool
) -> None:
    """Fine-tuning featurises straight into its float16 feature matrix: the same values as the float32
    features rounded to half precision, whether the queries come sorted (one copy per chunk) or not."""
    import torch

    enc = FeatureEncoder.fit(cache, [7.0, 30.0], max_direct_vocab=8, partitions=2, buckets=4)
    rng = np.random.default_rng(2)
    src = cache.source("transactions")
    e = rng.integers(0, cache.n_entities, 300)
    t = rng.integers(int(src.ts.min()), int(src.ts.max()) + 30 * DAY, 300)
    if sorted_queries:
        order = np.lexsort((t, e))
        e, t = e[order], t[order]
    expected = enc.history(cache, e, t, chunk=41).astype(np.float16)
    X = np.full((300, enc.dim), np.nan, np.float16)
    enc.history_t(cache, e, t, 41, torch.device("cpu"), out=torch.from_numpy(X))
    np.testing.assert_array_equal(X, expected)


@pytest.mark.parametrize("half_out", [False, True])
def test_squash_is_log1p_of_counts_and_signed_log1p_of_numeric_sums(half_out: bool) -> None:
    """The trunk's inputs from decayed sums: log1p of the (non-negative) counts, sign x log1p|x| of numeric
    sums, channel 0 always a count; written into a strided half-precision block when given one."""
    import torch

    from basemodel_pipeline.features.transforms import squash, unsquash

    gen = torch.Generator().manual_seed(3)
    x = torch.randn((50, 3, 9), generator=gen) * 40
    numeric = [0, 2, 5, 6]
    expected = torch.log1p(x.clamp_min(0.0))
    for c in (2, 5, 6):
        expected[..., c] = torch.sign(x[..., c]) * torch.log1p(x[..., c].abs())
    if half_out:
        X = torch.full((50, 40), float("nan"), dtype=torch.float16)
        got = squash(x.clone(), numeric, X[:, 7 : 7 + 27].view(50, 3, 9))
        torch.testing.assert_close(X[:, 7:34].view(50, 3, 9), expected.half(), rtol=0, atol=0)
        assert torch.isnan(X[:, :7]).all() and torch.isnan(X[:, 34:]).all()  # nothing outside the block
    else:
        got = squash(x.clone(), numeric)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        back = unsquash(got, numeric)
        counts = [c for c in range(9) if c not in (2, 5, 6)]
        keep = torch.ones_like(x, dtype=torch.bool)
        keep[..., counts] = x[..., counts] >= 0  # negative counts squash to 0
        torch.testing.assert_close(back[keep], x[keep], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_tabular_aggregates_are_the_half_precision_features_unsquashed(dtype: type) -> None:
    """The aggregates the LightGBM candidates read: the aggregate block rounded to float16 (what fine-tuning
    stores) and un-squashed, sign(a) x expm1(|a|), for any rows of a float16 or float32 feature matrix."""
    from types import SimpleNamespace

    from basemodel_pipeline.candidates.inputs import RowView, tabular_from_features

    rng = np.random.default_rng(4)
    X = (rng.normal(size=(60, 13)) * 4).astype(dtype)
    X[3, 9], X[4, 10], X[5, 11] = 0.0, -0.0, np.nan
    enc = SimpleNamespace(aggregate_offset=8)
    rows = np.array([5, 3, 3, 40, 4, 0])
    for view, picked in ((RowView(X), X), (RowView(X, rows), X[rows])):
        block = picked[:, 8:].astype(np.float16).astype(np.float32)
        expected = np.sign(block) * np.expm1(np.abs(block))
        got = tabular_from_features(enc, view)  # type: ignore[arg-type]
        assert got.dtype == np.float32 and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)


def test_decayed_sums_are_written_into_a_block_of_the_callers_sums() -> None:
    """Each query's sum over its rows of value x exp(-dt x rate), per rate and channel: the same numbers
    returned or written into a block of a larger [n, R, C] array (whatever the block held before)."""
    import torch

    from basemodel_pipeline.features.kernels import decayed_sums

    gen = torch.Generator().manual_seed(5)
    m, K, n, C = 40, 2, 6, 4
    values = torch.rand((m, K), generator=gen)
    chans = torch.randint(0, C, (m, K), generator=gen)
    owner = torch.sort(torch.randint(0, n, (m,), generator=gen)).values
    dt = torch.randint(0, 30 * DAY, (m,), generator=gen)
    rates = torch.tensor([np.log(2) / (7 * DAY), np.log(2) / (30 * DAY)])
    expected = torch.zeros((n, 2, C), dtype=torch.float64)
    for i in range(m):
        for k in range(K):
            for r in range(2):
                expected[owner[i], r, chans[i, k]] += float(values[i, k]) * np.exp(
                    -float(dt[i]) * float(rates[r])
                )
    got = decayed_sums(values, owner, dt, chans, rates, n, C)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)
    block = torch.full((n + 3, 2, C), float("nan"))
    decayed_sums(values, owner, dt, chans, rates, n, C, out=block[2 : 2 + n])
    assert torch.equal(block[2 : 2 + n], got)
    assert torch.isnan(block[:2]).all() and torch.isnan(block[2 + n :]).all()
