"""Item co-occurrence: "those who had your items also had these". The neighbours of an item are the items had
by the same entities in the weeks before a split time (cosine similarity); an entity's score of an item sums
its similarity to the entity's own items. On the synthetic data households buy within the departments they
prefer, so the items co-bought with theirs find their next new items better than what is popular overall."""

from __future__ import annotations

import numpy as np
import pytest

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.candidates.item_stats import (
    COOC_DAYS,
    COOC_ITEMS,
    NEIGHBOURS,
    CooccurrenceTable,
    PopularityTable,
    item_history,
)
from basemodel_pipeline.config import load_config
from basemodel_pipeline.dates import DAY
from basemodel_pipeline.demo.synthetic import write_tiny_dataset
from basemodel_pipeline.pipeline import run_cache, run_extract
from basemodel_pipeline.workspace import cache_dir


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory):
    cfg = load_config(write_tiny_dataset(tmp_path_factory.mktemp("cooc"), n_entities=300))
    run_extract(cfg)
    run_cache(cfg)
    t = int(np.datetime64(cfg.data_params.validation_start, "s").astype(np.int64))
    with EventCache(cache_dir(cfg)) as c:
        yield c, t


def _entity_items(cache: EventCache, t0: int, t1: int) -> np.ndarray:
    """[n_entities, n_items] events of each entity with each item in [t0, t1)."""
    src = cache.source("transactions")
    n_items = src.info["product_id"].vocab_size
    owner = np.repeat(np.arange(cache.n_entities), np.diff(src.offsets))
    ts, item = np.asarray(src.ts), np.asarray(src.columns["product_id"]).astype(np.int64) - 1
    inside = (ts >= t0) & (ts < t1) & (item >= 0)
    M = np.zeros((cache.n_entities, n_items))
    np.add.at(M, (owner[inside], item[inside]), 1.0)
    return M


def test_neighbours_are_the_cosine_similarity_of_items_had_by_the_same_entities(cache) -> None:
    c, t = cache
    counts = _entity_items(c, t - COOC_DAYS * DAY, t)
    X = np.zeros_like(counts)
    for e in range(len(counts)):  # each entity's COOC_ITEMS most frequent items (ties: the lower index)
        had = np.flatnonzero(counts[e])
        X[e, had[np.lexsort((had, -counts[e, had]))[:COOC_ITEMS]]] = 1.0
    assert (counts > 0).sum(axis=1).max() > COOC_ITEMS  # the cut is exercised
    had = X.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = (X.T @ X) / np.sqrt(np.outer(had, had))
    np.fill_diagonal(cos, 0.0)
    cos = np.nan_to_num(cos)
    N = CooccurrenceTable(c, "transactions", "product_id").neighbours(t).toarray()
    assert (N > 0).sum(axis=1).max() <= NEIGHBOURS and np.all(np.diag(N) == 0)
    kept = N > 0
    np.testing.assert_allclose(N[kept], cos[kept])  # every kept pair holds its similarity
    for i in np.flatnonzero(kept.any(axis=1))[:20]:  # and nothing left out beats the weakest kept one
        assert cos[i][~kept[i]].max(initial=0.0) <= N[i][kept[i]].min() + 1e-12


def test_items_co_bought_with_theirs_find_new_items_better_than_popularity(cache) -> None:
    c, t = cache
    src = c.source("transactions")
    n_items = src.info["product_id"].vocab_size
    future = _entity_items(c, t, t + 7 * DAY) > 0
    past = _entity_items(c, 0, t) > 0
    wanted = future & ~past  # items they buy next week and never had
    entity = np.flatnonzero(wanted.any(axis=1) & past.any(axis=1))
    assert len(entity) >= 50
    time = np.full(len(entity), t)
    hist = item_history(c, "transactions", "product_id", entity, time)
    keys, score = CooccurrenceTable(c, "transactions", "product_id").scores(time, hist, 0, len(entity))
    S = np.zeros((len(entity), n_items))
    S[keys // n_items, keys % n_items] = score
    S[past[entity]] = -np.inf
    assert np.all(np.diff(keys) > 0)  # sorted, one score per (row, item)
    popular = PopularityTable(c, "transactions", "product_id").snapshot(t).counts[28]
    P = np.where(past[entity], -np.inf, popular[None, :])

    def hits(scores: np.ndarray) -> float:
        top = np.argsort(-scores, axis=1, kind="stable")[:, :10]
        return float(np.take_along_axis(wanted[entity], top, axis=1).any(axis=1).mean())

    print(f"hit rate@10 of new items: co-occurrence {hits(S):.3f}, popularity {hits(P):.3f}")
    assert hits(S) > hits(P) + 0.05
