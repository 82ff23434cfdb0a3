"""Every candidate of the zoo keeps the one estimator protocol, for every task type it applies to.

On the tiny synthetic data set (extract, cache and a feature encoder; a network with random weights stands
in for the fine-tuned one, since the protocol does not depend on what the network learned), each candidate is
fitted on the training windows (early stopping on the validation windows), and then:

* predict returns the task's contract: binary [n] probabilities, multiclass [n, C] rows summing to 1,
  multilabel [n, C] probabilities, regression [n] values inside the training labels' range, recommendation
  [n, K] ranked catalogue items without repeats; every value finite;
* save -> load_candidate gives the same predictions;
* describe() is JSON: its name, a one-line description, the inputs it reads and its fitted parameters, the
  same once loaded;
* refit on the training and validation windows runs and keeps the contract.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.candidates.bagging import SeedBag
from basemodel_pipeline.candidates.base import Context
from basemodel_pipeline.candidates.blend import Blend
from basemodel_pipeline.candidates.inputs import Rows, RowView
from basemodel_pipeline.candidates.lightgbm import LightGBM
from basemodel_pipeline.candidates.loading import load_candidate
from basemodel_pipeline.candidates.zoo import candidate_models
from basemodel_pipeline.config import load_config
from basemodel_pipeline.model.checkpoint import TrunkConfig, build_model
from basemodel_pipeline.pipeline import run_cache, run_extract
from basemodel_pipeline.targets.labels import Examples, concat_examples
from basemodel_pipeline.tasks import task_for, task_named
from basemodel_pipeline.training.pretrain import fit_encoder
from basemodel_pipeline.training.splits import scenario_split_times
from basemodel_pipeline.workspace import cache_dir

SCENARIOS = {  # one declarative scenario per task type, on the tiny data set's transactions
    "binary": {
        "kind": "binary",
        "horizon_days": 14,
        "filter": [{"column": "department", "op": "==", "value": "GROCERY"}],
    },
    "multiclass": {"kind": "multiclass", "column": "department", "horizon_days": 14, "top_k": 4},
    "multilabel": {
        "kind": "multilabel",
        "column": "manufacturer_id",
        "horizon_days": 14,
        "min_positive_entities": 0,
    },
    "regression": {"kind": "regression", "column": "sales_value", "horizon_days": 28, "log1p": True},
    "recommendation": {"kind": "recommendation", "column": "product_id", "horizon_days": 14},
}
CLASSIFIERS = ("neural", "lightgbm_hybrid", "lightgbm_aggregates", "popularity", "lightgbm_hybrid_seeds")
CANDIDATES = {  # the zoo per task type (test_the_list_is_the_zoo checks it against candidate_models)
    **{task: (*CLASSIFIERS, "blend") for task in ("binary", "multiclass", "multilabel", "regression")},
    "recommendation": (
        "neural",
        "repeat_purchases",
        "popularity",
        "recent_popularity",
        "cooccurrence",
        "reranker",
    ),
}
BLENDED = ("neural", "lightgbm_aggregates")  # two of the members finetune._choose blends: enough here
BAG_SEEDS = 2  # the seed ensemble's members here (the zoo fits bagging.BAG_SEEDS): the protocol is the same
RANKS_ONLY = {("binary", "popularity")}  # recent activity: a score that ranks, not a probability
DESCRIPTION_KEYS = {"name", "description", "inputs", "parameters"}


@dataclasses.dataclass
class TaskRows:
    """What the candidates of one scenario are fitted and scored on."""

    ctx: Context
    train: Rows
    stop: Rows
    score: Rows  # the test windows
    refit: Rows  # train + stop, as refit_on_validation learns them


class World:
    """The tiny data set's cache and feature encoder; each task's rows built once, on first use."""

    def __init__(self, directory: Path, tiny_dataset: Path) -> None:
        shutil.copytree(tiny_dataset.parent / "data", directory / "data")
        raw = yaml.safe_load(tiny_dataset.read_text())
        raw["scenarios"] = [
            {"name": task, "task": task, "target": {"source": "transactions", **target}, "k": 5}
            for task, target in SCENARIOS.items()
        ]
        (directory / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
        self.cfg = load_config(directory / "config.yaml")
        run_extract(self.cfg)
        run_cache(self.cfg)
        self.cache = EventCache(cache_dir(self.cfg))
        self.enc = fit_encoder(self.cache, self.cfg)

    @cache  # noqa: B019 - one World per module, kept for its lifetime
    def rows(self, task: str) -> TaskRows:
        scenario = self.cfg.scenario(task)
        times = scenario_split_times(
            self.cfg.data_params,
            scenario.target.horizon_days,
            task,
            last_day=self.cache.source_max_date(scenario.target.source),
        )
        spec = task_named(task).spec_for(self.cache, scenario, times["train"])
        ex = {k: task_for(spec).labelled(self.cache, scenario, times[k]) for k in ("train", "val", "test")}
        spec.details = task_named(task).fit_details(spec.details, ex["train"].labels)
        ctx = Context(scenario, spec, task_for(spec), seed=0)
        torch.manual_seed(0)
        arch = TrunkConfig(
            in_dim=self.enc.dim, hidden_dim=32, num_blocks=1, dropout=0.0, out_dim=ctx.task.out_dim
        )
        net = build_model(arch).eval()
        every = concat_examples(list(ex.values()))
        X = self.enc.history(self.cache, every.entity, every.time)
        net.trunk.set_stats(torch.from_numpy(X.mean(0)), torch.from_numpy(X.std(0)))

        def of(part: Examples) -> Rows:
            X = self.enc.history(self.cache, part.entity, part.time).astype(np.float16)
            return Rows(self.cache, self.enc, part.entity, part.time, RowView(X), part.labels, net)

        refit = concat_examples([ex["train"], ex["val"]])
        return TaskRows(ctx, of(ex["train"]), of(ex["val"]), of(ex["test"]), of(refit))


@pytest.fixture(scope="module")
def world(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> World:
    return World(tmp_path_factory.mktemp("conformance"), tiny_dataset)


def fitted(rows: TaskRows, name: str) -> Any:
    """Candidate `name` of the zoo, fitted as fine-tuning fits it (the blend on its members' outputs)."""
    zoo = candidate_models(rows.ctx, list(CANDIDATES[rows.ctx.task.name]), small=True)
    if name == "lightgbm_hybrid_seeds":
        zoo[name] = SeedBag(rows.ctx, lambda c: LightGBM(c, "hybrid"), name, seeds=BAG_SEEDS)
    if name != "blend":
        zoo[name].fit(rows.train, rows.stop)
        return zoo[name]
    members = [zoo[m] for m in BLENDED]
    for m in members:
        m.fit(rows.train, rows.stop)
    y = rows.ctx.task.truth(rows.stop.labels)
    return Blend(rows.ctx, members).fit_outputs([m.predict(rows.stop) for m in members], y)


def check_contract(rows: TaskRows, name: str, scored: Rows, out: Any) -> None:
    """The outputs of `scored` hold the task's contract (module docstring)."""
    task, spec, n = rows.ctx.task, rows.ctx.spec, len(scored)
    out = np.asarray(out)
    assert len(out) == n, f"{name}: {len(out)} outputs for {n} rows"
    if task.ranked:
        n_items = task.d.n_items
        assert out.ndim == 2 and out.shape[1] >= 1 and np.issubdtype(out.dtype, np.integer)
        assert ((out >= 0) & (out < n_items)).all(), f"{name}: items outside the catalogue"
        assert all(len(set(r)) == len(r) for r in out.tolist()), f"{name}: an item ranked twice in a row"
        return
    assert np.isfinite(out).all(), f"{name}: values that are not finite"
    if task.name == "regression":
        d = spec.details
        assert out.shape == (n,) and (out >= d.min - 1e-9).all() and (out <= d.max + 1e-9).all()
        return
    if task.per_class:
        assert out.shape == (n, len(spec.classes)), f"{name}: shape {out.shape}"
    else:
        assert out.shape == (n,), f"{name}: shape {out.shape}"
    if (task.name, name) not in RANKS_ONLY:
        assert (out >= 0).all() and (out <= 1).all(), f"{name}: probabilities outside [0, 1]"
    if task.name == "multiclass":
        np.testing.assert_allclose(out.sum(1), 1.0, atol=1e-6, err_msg=f"{name}: rows do not sum to 1")


CASES = [(task, name) for task, names in CANDIDATES.items() for name in names]


@pytest.mark.parametrize(("task", "name"), CASES, ids=[f"{t}-{n}" for t, n in CASES])
def test_every_candidate_keeps_the_protocol(world: World, task: str, name: str) -> None:
    rows = world.rows(task)
    cand = fitted(rows, name)
    assert cand.name == name
    out = cand.predict(rows.score)
    check_contract(rows, name, rows.score, out)

    meta, files = cand.save()
    meta = json.loads(json.dumps(meta))  # as the checkpoint's model.json holds it
    again = load_candidate(meta, files, rows.ctx)
    np.testing.assert_array_equal(np.asarray(again.predict(rows.score)), np.asarray(out))

    described = cand.describe()
    assert set(described) >= DESCRIPTION_KEYS, f"{name}: describe() lacks {DESCRIPTION_KEYS - set(described)}"
    assert described["name"] == name and described["description"].strip()
    assert "\n" not in described["description"], "one line"
    assert described["inputs"] and all(isinstance(i, str) for i in described["inputs"])
    assert isinstance(described["parameters"], dict)
    assert json.loads(json.dumps(described, allow_nan=False)) == described  # plain JSON, no NaN
    assert again.describe() == described  # what was saved says what it is, once loaded for scoring

    cand.refit(rows.refit)
    check_contract(rows, name, rows.score, cand.predict(rows.score))


@pytest.mark.parametrize("task", list(CANDIDATES))
def test_the_list_is_the_zoo(world: World, task: str) -> None:
    """What the conformance test covers is every candidate the zoo fits for the task (the blend besides)."""
    ctx = world.rows(task).ctx
    everything = list(candidate_models(ctx, list(CANDIDATES[task]), small=True))
    assert sorted([*everything, *(["blend"] if not ctx.task.ranked else [])]) == sorted(CANDIDATES[task])
