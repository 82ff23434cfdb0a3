"""A new task type is one class in one module (docs/tasks.md, "Adding a task"): the class below, registered
from this test module alone under a name of its own, builds its own labels from a declarative target and goes
through fine-tuning end to end on the tiny workspace (config validation, examples, the network, the
baselines, selection, the published checkpoint)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.cache.windows import resolve_windows
from basemodel_pipeline.config import Scenario, load_config
from basemodel_pipeline.errors import ConfigError
from basemodel_pipeline.pipeline import run_finetune
from basemodel_pipeline.scenarios.targets import build_examples, choose_classes
from basemodel_pipeline.targets.events import window_events
from basemodel_pipeline.targets.labels import Examples
from basemodel_pipeline.targets.windows import candidate_pairs
from basemodel_pipeline.tasks import TASKS, register, task_named, unregister
from basemodel_pipeline.tasks.binary import Binary
from basemodel_pipeline.training.splits import scenario_split_times
from basemodel_pipeline.workspace import cache_dir

FEW = 4  # a light shopper: at most this many matching events in the window


class LightShopper(Binary):
    """Binary but for its labels: 1 when the window holds at most FEW matching events (a binary target reads
    the window, ``kind: binary``), where the shipped task asks whether there is any."""

    name = "light_shopper"
    target_kind = "binary"

    def examples(self, cache: EventCache, scenario: Scenario, times: np.ndarray) -> Examples:
        e, t = candidate_pairs(cache, scenario, times)
        owner, _ = window_events(cache, scenario, e, t)
        return Examples(e, t, (np.bincount(owner, minlength=len(e)) <= FEW).astype(np.float32))


@pytest.fixture
def light_shopper(tiny_trained: Path, tmp_path: Path):
    """A copy of the trained tiny workspace whose one scenario is a light_shopper task; the task registered."""
    shutil.copytree(tiny_trained.parent, tmp_path / "ws", symlinks=True)
    config = tmp_path / "ws" / "config.yaml"
    raw = yaml.safe_load(config.read_text())
    (churn,) = [s for s in raw["scenarios"] if s["name"] == "churn"]
    target = {k: v for k, v in churn["target"].items() if k != "event"}
    raw["scenarios"] = [
        {
            "name": "light",
            "task": "light_shopper",
            "target": {**target, "kind": "binary"},
            "refit_on_all": False,
        }
    ]
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ConfigError, match="task 'light_shopper' is not a task type; known: binary"):
        load_config(config)  # unknown until its module registers it
    register(LightShopper)
    try:
        yield load_config(config)
    finally:
        unregister("light_shopper")
    assert "light_shopper" not in TASKS


def test_a_new_task_with_its_own_labels_fine_tunes_end_to_end(light_shopper) -> None:
    cfg = light_shopper
    scenario = cfg.scenario("light")
    cache = EventCache(cache_dir(cfg))
    split = scenario_split_times(
        resolve_windows(cfg).data_params, scenario.target.horizon_days, scenario.name
    )
    times = np.asarray(split["train"])
    spec = choose_classes(cache, scenario, times)
    assert spec.task == "light_shopper" and task_named(spec.task) is LightShopper
    ex = build_examples(cache, scenario, spec, times)
    count = np.bincount(window_events(cache, scenario, ex.entity, ex.time)[0], minlength=len(ex))
    np.testing.assert_array_equal(ex.labels, count <= FEW)
    assert 0 < ex.labels.mean() < 1 and (ex.labels != (count > 0)).any()  # not the shipped binary's labels
    meta = run_finetune(cfg, "light")
    metrics = json.loads((Path(meta["path"]) / "metrics.json").read_text())
    assert metrics["metric"] == "auroc" and np.isfinite(metrics["test"]["model"])
    assert metrics["published"] in metrics["selection"]["validation"]
    assert {"neural", "popularity", "lightgbm_aggregates"} <= set(metrics["test_metrics"])
    stored = json.loads((Path(meta["path"]) / "model.json").read_text())
    assert stored["target"]["task"] == "light_shopper"
