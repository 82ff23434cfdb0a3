"""Refitting a scenario's published candidate on more windows once it is chosen and measured
(finetune.refit_on_validation: training + validation; finetune.refit_on_all, the production refit: every
window whose label is complete by the data's end), and the windows each fit learned from."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import numpy as np

from basemodel_pipeline import runtime
from basemodel_pipeline.candidates.base import Candidate
from basemodel_pipeline.candidates.blend import Blend
from basemodel_pipeline.candidates.neural import Neural
from basemodel_pipeline.candidates.ranking_baselines import NeuralRanking
from basemodel_pipeline.candidates.rerank import Reranker
from basemodel_pipeline.config import Scenario
from basemodel_pipeline.dates import iso_day
from basemodel_pipeline.model.trunk import TrunkWithHead
from basemodel_pipeline.progress import Progress
from basemodel_pipeline.scenarios.fitting import Beside
from basemodel_pipeline.scenarios.network import train_network
from basemodel_pipeline.scenarios.shared import Shared
from basemodel_pipeline.targets.labels import Examples, TargetSpec, concat_examples
from basemodel_pipeline.tasks import task_named
from basemodel_pipeline.training.fit import Stopping, best_epoch


def uses_network(cand: Candidate) -> bool:
    if isinstance(cand, Blend):
        return any(uses_network(m) for m in cand.members)
    return isinstance(cand, (Neural, NeuralRanking, Reranker))


def refit(
    shared: Shared,
    scenario: Scenario,
    spec: TargetSpec,
    parts: dict[str, Examples],
    test: Examples,
    model: TrunkWithHead,
    history: list[dict],
    published: Candidate,
    progress: Progress,
) -> tuple[TrunkWithHead, Any]:
    """The published candidate trained again on the training and validation windows together (and the test
    window and any later complete window when `parts` holds "test" and "newest": finetune.refit_on_all), for the epochs / rounds early stopping chose
    (finetune.refit_on_validation). Returns (network, its test outputs)."""
    mode = scenario.mode or shared.cfg.training_params.finetune.mode
    later = [parts[k] for k in ("test", "newest") if k in parts]  # refit_on_all: the newest complete windows
    labelled = [parts["train"], parts["stop"], parts["select"], *later]
    everything = concat_examples(labelled)
    task = task_named(scenario.task)
    # the re-ranker learns from validation windows only (rerank.Reranker.fit): all of them now
    windows = concat_examples(labelled[1:]) if task.ranked else everything
    progress.log(f"{scenario.name}: refitting {type(published).__name__} on {len(windows):,} examples")
    beside = None
    if uses_network(published) and mode == "frozen" and not task.ranked:  # no member but the network reads
        # the head (fit_beside_network): the others refit on a second thread while the head trains on one
        beside = Beside(lambda: published.refit(shared.rows_of(windows, None, mode)))
    if uses_network(published):
        # the epoch train_network kept
        epochs = best_epoch(history, Stopping("val_metric", task.higher_is_better()))
        progress.log(
            f"{scenario.name}: refitting the network on {len(everything):,} examples for {epochs} epochs"
        )
        model = train_network(
            shared, scenario, spec, {"train": everything, "val": parts["select"]}, progress, epochs
        )[0]
        model.to(runtime.resolve_device(shared.cfg.training_params.foundation.device))
    if beside is not None:
        beside.result()
    else:
        published.refit(shared.rows_of(windows, model, mode))
    rows = shared.rows_of(test, model, mode)
    return model, (published.rank(rows)[0] if task.ranked else published.predict(rows))


def production_refit(
    shared: Shared,
    scenario: Scenario,
    spec: TargetSpec,
    everything: dict[str, Examples],
    model: TrunkWithHead,
    history: list[dict],
    published: Candidate,
    progress: Progress,
    result: dict[str, Any],
) -> TrunkWithHead:
    """The published candidate trained again on every complete window (finetune.refit_on_all); `result`
    (metrics.json) records it. Returns the refitted network."""
    t0 = time.perf_counter()
    test = everything["test"]
    model, outputs = refit(shared, scenario, spec, everything, test, model, history, published, progress)
    result["timing_s"]["refit_all_s"] = round(time.perf_counter() - t0, 2)
    newer = " + newer complete windows" if "newest" in everything else ""
    result["refit"] = {
        **result.get("refit", {}),
        "refit_on_all": True,
        "windows": "training + validation + test" + newer,
        "test_metrics": "of the model before this refit (the refitted model has seen the test window)",
        # what is served must score: the gates judge the evaluated model's metrics, and this (evaluation/gates.py)
        "outputs_finite": bool(np.isfinite(np.asarray(outputs, np.float64)).all()),
    }
    return model


def fit_windows(parts: list[Examples], scenario: Scenario) -> dict[str, Any]:
    """The label windows a fit learned from: its first and last split points, the end of its newest label
    window (last split point + horizon, exclusive) and how many examples."""
    times = np.concatenate([p.time for p in parts if len(p)])
    last = iso_day(int(times.max()))
    end = dt.date.fromisoformat(last) + dt.timedelta(days=scenario.target.horizon_days)
    return {
        "first_split": iso_day(int(times.min())),
        "last_split": last,
        "newest_label_end": end.isoformat(),
        "examples": int(times.size),
    }
