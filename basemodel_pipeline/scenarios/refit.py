"""Refitting a scenario's published candidate on more windows once it is chosen and measured
(finetune.refit_on_validation: training + validation; finetune.refit_on_all: the test window too)."""

from __future__ import annotations

from typing import Any

import numpy as np

from basemodel_pipeline import runtime
from basemodel_pipeline.config import Scenario
from basemodel_pipeline.model.trunk import TrunkWithHead
from basemodel_pipeline.progress import Progress
from basemodel_pipeline.scenarios.candidates import Blend, Candidate, Neural
from basemodel_pipeline.scenarios.examples import Examples, TargetSpec, concat_examples
from basemodel_pipeline.scenarios.network import train_network
from basemodel_pipeline.scenarios.rerank import NeuralRanking, Reranker
from basemodel_pipeline.scenarios.shared import Shared
from basemodel_pipeline.tasks import task_named


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
    window when `parts` holds "test": finetune.refit_on_all), for the epochs / rounds early stopping chose
    (finetune.refit_on_validation). Returns (network, its test outputs)."""
    mode = scenario.mode or shared.cfg.training_params.finetune.mode
    labelled = [parts["train"], parts["stop"], parts["select"], *([parts["test"]] if "test" in parts else [])]
    everything = concat_examples(labelled)
    task = task_named(scenario.task)
    if uses_network(published):
        sign = 1.0 if task.higher_is_better() else -1.0
        scores = [sign * h["val_metric"] if np.isfinite(h["val_metric"]) else -np.inf for h in history]
        epochs = int(np.argmax(scores)) + 1
        progress.log(
            f"{scenario.name}: refitting the network on {len(everything):,} examples for {epochs} epochs"
        )
        model = train_network(
            shared, scenario, spec, {"train": everything, "val": parts["select"]}, progress, epochs
        )[0]
        model.to(runtime.resolve_device(shared.cfg.training_params.foundation.device))
    # the re-ranker learns from validation windows only (rerank.Reranker.fit): all of them now
    windows = concat_examples(labelled[1:]) if task.ranked else everything
    progress.log(f"{scenario.name}: refitting {type(published).__name__} on {len(windows):,} examples")
    published.refit(shared.rows_of(windows, model, mode))
    rows = shared.rows_of(test, model, mode)
    return model, (published.rank(rows)[0] if task.ranked else published.predict(rows))
