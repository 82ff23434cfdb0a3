"""Recommendation that follows short-lived popularity: items launch and fade within days (the synthetic
generator's fast_items mode), so the popularity of the last 28 days is stale; the short windows, the items'
trends and ages feed the re-ranker, the best short window is a baseline of its own, and a scenario of new
items has no "repeat what they bought" to compare with."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.candidates.item_stats import WINDOWS, PopularityTable
from basemodel_pipeline.candidates.rerank import FEATURES
from basemodel_pipeline.candidates.selection import worse_on_test
from basemodel_pipeline.config import load_config
from basemodel_pipeline.dates import DAY
from basemodel_pipeline.demo.synthetic import write_tiny_dataset
from basemodel_pipeline.pipeline import run_cache, run_extract, run_finetune, run_predict, run_pretrain
from basemodel_pipeline.tasks import task_named
from basemodel_pipeline.workspace import cache_dir

NEW_ITEMS = {
    "name": "new_items",
    "task": "recommendation",
    "target": {
        "kind": "recommendation",
        "source": "transactions",
        "column": "product_id",
        "horizon_days": 7,
        "items": "new",
    },
}


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("fast")
    config = write_tiny_dataset(d, n_entities=150, fast_items=True)
    raw = yaml.safe_load(config.read_text())
    raw["scenarios"] = [
        NEW_ITEMS,
        {**NEW_ITEMS, "name": "next_items", "target": {**NEW_ITEMS["target"], "items": "all"}},
    ]
    raw["data_params"]["test_split_points"] = 2
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = load_config(config)
    run_extract(cfg)
    run_cache(cfg)
    run_pretrain(cfg)
    return cfg, {name: run_finetune(cfg, name) for name in ("new_items", "next_items")}


def _metrics(result: dict) -> dict:
    return json.loads((Path(result["path"]) / "metrics.json").read_text())


def test_popularity_windows_trends_and_ages_per_split_time(fast) -> None:
    cfg, _ = fast
    cache = EventCache(cache_dir(cfg))
    table = PopularityTable(cache, "transactions", "product_id")
    t = int(np.datetime64(cfg.data_params.validation_start, "s").astype(np.int64))
    snap = table.snapshot(t)
    src = cache.source("transactions")
    codes, ts = np.asarray(src.columns["product_id"]), np.asarray(src.ts)
    for w in WINDOWS:  # each window counts exactly the events of everyone in [t - w days, t)
        inside = (ts >= t - w * DAY) & (ts < t)
        want = np.bincount(codes[inside], minlength=len(snap.counts[w]) + 1)[1:]
        np.testing.assert_array_equal(snap.counts[w], want)
    first = np.full(len(snap.age), np.inf)
    np.minimum.at(first, codes.astype(np.int64) - 1, ts.astype(np.float64))
    seen = first < t
    np.testing.assert_allclose(snap.age[seen], (t - first[seen]) / DAY)
    assert np.isinf(snap.age[~seen]).all()  # launched later: no age yet
    newest = snap.newest(5)
    assert (snap.counts[7][newest] > 0).all() and np.all(np.diff(snap.age[newest]) >= 0)
    rising = snap.rising(5)
    assert (snap.counts[3][rising] >= 2).all()
    assert snap.top(3, 1).tolist() == np.lexsort((snap.rank, -snap.counts[1]))[:3].tolist()


def test_short_windows_beat_the_28_day_popularity_when_items_fade_within_days(fast) -> None:
    _, results = fast
    m = _metrics(results["next_items"])
    assert {"popularity", "recent_popularity", "repeat_purchases", "cooccurrence", "reranker"} <= set(
        m["test"]
    )
    assert m["test"]["recent_popularity"] > m["test"]["popularity"]  # the launch-and-fade signal
    validation = m["selection"]["validation"]
    best = max(validation, key=lambda n: validation[n])
    assert validation[m["published"]] == pytest.approx(validation[best])  # published: best on validation
    assert m["test_worse_than"] == worse_on_test(task_named("recommendation"), m["test"])


def test_new_items_have_no_repeat_baseline_and_the_reranker_reads_the_trends(fast) -> None:
    cfg, results = fast
    m = _metrics(results["new_items"])
    assert m["test"]["repeat_purchases"] is None and "repeat_purchases" not in m["selection"]["validation"]
    assert "nothing to repeat" in m["not_applicable"]["repeat_purchases"]
    assert {"recent_popularity", "cooccurrence"} <= set(m["selection"]["validation"])
    assert {"item_pop_1d", "item_trend_1d_7d", "item_age_days", "item_cooc", "item_cooc_share"} <= set(
        FEATURES
    )
    report = (Path(results["new_items"]["path"]) / "report.html").read_text()
    assert "repeat_purchases: not applicable" in report
    out = run_predict(cfg, "new_items")  # what was published scores every entity
    assert out["entities"] > 0


def test_worse_on_test_names_the_baselines_that_beat_the_published_model() -> None:
    task = task_named("recommendation")
    test = {"model": 0.30, "popularity": 0.20, "recent_popularity": 0.35, "repeat_purchases": None}
    assert worse_on_test(task, test) == ["recent_popularity"]
    rmse = task_named("regression")
    assert worse_on_test(rmse, {"model": 1.2, "popularity": 1.1, "lightgbm_aggregates": 1.3}) == [
        "popularity"
    ]
    assert worse_on_test(task, {"model": float("nan"), "popularity": 0.2}) == []


def test_a_reranker_trained_on_other_features_is_refused_in_one_line() -> None:
    from types import SimpleNamespace

    from basemodel_pipeline.candidates.loading import load_ranking_candidate
    from basemodel_pipeline.errors import UserError

    ctx = SimpleNamespace(scenario=SimpleNamespace(name="next_items"))
    older = {"kind": "reranker", "features": list(FEATURES[:18])}
    assert load_ranking_candidate({"kind": "cooccurrence"}, {}, ctx).name == "cooccurrence"
    with pytest.raises(
        UserError, match=r"re-ranker was trained on other features .*basemodel finetune CONFIG -s next_items"
    ):
        load_ranking_candidate(older, {}, ctx)
