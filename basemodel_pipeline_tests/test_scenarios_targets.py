"""Declarative targets, the events API, sparse labels, heads and LoRA on a hand-made cache with known answers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

from basemodel_pipeline.cache.store import ColumnInfo, EventCache, EventSource
from basemodel_pipeline.config.models import Scenario
from basemodel_pipeline.dates import DAY
from basemodel_pipeline.errors import ConfigError
from basemodel_pipeline.model.lora import LoRALinear, add_lora, merge_lora
from basemodel_pipeline.scenarios.targets import build_examples, choose_classes
from basemodel_pipeline.targets.events import SourceEvents
from basemodel_pipeline.targets.labels import SparseLabels, TargetSpec, label_columns
from basemodel_pipeline.targets.windows import candidate_pairs
from basemodel_pipeline.tasks import task_for
from basemodel_pipeline.tasks.recommendation import RecommendationDetails

T = 300 * DAY
ITEMS = ["a", "b", "c", "d"]  # codes 1..4


@pytest.fixture
def cache(tmp_path: Path) -> EventCache:
    """Entity 0: history a (T-10d), b (T-3d); future c (T+1d, 5), a (T+1d+1h, 2), c (T+3d, 1), d (T+20d, 10).
    Entity 1: one event, d at T-40d."""
    ts = np.array(
        [T - 10 * DAY, T - 3 * DAY, T + DAY, T + DAY + 3600, T + 3 * DAY, T + 20 * DAY, T - 40 * DAY]
    )
    item = np.array([1, 2, 3, 1, 3, 4, 4], np.int32)
    amt = np.array([1, 1, 5, 2, 1, 10, 7], np.float32)
    vocab_dir = tmp_path / "vocab" / "ev"
    vocab_dir.mkdir(parents=True)
    pq.write_table(pa.table({"value": ITEMS}), vocab_dir / "col_item.parquet")
    src = EventSource(
        name="ev",
        offsets=np.array([0, 6, 7], np.int64),
        ts=ts.astype(np.int64),
        columns={"item": item, "amt": amt},
        info={"item": ColumnInfo("item", "categorical", 4), "amt": ColumnInfo("amt", "numeric")},
        vocab_dir=vocab_dir,
    )
    c = EventCache.__new__(EventCache)
    c.path, c.n_entities, c.sources = tmp_path, 2, {"ev": src}
    c.attribute_info, c.attributes = {}, {}
    return c


def scenario(task: str, **target) -> Scenario:
    return Scenario.model_validate(
        {"name": "s", "task": task, "target": {"kind": task, "source": "ev", "horizon_days": 14, **target}}
    )


def examples(cache: EventCache, sc: Scenario):
    times = np.array([T])
    return build_examples(cache, sc, choose_classes(cache, sc, times), times)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ({}, [1, 0]),
        ({"event": "none"}, [0, 1]),
        ({"filter": [{"column": "item", "value": "a"}]}, [1, 0]),
        ({"filter": [{"column": "item", "op": "in", "value": ["b", "d"]}]}, [0, 0]),
        ({"filter": [{"column": "amt", "op": ">=", "value": 5}]}, [1, 0]),
        ({"filter": [{"column": "amt", "op": ">", "value": 5}]}, [0, 0]),  # d (10) is after 14 days
    ],
)
def test_binary_any_none_and_filters(cache, target, expected) -> None:
    ex = examples(cache, scenario("binary", **target))
    assert ex.entity.tolist() == [0, 1] and ex.labels.tolist() == expected


def test_binary_population_active_in_last_days(cache) -> None:
    ex = examples(cache, scenario("binary", active_in_last_days=30))
    assert ex.entity.tolist() == [0]


@pytest.mark.parametrize(
    ("task", "target"),
    [
        ("binary", {}),
        ("multilabel", {"column": "item", "min_positive_entities": 0}),
        ("multiclass", {"column": "item"}),
        ("regression", {"column": "amt"}),
        ("recommendation", {"column": "item"}),
    ],
)
def test_every_task_type_takes_a_population_of_recently_active_entities(cache, task, target) -> None:
    """Entity 0's last event before the split is 3 days old, entity 1's 40 days: 30 days keeps entity 0, two
    days nobody (a population for propensity among "users active in the last 30 days")."""
    times = np.array([T])
    assert candidate_pairs(cache, scenario(task, **target), times)[0].tolist() == [0, 1]
    recent = scenario(task, active_in_last_days=30, **target)
    assert candidate_pairs(cache, recent, times)[0].tolist() == [0]
    assert candidate_pairs(cache, scenario(task, active_in_last_days=2, **target), times)[0].tolist() == []
    if task != "multiclass":  # (one entity with a future: fewer than the 2 classes multiclass needs)
        assert examples(cache, recent).entity.tolist() == [0]


def test_multilabel_all_values_and_top_k(cache) -> None:
    sc = scenario("multilabel", column="item", min_positive_entities=1)
    spec = choose_classes(cache, sc, np.array([T]))
    assert spec.classes == ["a", "c"]
    ex = build_examples(cache, sc, spec, np.array([T]))
    assert ex.labels.tolist() == [[1, 1], [0, 0]]
    assert (
        choose_classes(
            cache, scenario("multilabel", column="item", min_positive_entities=0), np.array([T])
        ).classes
        == ITEMS
    )
    top = scenario("multilabel", column="item", min_positive_entities=0, top_k=1)
    assert choose_classes(cache, top, np.array([T])).classes == ["a"]  # ties: the lower code


def test_multiclass_most_frequent_value(cache) -> None:
    sc = scenario("multiclass", column="item", top_k=2)
    with pytest.raises(ConfigError, match=r"scenario 's': fewer than 2 classes of 'item' in training"):
        choose_classes(cache, sc, np.array([T]))  # one example, one class
    ex = build_examples(cache, sc, TargetSpec("multiclass", ["a", "c"], [1, 3]), np.array([T]))
    assert ex.entity.tolist() == [0] and ex.labels.tolist() == [1]  # c (2 events) beats a; entity 1 dropped
    other = build_examples(cache, sc, TargetSpec("multiclass", ["a", "(other)"], [1]), np.array([T]))
    assert other.labels.tolist() == [1]  # c is not a class: "(other)"


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ({"column": "amt"}, [8.0, 0.0]),
        ({"aggregation": "count"}, [3.0, 0.0]),
        ({"column": "amt", "log1p": True}, [np.log1p(8.0), 0.0]),
        ({"aggregation": "count", "filter": [{"column": "item", "value": "c"}]}, [2.0, 0.0]),
    ],
)
def test_regression_sum_count_log1p(cache, target, expected) -> None:
    ex = examples(cache, scenario("regression", **target))
    np.testing.assert_allclose(ex.labels, expected, rtol=1e-6)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ({}, {"c": 0.5, "a": 0.5}),
        ({"next_basket": True, "horizon_days": 28}, {"c": 0.5, "a": 0.5}),
        ({"items": "new"}, {"c": 1.0}),
        ({"items": "repeat"}, {"a": 1.0}),
        ({"decay": "sequential", "gamma": 0.5}, {"c": 2 / 3, "a": 1 / 3}),
        ({"horizon_days": 28}, {"c": 1 / 3, "a": 1 / 3, "d": 1 / 3}),
    ],
)
def test_recommendation_items_weights_and_filters(cache, target, expected) -> None:
    sc = Scenario.model_validate(
        {
            "name": "r",
            "task": "recommendation",
            "target": {
                "kind": "recommendation",
                "source": "ev",
                "column": "item",
                "horizon_days": 14,
                **target,
            },
        }
    )
    ex = examples(cache, sc)
    assert ex.entity.tolist() == [0]  # entity 1 bought nothing afterwards: dropped
    got = {ITEMS[j]: float(v) for j, v in zip(ex.labels.indices, ex.labels.values, strict=True)}
    assert got == pytest.approx(expected)


def test_recommendation_time_decay(cache) -> None:
    sc = Scenario.model_validate(
        {
            "name": "r",
            "task": "recommendation",
            "target": {
                "kind": "recommendation",
                "source": "ev",
                "column": "item",
                "horizon_days": 14,
                "decay": "time",
                "decay_half_life_days": 1.0,
            },
        }
    )
    w = dict(
        zip(
            examples(cache, sc).labels.indices.tolist(),
            examples(cache, sc).labels.values.tolist(),
            strict=True,
        )
    )
    assert w[0] / w[2] == pytest.approx(0.5 ** (1 / 24), rel=1e-5)  # a came an hour after c


def test_unknown_filter_value_and_wrong_column_type_are_config_errors(cache) -> None:
    with pytest.raises(ConfigError, match=r"value 'zz' never occurs in column 'item'"):
        examples(cache, scenario("binary", filter=[{"column": "item", "value": "zz"}]))
    with pytest.raises(ConfigError, match=r"column 'nope' is not in event source 'ev'"):
        examples(cache, scenario("binary", filter=[{"column": "nope", "value": 1}]))
    with pytest.raises(ConfigError, match=r"scenario 's': target.column 'amt' is not a categorical column"):
        examples(cache, scenario("multilabel", column="amt"))
    with pytest.raises(ConfigError, match=r"'item' is not a numeric column"):
        examples(cache, scenario("regression", column="item"))
    with pytest.raises(ConfigError, match=r"op '>' needs a numeric column"):
        examples(cache, scenario("binary", filter=[{"column": "item", "op": ">", "value": "a"}]))


def test_only_the_configs_mistakes_become_config_errors(cache, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unknown target source is the config's mistake (ConfigError naming the scenario); a bug in the code
    under it propagates as itself, not disguised as a config error."""
    with pytest.raises(ConfigError, match=r"scenario 's': target.source: event source 'nope' is not in"):
        examples(cache, scenario("binary", source="nope"))

    def broken(name: str) -> EventSource:
        raise KeyError(name)

    monkeypatch.setattr(cache, "source", broken)
    with pytest.raises(KeyError):
        examples(cache, scenario("binary"))


