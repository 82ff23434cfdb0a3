"""Candidate models and their selection on validation (candidates/blend.py, selection.py), the regression
head's range and hurdle, LightGBM models saved as text, and the regression metrics on both scales."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from basemodel_pipeline.candidates.base import Context
from basemodel_pipeline.candidates.blend import Blend
from basemodel_pipeline.candidates.selection import choose, split_validation
from basemodel_pipeline.config.models import Scenario
from basemodel_pipeline.errors import ConfigError
from basemodel_pipeline.evaluation.gbm import GBM, fit_gbm
from basemodel_pipeline.metadata import json_dumps
from basemodel_pipeline.targets.labels import TargetSpec
from basemodel_pipeline.tasks import task_for, task_named
from basemodel_pipeline.tasks.regression import RegressionDetails, regression_stats


def _ctx(task: str, **details: Any) -> Context:
    target = {
        "binary": {"kind": "binary", "source": "s", "horizon_days": 7},
        "regression": {"kind": "regression", "source": "s", "horizon_days": 7, "column": "v"},
        "multilabel": {"kind": "multilabel", "source": "s", "horizon_days": 7, "column": "c"},
    }[task]
    scenario = Scenario.model_validate({"name": "s", "task": task, "target": target})
    classes = ["a", "b", "c"] if task == "multilabel" else []
    spec = TargetSpec(task, classes, list(range(1, len(classes) + 1)), task_named(task).details(**details))
    return Context(scenario, spec, task_for(spec))


class Fixed:
    """A fitted candidate whose validation outputs are given."""

    def __init__(self, name: str) -> None:
        self.name = name


def test_validation_halves_are_disjoint_by_entity_and_cover_every_row() -> None:
    entity = np.repeat(np.arange(200), 3)
    stop, select = split_validation(entity)
    assert len(stop) + len(select) == len(entity) and not set(stop) & set(select)
    assert not set(entity[stop]) & set(entity[select])  # an entity's rows stay together
    assert 0.35 < len(stop) / len(entity) < 0.65
    tiny = np.array([0, 0, 1])
    assert [len(h) for h in split_validation(tiny)] == [3, 3]  # too few entities to split: all rows both


def test_choose_publishes_the_best_on_validation_and_a_pin_overrides_it() -> None:
    ctx = _ctx("binary")
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 2000).astype(float)
    entity = np.arange(2000)
    good = 1 / (1 + np.exp(-(2.0 * y - 1 + rng.normal(0, 1.0, 2000))))
    weak = 1 / (1 + np.exp(-(0.3 * y + rng.normal(0, 1.0, 2000))))
    outputs = {"neural": weak, "lightgbm_aggregates": good, "popularity": rng.random(2000)}
    cands = {n: Fixed(n) for n in outputs}
    sel, published = choose(ctx, cands, outputs, y, entity, ["neural", "lightgbm_aggregates"])
    assert sel.published in ("lightgbm_aggregates", "blend") and sel.published != "neural"
    assert sel.validation["lightgbm_aggregates"] > sel.validation["neural"]
    assert "best validation auroc" in sel.reason and not sel.pinned
    assert sel.blend["members"] == ["neural", "lightgbm_aggregates"]
    assert sel.blend["weights"][1] > sel.blend["weights"][0]  # the blend leans on the informative member
    pinned, cand = choose(ctx, cands, outputs, y, entity, [], pinned="neural")
    assert pinned.published == "neural" and pinned.pinned and cand is cands["neural"]
    with pytest.raises(ConfigError, match="publish: 'reranker' is not one of its candidates"):
        choose(ctx, cands, outputs, y, entity, [], pinned="reranker")


def test_ties_go_to_the_simpler_candidate() -> None:
    ctx = _ctx("binary")
    y = np.tile([0.0, 1.0], 100)
    same = y * 0.8 + 0.1
    outputs = {"neural": same, "lightgbm_aggregates": same.copy(), "popularity": same.copy()}
    sel, _ = choose(ctx, {n: Fixed(n) for n in outputs}, outputs, y, np.arange(200), [])
    assert sel.published == "popularity"


def test_blend_weights_per_task_type() -> None:
    rng = np.random.default_rng(1)
    y = rng.normal(2.0, 1.0, 3000).clip(0)
    a, b = y + rng.normal(0, 0.3, 3000), rng.normal(2.0, 1.0, 3000)  # informative, noise
    ctx = _ctx("regression", min=0.0, max=float(y.max()))
    blend = Blend(ctx, [Fixed("a"), Fixed("b")]).fit_outputs([a, b], y)
    assert blend.weights[0] > 0.8 and blend.weights[1] < 0.1 and (blend.weights >= 0).all()
    out = blend.combine([a - 10, b])
    assert out.min() >= 0.0  # kept inside the training labels' range
    Y = (rng.random((2000, 3)) < 0.3).astype(float)
    good = np.clip(Y * 0.6 + rng.random((2000, 3)) * 0.4, 1e-3, 1 - 1e-3)
    ml = Blend(_ctx("multilabel"), [Fixed("g"), Fixed("r")]).fit_outputs([good, rng.random((2000, 3))], Y)
    assert ml.weights[0] >= 0.7 and abs(ml.weights.sum() - 1) < 1e-9


def test_regression_head_keeps_to_the_label_range_and_uses_a_hurdle_for_mostly_zero_amounts() -> None:
    y = np.r_[np.zeros(600), np.random.default_rng(2).gamma(2.0, 2.0, 400)]
    extra = regression_stats(y)
    assert extra["hurdle"] and extra["min"] == 0.0 and 0.39 < extra["positive_share"] < 0.41
    assert not regression_stats(y + 1.0).get("hurdle")  # never zero: a plain regression
    assert not regression_stats(y - 1.0).get("hurdle")  # negative values: a plain regression
    head = task_for(TargetSpec("regression", [], [], RegressionDetails(**extra)))
    assert head.out_dim == 2
    logits = np.array([[5.0, -30.0], [-5.0, 2.0], [0.0, 0.0]], np.float32)
    values = head.scores(logits)
    assert (values >= 0).all() and values[0] == 0.0  # an amount below zero is never predicted
    assert values[1] == pytest.approx(
        1 / (1 + np.exp(5.0)) * (2.0 * extra["positive_std"] + extra["positive_mean"]), rel=1e-5
    )
    plain = task_for(TargetSpec("regression", [], [], RegressionDetails(**regression_stats(y + 1.0))))
    assert plain.scores(np.array([[-100.0]], np.float32))[0] == pytest.approx(1.0)  # the training minimum


def test_lightgbm_models_round_trip_as_text() -> None:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(600, 5))
    y = (X[:, 0] + rng.normal(0, 0.5, 600) > 0).astype(float)
    Y = np.c_[y, np.zeros(600)]  # a second column without positives: a constant
    for objective, labels in (("binary", y), ("binary", Y), ("regression", X[:, 1] * 2)):
        gbm = fit_gbm(objective, X[:400], labels[:400], X[400:500], labels[400:500])
        again = GBM.from_json(gbm.to_json())
        np.testing.assert_array_equal(again.predict(X[500:]), gbm.predict(X[500:]))
    assert isinstance(GBM.from_json(fit_gbm("binary", X, Y, X, Y).to_json()).models[1], float)


def test_regression_metrics_on_both_scales() -> None:
    amount = np.array([0.0, 0.0, 10.0, 100.0, 1000.0])
    y = np.log1p(amount)
    perfect = task_named("regression").evaluate(y, y, log1p=True)
    assert perfect["rmse"] == 0 and perfect["rmse_raw"] == 0 and perfect["gini"] == pytest.approx(1.0)
    assert perfect["top_decile_lift"] == pytest.approx(1000 / 1110 / 0.2)
    backwards = task_named("regression").evaluate(y, -y, log1p=True)
    assert backwards["gini"] < 0 and backwards["rmse_raw"] > 0
    plain = task_named("regression").evaluate(amount, amount + 1.0)
    assert plain["rmse_log1p"] > 0 and "rmse_raw" not in plain
    assert set(task_named("regression").evaluate(amount - 50, amount)) == {"rmse", "mae", "spearman"}


def test_metrics_json_is_strict_json() -> None:
    text = json_dumps({"a": float("nan"), "b": [1.0, float("inf")], "c": np.float32(0.5)})
    assert "NaN" not in text and "Infinity" not in text

    assert json.loads(text) == {"a": None, "b": [1.0, None], "c": 0.5}


def test_the_blend_is_published_unless_a_single_candidate_beats_it_beyond_the_noise() -> None:
    ctx = _ctx("binary")
    rng = np.random.default_rng(4)
    n = 3000
    y = rng.integers(0, 2, n).astype(float)
    strong = 1 / (1 + np.exp(-(2.0 * y - 1 + rng.normal(0, 1.0, n))))
    close = 1 / (1 + np.exp(-(np.log(strong / (1 - strong)) + rng.normal(0, 0.3, n))))  # the same errors
    weak = 1 / (1 + np.exp(-(0.2 * y + rng.normal(0, 1.0, n))))
    # the blend of two good models is within the noise of the best of them: the blend is published
    outputs = {"neural": close, "lightgbm_aggregates": strong, "popularity": weak}
    sel, _ = choose(
        ctx, {k: Fixed(k) for k in outputs}, outputs, y, np.arange(n), ["neural", "lightgbm_aggregates"]
    )
    assert sel.published == "blend" and "within the validation noise" in sel.reason
    # a blend of two weak models: the strong single candidate wins clearly and is published
    outputs = {"neural": weak, "lightgbm_aggregates": weak[::-1].copy(), "popularity": strong}
    sel, _ = choose(
        ctx, {k: Fixed(k) for k in outputs}, outputs, y, np.arange(n), ["neural", "lightgbm_aggregates"]
    )
    assert sel.published == "popularity" and sel.reason.startswith("best validation auroc")
