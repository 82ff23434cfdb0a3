"""A scenario's candidates fitted: the network's trained head read by those that need it, the others fitted
beside the network's training when nothing they read depends on it (a frozen trunk), the staged baselines read
instead of fitted again (scenarios/staging.py). The candidates themselves are candidates/'s."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from basemodel_pipeline import runtime
from basemodel_pipeline.candidates.base import Candidate, Context
from basemodel_pipeline.candidates.inputs import Rows
from basemodel_pipeline.candidates.ranking_baselines import NeuralRanking, tune_repeat_weight
from basemodel_pipeline.candidates.zoo import candidate_models
from basemodel_pipeline.config import Scenario
from basemodel_pipeline.model.trunk import TrunkWithHead
from basemodel_pipeline.progress import Progress
from basemodel_pipeline.scenarios import staging
from basemodel_pipeline.scenarios.shared import SMALL_ENTITIES, Shared
from basemodel_pipeline.targets.labels import Examples, TargetSpec
from basemodel_pipeline.tasks import Task
from basemodel_pipeline.tasks.recommendation import Recommendation

T = TypeVar("T")


@dataclass
class Fit:
    """A scenario's candidates, fitted (or read from the staged baselines), and the rows they score."""

    ctx: Context
    rows: dict[str, Rows]  # train, stop, select, test
    candidates: dict[str, Candidate]
    stage: staging.Stage | None  # the staged baselines' validation and test outputs, when they were staged
    stage_info: dict[str, Any]
    fit_s: dict[str, float]  # seconds per candidate fitted here
    calibrations: dict[str, Any] = field(default_factory=dict)  # per output, from validation (Task.calibrate)


def fit_candidates(
    shared: Shared,
    scenario: Scenario,
    spec: TargetSpec,
    parts: dict[str, Examples],
    model: TrunkWithHead,
    task: Task,
    mode: str,
    progress: Progress,
    beside: Beside[Fit] | None = None,
) -> Fit:
    """Every candidate the scenario names, fitted on the training rows (early stopping on "stop"); the
    baselines staged by run_baselines are read instead of fitted again. ``beside``: those candidates were
    fitted while the network trained (fit_beside_network)."""
    rows = {k: shared.rows_of(v, model, mode) for k, v in parts.items()}
    if beside is not None:
        return dataclasses.replace(beside.result(), rows=rows)
    return fit_without_network(shared, scenario, spec, rows, task, progress)


class Beside(threading.Thread, Generic[T]):
    """Work that reads no trained head (the candidates' fits and refits beside a frozen trunk's head) on a
    thread of its own (a daemon: a stopped stage does not wait for it)."""

    def __init__(self, work: Callable[[], T]) -> None:
        super().__init__(name="candidates", daemon=True)
        self.work, self.out, self.error = work, None, None
        self.start()

    def run(self) -> None:
        try:
            self.out = self.work()
        except BaseException as exc:  # re-raised in the stage's thread by result()
            self.error = exc

    def result(self) -> T:
        self.join()
        if self.error is not None:
            raise self.error
        return self.out  # type: ignore[return-value]


def fit_beside_network(
    shared: Shared,
    scenario: Scenario,
    spec: TargetSpec,
    parts: dict[str, Examples],
    task: Task,
    mode: str,
    progress: Progress,
) -> Beside[Fit] | None:
    """With a frozen trunk no candidate but the network reads the trained head (they read the aggregates and
    the trunk's embeddings), and the head trains on one CPU thread: the others fit meanwhile on a second one.
    The trunk's passes are made first, so the two threads only read them. Ranking candidates score with the
    network's outputs: they wait for it."""
    if mode != "frozen" or task.ranked:
        return None
    shared.trunk_outputs(runtime.resolve_device(shared.cfg.training_params.foundation.device))

    def work() -> Fit:
        rows = {k: shared.rows_of(v, None, mode) for k, v in parts.items()}  # no head: not read here
        return fit_without_network(shared, scenario, spec, rows, task, progress)

    return Beside(work)


def fit_without_network(
    shared: Shared,
    scenario: Scenario,
    spec: TargetSpec,
    rows: dict[str, Rows],
    task: Task,
    progress: Progress,
) -> Fit:
    """The candidates of the zoo on `rows`: the staged baselines read, the others but the network fitted."""
    cfg = shared.cfg
    ctx = Context(scenario, spec, task, cfg.training_params.finetune.seed, progress)
    candidates = candidate_models(ctx, scenario.candidates, small=shared.cache.n_entities < SMALL_ENTITIES)
    if isinstance(ctx.task, Recommendation):
        weight = tune_repeat_weight(ctx, rows["stop"])
        ctx.task.d.repeat_weight = weight
        candidates["neural"] = NeuralRanking(ctx, weight)
        progress.log(f"{scenario.name}: weight of the own purchase history {weight}")
    stage, stage_info = staging.staged_for(shared.cfg, scenario, shared.stage_key(scenario), rows, progress)
    if stage is not None:  # fitted by the scenario's CPU step (run_baselines): read, not fitted again
        candidates.update({k: v for k, v in stage.candidates(ctx).items() if k in candidates})
    staged = stage.select if stage is not None else {}
    fit_s: dict[str, float] = {}
    for name, cand in candidates.items():
        if name == "neural" or name in staged:
            continue
        t0 = time.perf_counter()
        progress.log(f"{scenario.name}: fitting candidate {name} on {len(rows['train']):,} training examples")
        cand.fit(rows["train"], rows["stop"])
        fit_s[name] = round(time.perf_counter() - t0, 2)
        progress.log(f"{scenario.name}: {name} fitted in {fit_s[name]} s")
    return Fit(ctx, rows, candidates, stage, stage_info, fit_s)
