"""Evaluation: metrics, aggregate features on hand-made CSR arrays, baselines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from basemodel_pipeline.cache.store import ColumnInfo, EventCache, EventSource
from basemodel_pipeline.dates import DAY
from basemodel_pipeline.evaluation.baselines import class_shares, decayed_history_items, recent_activity
from basemodel_pipeline.evaluation.gbm import fit_gbm
from basemodel_pipeline.evaluation.metrics import (
    auroc,
    average_precision,
    log_loss,
    macro_auroc,
    micro_auroc,
)
from basemodel_pipeline.features.aggregates import (
    AGGREGATE_NO_HISTORY_DAYS,
    aggregate_features,
    categorical_feature_indices,
    feature_names,
)
from basemodel_pipeline.tasks import task_named

T = 200 * DAY  # split time, a UTC midnight


def _cache() -> EventCache:
    """3 entities: 0 with 9 events (two at/after T), 1 with none, 2 with one event 3 days before T."""
    ts0 = [
        T - 100 * DAY,
        T - 40 * DAY,
        T - 30 * DAY,
        T - 20 * DAY,
        T - 20 * DAY + 3600,
        T - 5 * DAY,
        T - 1,
        T,
        T + 2 * DAY,
    ]
    ts = np.array([*ts0, T - 3 * DAY], dtype=np.int64)
    amount = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], dtype=np.float32)
    cat = np.array([1, 1, 2, 1, 3, 2, 1, 1, 1, 3], dtype=np.int32)
    big = np.array([5, 6, 7, 8, 9, 10, 11, 12, 13, 14], dtype=np.int32)  # vocab > 64: no top-value features
    src = EventSource(
        name="ev",
        offsets=np.array([0, 9, 9, 10], dtype=np.int64),
        ts=ts,
        columns={"amount": amount, "cat": cat, "big": big},
        info={
            "amount": ColumnInfo("amount", "numeric"),
            "cat": ColumnInfo("cat", "categorical", 3),
            "big": ColumnInfo("big", "categorical", 100),
        },
    )
    cache = EventCache.__new__(EventCache)
    cache.n_entities = 3
    cache.sources = {"ev": src}
    cache.attribute_info = {
        "seg": ColumnInfo("seg", "categorical", 2),
        "score": ColumnInfo("score", "numeric"),
    }
    cache.attributes = {"seg": np.array([1, 0, 2], np.int32), "score": np.array([0.5, 1.5, 2.5], np.float32)}
    return cache


def _row(X: np.ndarray, names: list[str], i: int) -> dict[str, float]:
    return dict(zip(names, X[i].tolist(), strict=True))


def test_metrics_known_values() -> None:
    assert auroc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.75)
    assert math.isnan(auroc([1, 1, 1], [0.1, 0.2, 0.3]))
    Y = np.array([[0, 1, 0], [0, 0, 0], [1, 1, 0], [1, 0, 0]])
    S = np.array([[0.1, 0.9, 0.1], [0.2, 0.1, 0.2], [0.8, 0.2, 0.3], [0.3, 0.5, 0.4]])
    # class 0: 1.0; class 1: positives 0.9, 0.2 vs negatives 0.1, 0.5 -> 0.75; class 2 has no positive
    assert macro_auroc(Y, S) == pytest.approx((1.0 + 0.75) / 2)
    assert task_named("multilabel").primary(Y, S) == macro_auroc(Y, S)
    assert task_named("binary").primary([0, 1], [0.2, 0.1]) == 0.0
    assert task_named("binary").primary_metric == "auroc"
    assert task_named("multilabel").primary_metric == "macro_auroc"
    assert 0.0 <= micro_auroc(Y, S) <= 1.0
    assert average_precision([0, 1, 1, 0], [0.1, 0.9, 0.4, 0.5]) == pytest.approx((1 + 2 / 3) / 2)
    assert log_loss([1, 0], [0.8, 0.3]) == pytest.approx(-(math.log(0.8) + math.log(0.7)) / 2)
    with pytest.raises(ValueError):
        task_named("ranking")


def test_aggregate_windows_recency_and_boundaries() -> None:
    cache = _cache()
    X, names = aggregate_features(cache, np.array([0, 1, 2, 0]), np.array([T, T, T, T - 100 * DAY]))
    assert X.dtype == np.float32 and X.shape == (4, len(names)) and names == feature_names(cache)
    e0 = _row(X, names, 0)
    # events exactly at T (and after) are excluded; an event exactly at T - 30d is inside the 30-day window
    expect = {"7d": (2, 13, 2), "30d": (5, 25, 4), "90d": (6, 27, 5), "all": (7, 28, 6)}
    for w, (count, total, days) in expect.items():
        assert (e0[f"ev.count_{w}"], e0[f"ev.amount.sum_{w}"], e0[f"ev.days_{w}"]) == (count, total, days), w
    # top values of "cat" in the last 30 days (codes 2, 1, 3, 2, 1); "big" has too large a vocabulary
    assert [e0[f"ev.cat#{k}.count_30d"] for k in (1, 2, 3)] == [2, 2, 1]
    assert e0["ev.cat#3.share_30d"] == pytest.approx(0.2)
    assert e0["ev.cat#1.count_90d"] == 3
    assert not any(n.startswith("ev.big#") for n in names)
    assert e0["ev.recency_days"] == pytest.approx(1 / DAY)
    assert e0["ev.tenure_days"] == pytest.approx(100)
    assert e0["ev.mean_gap_days_all"] == pytest.approx(99 / 5)
    assert e0["ev.mean_gap_days_90d"] == pytest.approx(39 / 4)
    assert e0["ev.amount.per_active_day_all"] == pytest.approx(28 / 6)
    assert e0["ev.frequency_days_per_30d"] == pytest.approx(6 * 30 / 100)
    assert (e0["attr.seg"], e0["attr.score"]) == (1, 0.5)
    e1 = _row(X, names, 1)  # no events at all
    assert e1["ev.count_all"] == 0 and e1["ev.days_all"] == 0 and e1["ev.amount.sum_all"] == 0
    assert e1["ev.recency_days"] == AGGREGATE_NO_HISTORY_DAYS and e1["ev.tenure_days"] == 0
    assert math.isnan(e1["ev.mean_gap_days_all"]) and e1["attr.seg"] == 0
    e2 = _row(X, names, 2)
    assert (e2["ev.count_7d"], e2["ev.amount.sum_7d"], e2["ev.recency_days"]) == (1, 10, 3)
    e3 = _row(X, names, 3)  # split exactly at the first event: nothing before it
    assert e3["ev.count_all"] == 0 and e3["ev.recency_days"] == AGGREGATE_NO_HISTORY_DAYS
    assert categorical_feature_indices(cache, names) == [names.index("attr.seg")]


def test_active_days_when_a_window_starts_inside_a_day() -> None:
    cache = _cache()
    # 7-day window [T - 20d + 30min, T - 13d + 30min) holds only the second event of day T - 20d
    X, names = aggregate_features(cache, np.array([0]), np.array([T - 13 * DAY + 1800]))
    e0 = _row(X, names, 0)
    assert (e0["ev.count_7d"], e0["ev.days_7d"], e0["ev.amount.sum_7d"]) == (1, 1, 5)
    assert e0["ev.days_all"] == 4  # T-100d, T-40d, T-30d, T-20d


def test_aggregates_match_a_brute_force_loop() -> None:
    rng = np.random.default_rng(0)
    n_ent = 50
    counts = rng.integers(0, 40, n_ent)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    ts = np.concatenate([np.sort(rng.integers(0, 300 * DAY, c)) for c in counts]).astype(np.int64)
    amount = rng.random(len(ts)).astype(np.float32)
    cache = EventCache.__new__(EventCache)
    cache.n_entities, cache.attribute_info, cache.attributes = n_ent, {}, {}
    cache.sources = {
        "s": EventSource("s", offsets, ts, {"a": amount}, {"a": ColumnInfo("a", "numeric")}),
    }
    ent = rng.integers(0, n_ent, 300)
    time = rng.integers(0, 320 * DAY, 300)
    X, names = aggregate_features(cache, ent, time)
    for i in range(len(ent)):
        ev = slice(offsets[ent[i]], offsets[ent[i] + 1])
        t_e, a_e = ts[ev], amount[ev]
        for w in (7, 30, 90):
            m = (t_e < time[i]) & (t_e >= time[i] - w * DAY)
            assert X[i, names.index(f"s.count_{w}d")] == m.sum()
            assert X[i, names.index(f"s.days_{w}d")] == len(np.unique(t_e[m] // DAY))
            assert X[i, names.index(f"s.a.sum_{w}d")] == pytest.approx(a_e[m].sum(), rel=1e-5, abs=1e-5)


def test_recent_activity_and_class_shares() -> None:
    cache = _cache()
    active = recent_activity(cache, np.array([0, 1, 2]), np.array([T, T, T]), "ev")
    assert active.tolist() == [3, 0, 1]  # distinct active days in the 28 days before T (T-20d, T-5d, T-1s)
    s = class_shares(cache, np.array([0, 1]), np.array([T, T]), "ev", "cat", np.array([1, 2]))
    # entity 0, last 90 days: codes 1, 2, 1, 3, 2, 1; entity 1 has nothing and gets the global term only
    glob = np.array([3 / 6, 2 / 6])
    np.testing.assert_allclose(s[0], [3 / 6, 2 / 6] + 1e-3 * glob)
    np.testing.assert_allclose(s[1], 1e-3 * glob)
    prior = np.array([0.25, 0.5, 0.25])  # a training prior with one class more ("(other)"): its first C
    np.testing.assert_allclose(
        class_shares(cache, np.array([1]), np.array([T]), "ev", "cat", np.array([1, 2]), prior)[0],
        1e-3 * prior[:2],
    )


def test_lightgbm_beats_random_on_a_planted_signal() -> None:
    rng = np.random.default_rng(0)

    def data(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        X = rng.normal(size=(n, 6)).astype(np.float32)
        X[:, 5] = rng.integers(0, 4, n)  # a categorical column
        y = (X[:, 0] + 0.5 * (X[:, 5] == 2) + 0.5 * rng.normal(size=n) > 0.3).astype(np.int64)
        Y = np.stack([y, 1 - y, np.zeros(n, np.int64)], axis=1)  # third class never positive
        return X, y, Y

    (Xtr, ytr, Ytr), (Xva, yva, Yva), (Xte, yte, Yte) = data(1500), data(500), data(500)
    s = fit_gbm("binary", Xtr, ytr, Xva, yva, categorical_features=[5]).predict(Xte)
    assert s.shape == (500,) and auroc(yte, s) > 0.85
    S = fit_gbm("binary", Xtr, Ytr, Xva, Yva, categorical_features=[5]).predict(Xte)
    assert S.shape == (500, 3) and np.all(S[:, 2] == 0.0)
    assert macro_auroc(Yte, S) > 0.85


# ---- metrics of every task type, against sklearn/scipy where they have them -----------------------------
def _ties(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return np.round(rng.random(shape), 1)  # coarse scores: many ties


def test_vectorised_auroc_and_average_precision_match_sklearn_with_ties() -> None:
    from sklearn import metrics as skm

    from basemodel_pipeline.evaluation.metrics import per_class_auroc, per_class_average_precision

    rng = np.random.default_rng(0)
    Y = (rng.random((300, 7)) < [0.02, 0.1, 0.3, 0.5, 0.9, 0.0, 1.0]).astype(int)
    S = _ties(rng, (300, 7)) + 0.3 * Y
    auc, ap = per_class_auroc(Y, S), per_class_average_precision(Y, S)
    for c in range(5):
        assert auc[c] == pytest.approx(skm.roc_auc_score(Y[:, c], S[:, c]))
        assert ap[c] == pytest.approx(skm.average_precision_score(Y[:, c], S[:, c]))
    assert np.isnan(auc[5]) and np.isnan(auc[6]) and np.isnan(ap[5]) and ap[6] == pytest.approx(1.0)
    assert micro_auroc(Y, S) == pytest.approx(skm.roc_auc_score(Y.ravel(), S.ravel()))
    for c in range(5):  # the binary metric (what a bootstrap of a binary scenario calls per resample)
        assert auroc(Y[:, c], S[:, c]) == pytest.approx(skm.roc_auc_score(Y[:, c], S[:, c]), abs=1e-12)
    assert np.isnan(auroc(Y[:, 5], S[:, 5]))


def test_binary_and_multilabel_log_loss_match_sklearn() -> None:
    from sklearn import metrics as skm

    rng = np.random.default_rng(1)
    Y = (rng.random((200, 4)) < 0.3).astype(int)
    P = np.clip(rng.random((200, 4)), 0.01, 0.99)
    m = task_named("multilabel").evaluate(Y, P)
    assert m["micro_log_loss"] == pytest.approx(skm.log_loss(Y.ravel(), P.ravel()))
    per_class = [skm.log_loss(Y[:, c], P[:, c]) for c in range(4)]
    assert m["macro_log_loss"] == pytest.approx(np.mean(per_class))
    assert m["macro_average_precision"] == pytest.approx(
        np.mean([skm.average_precision_score(Y[:, c], P[:, c]) for c in range(4)])
    )
    b = task_named("binary").evaluate(Y[:, 0], P[:, 0])
    assert b["log_loss"] == pytest.approx(skm.log_loss(Y[:, 0], P[:, 0]))
    assert b["auroc"] == pytest.approx(skm.roc_auc_score(Y[:, 0], P[:, 0]))


def test_multiclass_metrics_match_sklearn() -> None:
    from sklearn import metrics as skm

    rng = np.random.default_rng(2)
    P = rng.dirichlet(np.ones(6), 400)
    y = np.array([rng.choice(6, p=p) for p in P])
    m = task_named("multiclass").evaluate(y, P, k=5)
    assert m["accuracy"] == pytest.approx(skm.accuracy_score(y, P.argmax(1)))
    assert m["top3_accuracy"] == pytest.approx(skm.top_k_accuracy_score(y, P, k=3, labels=range(6)))
    assert m["top5_accuracy"] == pytest.approx(skm.top_k_accuracy_score(y, P, k=5, labels=range(6)))
    assert m["log_loss"] == pytest.approx(skm.log_loss(y, P, labels=range(6)))
    assert m["macro_auroc_ovr"] == pytest.approx(skm.roc_auc_score(y, P, multi_class="ovr", average="macro"))


def test_regression_metrics_match_sklearn_and_scipy() -> None:
    from scipy import stats
    from sklearn import metrics as skm

    rng = np.random.default_rng(3)
    y = rng.gamma(2.0, 3.0, 300)
    pred = y + rng.normal(0, 2, 300)
    m = task_named("regression").evaluate(y, pred)
    assert m["rmse"] == pytest.approx(np.sqrt(skm.mean_squared_error(y, pred)))
    assert m["mae"] == pytest.approx(skm.mean_absolute_error(y, pred))
    assert m["spearman"] == pytest.approx(stats.spearmanr(y, pred).statistic)
    assert math.isnan(task_named("regression").evaluate(y, np.ones(300))["spearman"])


def test_ranking_metrics_known_values_and_ndcg_matches_sklearn() -> None:
    from sklearn import metrics as skm

    from basemodel_pipeline.evaluation.metrics import ranking_hits, ranking_metrics

    # row 0: relevant {1, 4}; ranked [4, 0, 1] -> hits at ranks 1 and 3
    # row 1: relevant {2};    ranked [0, 3, 1] -> no hit
    indptr, indices = np.array([0, 2, 3]), np.array([1, 4, 2])
    top = np.array([[4, 0, 1], [0, 3, 1]])
    hits = ranking_hits(top, indptr, indices, 5)
    assert hits.tolist() == [[True, False, True], [False, False, False]]
    m = ranking_metrics(hits, np.diff(indptr), ks=(2, 3))
    assert m["hitrate@2"] == 0.5 and m["precision@2"] == pytest.approx((1 / 2) / 2)
    assert m["recall@3"] == pytest.approx((2 / 2 + 0) / 2)
    assert m["map@3"] == pytest.approx(((1 + 2 / 3) / 2 + 0) / 2)
    assert m["mrr"] == pytest.approx((1 + 0) / 2)
    # NDCG@K with binary relevance over a full ranking equals sklearn's
    rng = np.random.default_rng(4)
    rel = (rng.random((50, 30)) < 0.15).astype(int)
    rel[:, 0] = 1
    scores = rng.random((50, 30))
    ranked = np.argsort(-scores, axis=1)
    ip = np.r_[0, np.cumsum(rel.sum(1))]
    cols = np.nonzero(rel)[1]
    got = ranking_metrics(ranking_hits(ranked, ip, cols, 30), rel.sum(1), ks=(10,))["ndcg@10"]
    assert got == pytest.approx(skm.ndcg_score(rel, scores, k=10))


def test_lightgbm_multiclass_and_regression() -> None:
    rng = np.random.default_rng(5)

    def data(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        X = rng.normal(size=(n, 4)).astype(np.float32)
        return X, np.digitize(X[:, 0], [-0.5, 0.5]), 3 * X[:, 1] + 0.1 * rng.normal(size=n)

    (Xtr, ctr, rtr), (Xva, cva, rva), (Xte, cte, rte) = data(1200), data(400), data(400)
    P = fit_gbm("multiclass", Xtr, ctr, Xva, cva).predict(Xte)
    assert P.shape == (400, 3) and np.allclose(P.sum(1), 1.0) and (P.argmax(1) == cte).mean() > 0.85
    pred = fit_gbm("regression", Xtr, rtr, Xva, rva).predict(Xte)
    assert pred.shape == (400,) and np.corrcoef(pred, rte)[0, 1] > 0.95


def test_repeat_baseline_ranks_an_entitys_own_recent_items_first() -> None:
    """decayed_history_items: "repeat what they bought", the recommendation candidates' history term."""
    cache = _cache()  # entity 0 bought "big" codes 5..11 before T; entity 2 bought code 14
    owner, item, weight = decayed_history_items(
        cache.source("ev"), "big", np.array([0, 2]), np.array([T, T]), 30.0
    )
    mine = owner == 0
    assert item[mine][np.argsort(-weight[mine], kind="stable")][:3].tolist() == [
        10,
        9,
        8,
    ]  # most recent first
    assert item[owner == 1].tolist() == [13]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_the_drift_sample_keeps_rows_not_the_scored_chunks(dtype: type) -> None:
    """Scoring streams every entity's features through RowSample; a sample holding views of the float32
    chunks kept the whole population's features in memory (5.6 GB for 496k households at 50M events)."""
    from basemodel_pipeline.evaluation.drift import RowSample

    sample = RowSample(total_rows=40_000, max_rows=100)
    chunks = [np.random.default_rng(i).normal(size=(10_000, 8)).astype(dtype) for i in range(4)]
    for X in chunks:
        sample.add(X)
    rows = sample.rows()
    assert rows.shape == (100, 8) and rows.dtype == np.float32
    assert not any(np.shares_memory(part, X) for part in sample.parts for X in chunks)
    assert sum(part.nbytes for part in sample.parts) == rows.nbytes  # the sample, not the chunks
    np.testing.assert_array_equal(rows, np.concatenate(chunks).astype(np.float32)[::400])