def test_events_api(cache) -> None:
    src = cache.source("ev")
    fut = SourceEvents(src, np.arange(2, 6), T, future=True)
    hist = SourceEvents(src, np.arange(0, 2), T, future=False)
    assert fut.count() == 4 and fut.exists() and fut.sum("amt") == 18.0 and fut.mean("amt") == 4.5
    assert fut.column("item").tolist() == ["c", "a", "c", "d"]
    assert fut.filter("item", "==", "c").sum("amt") == 6.0
    assert fut.filter("item", "in", ["a", "d"]).count() == 2
    assert fut.filter(fut.column("amt") > 4).count() == 2
    assert fut.within_days(0, 14).count() == 3 and fut.within_days(14).count() == 1
    assert hist.days.tolist() == [10.0, 3.0] and hist.within_days(0, 5).column("item").tolist() == ["b"]
    assert fut.group_count("item", ["a", "c", "b"]).tolist() == [1, 2, 0]
    assert fut.group_exists("item", ["a", "b"]).tolist() == [1, 0]
    assert np.isnan(fut.filter("item", "==", "b").mean("amt"))


def test_sparse_labels_rows_dense_and_columns() -> None:
    lab = SparseLabels.from_pairs(np.array([2, 0, 2]), np.array([1, 3, 0]), np.array([1.0, 2.0, 3.0]), 3, 4)
    dense = np.array([[0, 0, 0, 2], [0, 0, 0, 0], [3, 1, 0, 0]], np.float32)
    np.testing.assert_array_equal(lab.dense(), dense)
    np.testing.assert_array_equal(lab.rows(np.array([2, 0])).dense(), dense[[2, 0]])
    np.testing.assert_array_equal(label_columns(lab, np.array([3, 0])), dense[:, [3, 0]])


