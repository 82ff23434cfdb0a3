"""The task classes (tasks/, docs/tasks.md): the registry covers the config's task names and takes a new task
from one file; each task's targets, loss, decoding, metrics, blends and predictions table on small arrays."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch import nn

from basemodel_pipeline.config import scenarios as config_scenarios
from basemodel_pipeline.evaluation import metrics
from basemodel_pipeline.targets.labels import SparseLabels, TargetDetails, TargetSpec
from basemodel_pipeline.tasks import TASKS, Task, register, task_for, task_named, unregister
from basemodel_pipeline.tasks.binary import Binary
from basemodel_pipeline.tasks.multiclass import Multiclass
from basemodel_pipeline.tasks.multilabel import Multilabel
from basemodel_pipeline.tasks.recommendation import Recommendation
from basemodel_pipeline.tasks.regression import Regression, RegressionDetails

DAY = dt.date(2024, 5, 1)
CLASSES = ["a", "b", "c"]


def _spec(task: str, **details: Any) -> TargetSpec:
    classes = CLASSES if task in ("multiclass", "multilabel") else []
    return TargetSpec(task, classes, list(range(1, len(classes) + 1)), task_named(task).details(**details))


# ---- the registry ----------------------------------------------------------------------------------------
def test_every_task_type_is_one_registered_class_whose_rules_the_config_reads() -> None:
    assert set(TASKS) == {"binary", "multiclass", "multilabel", "regression", "recommendation"}
    assert set(config_scenarios.TASK_RULES) == set(TASKS)  # the registry is the one list of task types
    assert (
        config_scenarios.task_rules("recommendation").ranked
        and config_scenarios.task_rules("multiclass").per_class
    )
    assert config_scenarios.task_rules("regression").target_kind == "regression"
    with pytest.raises(ValueError, match="task 'survival' is not a task type; known: binary, multiclass"):
        config_scenarios.task_rules("survival")
    for name, cls in TASKS.items():
        assert cls.name == name and issubclass(cls, Task)
    assert task_named("binary") is Binary and isinstance(task_for(_spec("regression")), Regression)
    with pytest.raises(ValueError, match="unknown task 'survival'; known: binary, multiclass"):
        task_named("survival")


def test_target_details_are_typed_per_task_and_round_trip() -> None:
    from pydantic import ValidationError

    from basemodel_pipeline.tasks import spec_from_dict
    from basemodel_pipeline.tasks.multilabel import MultilabelDetails
    from basemodel_pipeline.tasks.recommendation import RecommendationDetails

    assert Regression.details is RegressionDetails and Multilabel.details is MultilabelDetails
    assert Recommendation.details is RecommendationDetails and Binary.details is TargetDetails
    with pytest.raises(ValidationError, match="log1pp"):  # a misspelt field fails where it is written
        RegressionDetails(log1pp=True)  # type: ignore[call-arg]
    rec = RecommendationDetails(n_items=3, popularity=[1, 2, 3], items=["x", "y", "z"])
    with pytest.raises(ValidationError, match="repeat_weight"):  # and on assignment, of the wrong type
        rec.repeat_weight = "heavy"  # type: ignore[assignment]
    with pytest.raises(
        TypeError, match="a regression target spec holds TargetDetails, not RegressionDetails"
    ):
        task_for(TargetSpec("regression", [], [], TargetDetails()))
    for spec in (
        _spec("binary"),
        _spec("multiclass"),
        TargetSpec("multilabel", ["a", "b"], [], MultilabelDetails(list_columns=["g__a", "g__b"])),
        TargetSpec(
            "regression", [], [], Regression.fit_details(RegressionDetails(log1p=True), np.r_[0.0, 0, 3])
        ),
        TargetSpec("recommendation", [], [], rec.with_values(repeat_weight=2.0, head="sketch")),
    ):
        stored = spec.to_dict()
        assert set(stored) - {"task", "classes", "class_codes"} <= set(type(spec.details).model_fields)
        back = spec_from_dict(json.loads(json.dumps(stored)))
        assert back == spec and type(back.details) is type(spec.details)
    with pytest.raises(ValidationError, match="n_itemz"):  # a stored field the record does not know
        spec_from_dict({"task": "recommendation", "n_itemz": 3, "popularity": [1]})


class Count(Task):
    """A sixth task in one class (what docs/tasks.md walks through): event counts, Poisson loss on the log
    rate, judged by MAE."""

    name = "toy_count"
    primary_metric = "mae"
    explainable = True
    least_squares_blend = True
    charts = "values"

    def init_bias(self, head: nn.Linear, labels: Any) -> None:
        with torch.no_grad():
            head.bias.fill_(float(np.log(np.mean(labels) + 1e-6)))

    def targets(self, labels: Any, idx: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(labels, np.float32)[idx, None])

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.poisson_nll_loss(logits, target, log_input=True)

    def scores(self, logits: np.ndarray) -> np.ndarray:
        return np.exp(logits.astype(np.float64))[:, 0]

    @classmethod
    def evaluate(cls, y: Any, score: Any, k: int = 10, log1p: bool = False) -> dict[str, float]:
        return {"mae": metrics.mae(y, score), "rmse": metrics.rmse(y, score)}

    def output_table(self, ids, as_of, out, top_k, threshold) -> pa.Table:  # noqa: ANN001
        return pa.table({"entity_id": ids, "as_of": pa.array([as_of] * len(ids), pa.date32()), "count": out})


def test_a_new_task_registers_from_its_own_module_and_trains() -> None:
    register(Count)
    try:
        task = task_for(TargetSpec("toy_count", [], []))
        assert isinstance(task, Count) and task.out_dim == 1 and not task.higher_is_better()
        y = np.array([0.0, 1.0, 3.0, 2.0])
        head = nn.Linear(4, task.out_dim)
        task.init_bias(head, y)
        x = torch.eye(4)
        opt = torch.optim.SGD(head.parameters(), lr=0.5)
        first = None
        for _ in range(50):
            loss = task.loss(head(x), task.targets(y, np.arange(4)))
            first = float(loss.detach()) if first is None else first
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert float(loss.detach()) < first
        out = task.scores(head(x).detach().numpy())
        assert task.primary(y, out) < task.primary(y, np.full(4, y.mean()))
        table = task.output_table(np.array(["e1", "e2", "e3", "e4"]), DAY, out, None, None)
        assert table.column_names == ["entity_id", "as_of", "count"]
    finally:
        unregister("toy_count")
    assert "toy_count" not in TASKS and "toy_count" not in config_scenarios.TASK_RULES


# ---- labels -> targets, loss, decoding: the formulas of the head before the task classes -------------------
def test_binary_and_multilabel_heads() -> None:
    logits = np.array([[-1.0], [0.0], [2.0]], np.float32)
    binary = task_for(_spec("binary"))
    np.testing.assert_allclose(binary.scores(logits), 1 / (1 + np.exp(-logits[:, 0].astype(np.float64))))
    y = np.array([0.0, 1.0, 1.0], np.float32)
    head = nn.Linear(2, 1)
    binary.init_bias(head, y)
    assert float(head.bias.detach()[0]) == pytest.approx(np.log(2.0))  # log-odds of 2/3
    target = binary.targets(y, np.array([2, 0]))
    assert target.tolist() == [[1.0], [0.0]]
    z = torch.tensor([[0.3], [-0.2]])
    assert binary.loss(z, target) == nn.functional.binary_cross_entropy_with_logits(z, target)

    multilabel = task_for(_spec("multilabel"))
    sparse = SparseLabels.from_pairs(np.array([0, 0, 1]), np.array([0, 2, 2]), np.ones(3), 2, 3)
    head = nn.Linear(2, multilabel.out_dim)
    multilabel.init_bias(head, sparse)
    prev = np.clip(np.array([0.5, 0.0, 1.0]), 1e-4, 1 - 1e-4)
    np.testing.assert_allclose(head.bias.detach().numpy(), np.log(prev / (1 - prev)), rtol=1e-5)
    assert multilabel.targets(sparse, np.array([1])).tolist() == [[0.0, 0.0, 1.0]]
    assert multilabel.scores(np.zeros((2, 3), np.float32)).shape == (2, 3)
    np.testing.assert_array_equal(multilabel.truth(sparse), sparse.dense())


def test_multiclass_head() -> None:
    task = task_for(_spec("multiclass"))
    logits = np.array([[1.0, 2.0, 0.5], [0.0, 0.0, 0.0]], np.float32)
    p = task.scores(logits)
    np.testing.assert_allclose(p, torch.softmax(torch.from_numpy(logits).double(), -1).numpy())
    y = np.array([0, 2, 2, 2])
    head = nn.Linear(2, 3)
    task.init_bias(head, y)
    freq = np.array([2.0, 1.0, 4.0])
    np.testing.assert_allclose(head.bias.detach().numpy(), np.log(freq / freq.sum()), rtol=1e-6)
    target = task.targets(y, np.array([1, 0]))
    assert target.dtype == torch.int64 and target.tolist() == [2, 0]
    z = torch.from_numpy(logits)
    assert task.loss(z, target) == nn.functional.cross_entropy(z, target)
    assert task.finish(np.ones((2, 2))).tolist() == [[1, 1, 0], [1, 1, 0]]  # a class LightGBM never saw


def test_regression_head_with_and_without_hurdle() -> None:
    y = np.array([0.0, 0.0, 4.0, 6.0, 0.0, 10.0])
    d = Regression.fit_details(RegressionDetails(), y)
    assert isinstance(d, RegressionDetails) and d.hurdle and d.min == 0.0 and d.max == 10.0
    task = task_for(TargetSpec("regression", [], [], d))
    assert task.out_dim == 2
    target = task.targets(y, np.arange(6))
    assert target[:, 0].tolist() == [0, 0, 1, 1, 0, 1]
    logits = np.array([[0.0, 0.0], [5.0, 10.0]], np.float32)
    expected = 0.5 * (d.positive_mean or 0.0)
    assert task.scores(logits)[0] == pytest.approx(expected)
    assert task.scores(logits)[1] <= 10.0  # within the training range
    plain = task_for(TargetSpec("regression", [], [], Regression.fit_details(RegressionDetails(), y + 1.0)))
    assert plain.out_dim == 1
    e = plain.spec.details
    assert isinstance(e, RegressionDetails)
    assert plain.scores(np.array([[1.0]], np.float32))[0] == pytest.approx(e.std + e.mean)
    z = torch.tensor([[0.5]])
    assert plain.loss(z, torch.tensor([[0.1]])) == nn.functional.mse_loss(z, torch.tensor([[0.1]]))
    assert plain.unlink(np.array([-5.0, 50.0])).tolist() == [1.0, 11.0]  # blends keep to the range too


def test_recommendation_head_ranks_items_and_has_no_scores() -> None:
    spec = _spec("recommendation", n_items=4, head="dense", popularity=[1, 1, 1, 1])
    task = task_for(spec)
    assert task.ranked and task.out_dim == 4 and task.lightgbm is None
    with pytest.raises(ValueError, match="ranked items"):
        task.scores(np.zeros((1, 4), np.float32))
    items, _ = task.top_items(np.log(np.array([[0.1, 0.6, 0.2, 0.1]], np.float32)), 2)
    assert items.tolist() == [[1, 2]]
    labels = SparseLabels.from_pairs(np.array([0]), np.array([2]), np.array([1.0]), 1, 4)
    indptr, indices, n_items = task.truth(labels)
    assert n_items == 4 and indices.tolist() == [2]
    assert task.evaluate((indptr, indices, n_items), np.array([[2, 0]]))["ndcg@10"] == 1.0


# ---- metrics, blends, outputs ------------------------------------------------------------------------------
def test_primary_metrics_and_their_direction() -> None:
    y, s = np.array([0, 1, 1, 0]), np.array([0.1, 0.9, 0.4, 0.5])
    assert Binary.primary(y, s) == Binary.evaluate(y, s)["auroc"] == metrics.auroc(y, s)
    Y = np.array([[0, 1], [1, 0], [1, 1]])
    S = np.array([[0.2, 0.7], [0.9, 0.1], [0.6, 0.4]])
    assert Multilabel.primary(Y, S) == metrics.macro_auroc(Y, S) and Multilabel.metric_width(S) == 2
    P = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    assert Multiclass.primary(np.array([0, 1]), P) == 0.5 and Multiclass.metric_width(P) == 1
    assert Regression.primary(np.array([1.0, 3.0]), np.array([2.0, 2.0])) == 1.0
    assert [t.higher_is_better() for t in (Binary, Multilabel, Multiclass, Regression, Recommendation)] == [
        True,
        True,
        True,
        False,
        True,
    ]


def test_blend_links_invert() -> None:
    p = np.array([0.1, 0.5, 0.9])
    np.testing.assert_allclose(task_for(_spec("binary")).unlink(task_for(_spec("binary")).link(p)), p)
    P = np.array([[0.2, 0.3, 0.5]])
    multiclass = task_for(_spec("multiclass"))
    np.testing.assert_allclose(multiclass.unlink(multiclass.link(P)), P)


def test_output_tables_have_the_documented_columns() -> None:
    ids = np.array(["e1", "e2"])
    cases = {
        "binary": (np.array([0.2, 0.8]), ["entity_id", "as_of", "score"], 2),
        "regression": (np.array([1.0, 2.0]), ["entity_id", "as_of", "value"], 2),
        "multiclass": (np.full((2, 3), 1 / 3), ["entity_id", "as_of", "label", "score"], 6),
        "multilabel": (np.full((2, 3), 0.5), ["entity_id", "as_of", "label", "score"], 6),
    }
    for name, (out, columns, rows) in cases.items():
        table = task_for(_spec(name)).output_table(ids, DAY, out, None, None)
        assert table.column_names == columns and table.num_rows == rows, name
    top = task_for(_spec("multilabel")).output_table(ids, DAY, np.array([[0.1, 0.9, 0.5]] * 2), 1, None)
    assert top.column("label").to_pylist() == ["b", "b"]
    rec = task_for(
        _spec("recommendation", n_items=3, head="dense", popularity=[1, 1, 1], items=["x", "y", "z"])
    )
    table = rec.output_table(ids, DAY, (np.array([[2, 0], [1, -1]]), np.ones((2, 2))), None, None)
    assert table.column_names == ["entity_id", "as_of", "rank", "item", "score"]
    assert table.column("item").to_pylist() == ["z", "x", "y"]  # -1: a shorter list, not written


def test_python_target_labels_are_checked_by_their_task() -> None:
    assert task_for(_spec("multiclass")).check_label("c") == 2.0
    assert task_for(_spec("multilabel")).check_label([0, 1, 1]).tolist() == [0, 1, 1]
    with pytest.raises(ValueError, match="a binary target holds 0/1 values"):
        task_for(_spec("binary")).check_label(0.5)
    with pytest.raises(ValueError, match=r"needs shape \(3,\)"):
        task_for(_spec("multilabel")).check_label([0, 1])
    with pytest.raises(ValueError, match=r"needs an integer in \[0, 3\)"):
        task_for(_spec("multiclass")).check_label(3)
    with pytest.raises(ValueError, match="NaN or inf"):
        task_for(_spec("regression")).check_label(float("nan"))
    assert task_for(_spec("multilabel")).stack_labels([]).shape == (0, 3)


def test_the_money_map_turns_log_scale_predictions_into_expected_amounts() -> None:
    """Spend-like data: 70% buy nothing, amounts log-normal. The best log1p-scale prediction (the mean log1p
    amount given the signal) expm1-ed sums to a fraction of the revenue; through the map fitted on held-out
    rows the mean prediction is the mean amount on new rows, and the ranking is kept."""
    from basemodel_pipeline.tasks.regression import amount_map, amounts

    rng = np.random.default_rng(0)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        signal = rng.normal(size=n)
        buys = rng.random(n) < 1 / (1 + np.exp(-(signal - 1)))
        amount = np.where(buys, np.exp(3 + 0.5 * signal + rng.normal(scale=1.0, size=n)), 0.0)
        p = 1 / (1 + np.exp(-(signal - 1)))
        return p * (3 + 0.5 * signal), amount  # hurdle: P(any) x E[log amount | any], on the log1p scale

    held_out, held_amount = draw(20_000)
    knots = amount_map(held_out, held_amount)
    new, new_amount = draw(20_000)
    naive, money = np.expm1(new).mean(), amounts(new, knots).mean()
    assert naive < 0.3 * new_amount.mean()  # a revenue forecast from expm1 is off several times
    assert money == pytest.approx(new_amount.mean(), rel=0.05)
    order = np.argsort(new)
    assert np.all(np.diff(amounts(new, knots)[order]) >= 0)
    assert np.array_equal(amounts(new, None), np.expm1(np.maximum(new, 0)))