def test_resampled_auroc_equals_the_auroc_of_the_resampled_rows() -> None:
    """A bootstrap resample given as row counts scores what the repeated rows would, ties and one-class
    columns included, without sorting again."""
    from basemodel_pipeline.evaluation.metrics import ResampledAuroc, per_class_auroc

    rng = np.random.default_rng(3)
    Y = (rng.random((250, 6)) < [0.03, 0.2, 0.5, 0.8, 0.0, 1.0]).astype(int)
    S = _ties(rng, (250, 6)) + 0.2 * Y
    resampled = ResampledAuroc(Y, S)
    np.testing.assert_allclose(resampled(np.ones(250)), per_class_auroc(Y, S), equal_nan=True)
    for _ in range(5):
        idx = rng.integers(0, 250, 250)
        expected = per_class_auroc(Y[idx], S[idx])
        got = resampled(np.bincount(idx, minlength=250))
        np.testing.assert_allclose(got, expected, equal_nan=True)
    only_two = np.zeros(250)
    only_two[[0, 1]] = 1  # too few rows for both classes in most columns: NaN there, as for the rows alone
    np.testing.assert_allclose(resampled(only_two), per_class_auroc(Y[:2], S[:2]), equal_nan=True)


def test_every_curve_of_a_report_chart_has_its_own_colour_and_line_style(monkeypatch) -> None:
    """The report's legends told model from neural, the two LightGBMs and popularity from the blend only by
    name (each colour was used twice): every curve of a chart now has its own colour and line style."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from basemodel_pipeline.reports import html as report

    drawn: list = []
    monkeypatch.setattr(report, "_png", lambda fig: drawn.append(fig) or "")
    rng = np.random.default_rng(0)
    y = rng.random(400) < 0.3
    names = [
        "model", "neural", "lightgbm_aggregates", "lightgbm_hybrid", "blend", "popularity", "custom_a", "custom_b",
    ]  # fmt: skip
    scores = {n: rng.random(400) + y * rng.random() for n in names}
    report._binary_charts(y.astype(np.float64), scores, set(names))
    report._regression_charts(rng.random(400), scores)
    for fig in drawn:
        for ax in fig.axes:
            looks = [
                (to_hex(line.get_color()), line.get_linestyle())
                for line in ax.get_lines()
                if line.get_label().split(" (")[0] in names  # "model (AUROC 0.812)" on the ROC chart
            ]
            if looks:
                assert len(set(looks)) == len(looks), looks
                assert len({c for c, _ in looks}) >= len(looks) - 2  # only the unknown names share a grey
        plt.close(fig)
    assert len(drawn) >= 4


def test_report_curves_are_drawn_with_a_bounded_number_of_points(monkeypatch) -> None:
    """A test window of 20,000 rows drew ROC, precision-recall, gain and lift lines of up to 20,000 vertices
    per model, most of the report's time; each line is thinned to at most CURVE_POINTS vertices, its ends kept,
    and the legend still quotes the metric of every row."""
    import matplotlib.pyplot as plt
    import sklearn.metrics as skm

    from basemodel_pipeline.reports import html as report

    drawn: list = []
    monkeypatch.setattr(report, "_png", lambda fig: drawn.append(fig) or "")
    rng = np.random.default_rng(1)
    y = rng.random(20_000) < 0.3
    scores = {n: rng.random(20_000) + y * rng.random() for n in ("neural", "lightgbm_aggregates")}
    report._binary_charts(y.astype(np.float64), scores, set(scores))
    report._regression_charts(rng.random(20_000), scores)
    lines = [
        line for fig in drawn for ax in fig.axes for line in ax.get_lines() if line.get_label()[0] != "_"
    ]
    assert len(lines) >= 10
    for line in lines:
        assert len(line.get_xdata()) <= report.CURVE_POINTS, line.get_label()
    roc = next(line for line in lines if line.get_label().startswith("neural (AUROC"))
    x, yy = roc.get_xdata(), roc.get_ydata()
    assert (x[0], yy[0], x[-1], yy[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert f"{skm.roc_auc_score(y, scores['neural']):.3f}" in roc.get_label()
    for fig in drawn:
        plt.close(fig)