def test_sketch_head_decodes_the_trained_item_on_top() -> None:
    spec = TargetSpec(
        "recommendation",
        [],
        [],
        RecommendationDetails(
            n_items=500, head="sketch", partitions=4, width=64, seed=1, popularity=[1] * 500
        ),
    )
    head = task_for(spec)
    labels = SparseLabels.from_pairs(np.array([0]), np.array([123]), np.array([1.0]), 1, 500)
    target = head.targets(labels, np.array([0]))
    assert target.shape == (1, 256) and torch.allclose(target.view(4, 64).sum(1), torch.ones(4))
    logits = torch.log(target + 1e-6)  # the head predicts exactly the item's buckets
    items, scores = head.top_items(logits.numpy(), 5)
    assert items[0, 0] == 123 and scores[0, 0] > scores[0, 1]
    assert head.loss(logits, target) < head.loss(torch.zeros_like(logits), target)


def test_lora_starts_as_identity_and_merges_exactly() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    x = torch.randn(5, 6)
    before = net(x).detach()
    params = add_lora(net, rank=2)
    assert isinstance(net[0], LoRALinear) and len(params) == 4
    assert torch.allclose(net(x), before)  # B = 0 at the start
    assert all(not p.requires_grad for n, p in net.named_parameters() if "lora" not in n)
    with torch.no_grad():
        for p in params:
            p.add_(0.1)
    adapted = net(x).detach()
    merge_lora(net)
    assert isinstance(net[0], nn.Linear) and torch.allclose(net(x), adapted, atol=1e-5)


def test_own_history_bonus_lifts_past_items_by_the_chosen_weight() -> None:
    spec = TargetSpec("recommendation", [], [], RecommendationDetails(n_items=6, popularity=[1] * 6))
    head = task_for(spec)
    logits = np.log(
        np.array([[0.5, 0.3, 0.1, 0.05, 0.03, 0.02], [0.5, 0.3, 0.1, 0.05, 0.03, 0.02]], np.float32)
    )
    history = (np.array([1]), np.array([4]), np.array([3.0]))  # row 1 bought item 4 (decayed count 3)
    assert head.top_items(logits, 2, history=history, weight=0.0)[0].tolist() == [[0, 1], [0, 1]]
    items, scores = head.top_items(logits, 2, history=history, weight=4.0)
    assert items.tolist() == [[0, 1], [4, 0]]
    assert scores[1, 0] == pytest.approx(np.log(0.03) + 4.0 * np.log1p(3.0), rel=1e-5)
