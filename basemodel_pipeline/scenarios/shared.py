"""What the scenarios of one fine-tuning run share: the foundation, the event cache and the featurised
examples (``Shared``), the examples of a scenario and their splits, and the data regime (which candidates
it fits is candidates/zoo.py's)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from basemodel_pipeline import runtime
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.cache.versions import data_version as cache_data_version
from basemodel_pipeline.candidates.inputs import Rows, RowView, _Embed, tabular_from_features
from basemodel_pipeline.candidates.selection import split_validation
from basemodel_pipeline.config import PipelineConfig, Scenario
from basemodel_pipeline.config.params import FinetuneParams
from basemodel_pipeline.errors import DataError
from basemodel_pipeline.features.sketch import FeatureEncoder
from basemodel_pipeline.model.checkpoint import CheckpointMeta, build_model, load_trunk_state, read_meta
from basemodel_pipeline.model.trunk import TrunkWithHead
from basemodel_pipeline.progress import Progress
from basemodel_pipeline.scenarios import staging
from basemodel_pipeline.scenarios.targets import build_examples, choose_classes
from basemodel_pipeline.targets.labels import Examples, TargetSpec
from basemodel_pipeline.tasks import task_named
from basemodel_pipeline.training.splits import scenario_split_times
from basemodel_pipeline.workspace import cache_dir

SMALL_ENTITIES = 1000  # fewer entities: the "small" data regime (data_regime)
FEATURISE_BLOCK = 32768  # examples featurised (on the training device) and copied to host memory at a time


@dataclass
class Shared:
    """What several scenarios share: the cache, the foundation, and features of (entity, time) pairs."""

    cfg: PipelineConfig
    cache: EventCache
    fmeta: CheckpointMeta
    foundation: Any
    enc: FeatureEncoder
    keys: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))
    X: np.ndarray | None = None  # float16 [n, D]: features of every distinct (entity, time) pair
    H: np.ndarray | None = None  # frozen trunk outputs of X
    E: np.ndarray | None = None  # frozen trunk embeddings (residual stream) of X
    A: np.ndarray | None = None  # the automatic aggregates of X as plain numbers (Rows.tabular)
    regime: str = "standard"
    available: dict[str, dict[str, int]] = field(default_factory=dict)  # examples per split before the caps

    def rows(self, ex: Examples) -> np.ndarray:
        """Row of each example in X (keys are sorted (entity, time) pairs)."""
        q = ex.entity * (1 << 40) + ex.time
        k = self.keys[:, 0] * (1 << 40) + self.keys[:, 1]
        return np.searchsorted(k, q)

    def featurise(self, examples: list[Examples]) -> float:
        """Features of every distinct (entity, time) pair of `examples` in one pass; returns seconds."""
        t0 = time.perf_counter()
        entity = np.concatenate([x.entity for x in examples])
        times = np.concatenate([x.time for x in examples])
        # the distinct pairs in (entity, time) order: a 1-D unique of rows()'s combined keys, not a row-wise one
        _, first = np.unique(entity * (1 << 40) + times, return_index=True)
        self.keys = np.stack([entity[first], times[first]], 1)
        device = runtime.resolve_device(self.cfg.training_params.foundation.device)  # the GPU featurises too
        # float16, as the per-entity state stores features: training sees what scoring will see, in half the
        # memory of float32 (the largest allocation of fine-tuning); batches reach the models as float32
        # (runtime.take). Written in place chunk by chunk: the keys are sorted, so each chunk is one slice.
        self.X = runtime.host_array((len(self.keys), self.enc.dim), np.float16)
        self.enc.history_t(
            self.cache,
            self.keys[:, 0],
            self.keys[:, 1],
            FEATURISE_BLOCK,
            device,
            out=torch.from_numpy(self.X),
        )
        return time.perf_counter() - t0

    def trunk_outputs(self, device: torch.device) -> np.ndarray:
        """The frozen trunk's outputs: its final LayerNorm of the embeddings, so one pass over X gives both."""
        if self.H is None:
            model = self.new_model(1).to(device)
            self.H = runtime.predict(model.trunk.norm, self.embeddings(device), device)
        return self.H

    def embeddings(self, device: torch.device) -> np.ndarray:
        """The frozen trunk's embeddings of X, in finetune.precision (trunk_amp)."""
        if self.E is None:
            model = self.new_model(1).to(device)
            assert self.X is not None
            self.E = runtime.predict(_Embed(model), self.X, device, amp=self.trunk_amp(device))
        return self.E

    def trunk_amp(self, device: torch.device) -> torch.dtype | None:
        """The autocast dtype of the frozen trunk's pass: bf16 where finetune.precision says so (auto: where
        `device` runs it natively, as `predict` serves the model), else None (fp32)."""
        precision = self.cfg.training_params.finetune.precision
        bf16 = precision == "bf16" or (precision == "auto" and runtime.native_bf16(device))
        return torch.bfloat16 if bf16 else None

    def rows_of(self, ex: Examples, model: TrunkWithHead, mode: str) -> Rows:
        """The candidates' view of examples: features, labels and the trained network. With a frozen trunk
        the network's outputs and the embeddings come from the shared trunk passes."""
        assert self.X is not None
        idx = self.rows(ex)
        device = runtime.resolve_device(self.cfg.training_params.foundation.device)
        rows = Rows(self.cache, self.enc, ex.entity, ex.time, RowView(self.X, idx), ex.labels, model, device)
        rows.deferred = self._deferred()
        if mode == "frozen":  # the trunk is the foundation's: its passes over X serve every scenario
            rows.deferred["logits"] = lambda i: runtime.predict(
                model.head, self.trunk_outputs(device)[i], device
            )
            rows.deferred["embedding"] = lambda i: self.embeddings(device)[i]
        return rows

    def plain_rows(self, ex: Examples) -> Rows:
        """The candidates' view of examples without the network (aggregates, cache): the baselines'."""
        assert self.X is not None
        idx = self.rows(ex)
        rows = Rows(self.cache, self.enc, ex.entity, ex.time, RowView(self.X, idx), ex.labels)
        rows.deferred = self._deferred()
        return rows

    def _deferred(self) -> dict:
        """The aggregates of every distinct example, un-squashed once for all scenarios and splits, taken by
        the rows that read them (Rows computes them from the cache when the encoder has none)."""
        return {"tabular": lambda i: self.tabular()[i]} if self.enc.aggregate_dim else {}

    def tabular(self) -> np.ndarray:
        if self.A is None:
            assert self.X is not None
            self.A = tabular_from_features(self.enc, RowView(self.X))
        return self.A

    def stage_key(self, scenario: Scenario) -> str:
        """The key of the scenario's staged baselines for this cache and encoder (scenarios/staging.py)."""
        version = cache_data_version(self.cache.manifest)
        return staging.stage_key(self.cfg, scenario, version, self.fmeta.encoder)

    def new_model(self, out_dim: int) -> TrunkWithHead:
        model = build_model(self.fmeta.arch.with_out_dim(out_dim))
        model.trunk.load_state_dict(load_trunk_state(self.foundation))
        return model


def open_shared(cfg: PipelineConfig, progress: Progress) -> Shared:
    """The cache and the latest foundation (its feature encoder), before any featurisation."""
    cache = EventCache(cache_dir(cfg))
    foundation = ws.latest_foundation_dir(cfg)
    fmeta = read_meta(foundation)
    shared = Shared(cfg, cache, fmeta, foundation, FeatureEncoder.from_dict(fmeta.encoder))
    shared.regime = data_regime(cache.n_entities)
    progress.log(f"data regime: {shared.regime}")
    return shared


def split_parts(ex: dict[str, Examples]) -> dict[str, Examples]:
    """train, stop (early stopping) and select (the comparison): the validation examples' two entity halves."""
    stop_idx, select_idx = split_validation(ex["val"].entity)
    return {"train": ex["train"], "stop": ex["val"].subset(stop_idx), "select": ex["val"].subset(select_idx)}


def _check_split(name: str, part: str, ex: Examples, task: str) -> None:
    if len(ex) == 0:
        raise DataError(
            f"scenario '{name}': the {part} split has no examples; check data_params and the target"
        )
    if task_named(task).needs_both_labels and len(np.unique(ex.labels)) < 2:
        raise DataError(
            f"scenario '{name}': the {part} split has only one label value ({ex.labels[0]:.0f}); "
            "the target never (or always) happens there"
        )


def refits(cfg: PipelineConfig, scenario: Scenario) -> bool:
    """Whether the scenario's published candidate gets the production refit on every complete window."""
    own = scenario.refit_on_all
    return cfg.training_params.finetune.refit_on_all if own is None else own


def prepare(shared: Shared, scenario: Scenario) -> tuple[TargetSpec, dict[str, Examples]]:
    """The scenario's target spec and examples: train, val, test and, for the production refit, "newest"
    (complete windows after the test points, when there are any)."""
    times = scenario_split_times(
        shared.cfg.data_params,
        scenario.target.horizon_days,
        f"scenario '{scenario.name}'",
        last_day=shared.cache.source_max_date(scenario.target.source),
        newest=refits(shared.cfg, scenario),
    )
    spec = choose_classes(shared.cache, scenario, times["train"])
    ex = {k: build_examples(shared.cache, scenario, spec, v) for k, v in times.items()}
    shared.available[scenario.name] = {k: len(v) for k, v in ex.items()}
    ex = cap_examples(ex, shared.cfg.training_params.finetune)
    for k, v in ex.items():
        if k != "newest":  # learned from by the refit only, alongside every other window
            _check_split(scenario.name, k, v, scenario.task)
    spec.details = task_named(scenario.task).fit_details(spec.details, ex["train"].labels)
    return spec, ex


def cap_examples(ex: dict[str, Examples], p: FinetuneParams) -> dict[str, Examples]:
    """Each split at most its cap of examples (finetune.max_*_examples), drawn uniformly without replacement
    from (seed, split), in their original order; splits under their cap are returned as they are."""
    caps = {
        "train": p.max_train_examples,
        "val": p.max_validation_examples,
        "test": p.max_test_examples,
        "newest": p.max_validation_examples,
    }
    out = {}
    for i, (k, v) in enumerate(ex.items()):
        cap = caps.get(k, len(v))
        if len(v) <= cap:
            out[k] = v
            continue
        out[k] = v.subset(np.sort(np.random.default_rng([p.seed, 11, i]).choice(len(v), cap, replace=False)))
    return out


def data_regime(entities: int) -> str:
    """How much a network can learn here, said in the log and the report. Below SMALL_ENTITIES entities the
    foundation sees too few histories to beat trees on aggregates reliably (the tiny test data set: 60
    households, the network's validation AUROC below 0.5); the selection then falls back to LightGBM, a blend
    or a baseline on validation windows, and never publishes the network on faith."""
    if entities < SMALL_ENTITIES:
        return (
            f"small ({entities:,} entities, fewer than {SMALL_ENTITIES:,}): the network may not learn enough; "
            "LightGBM, a blend or a baseline is published when validation says so"
        )
    return f"standard ({entities:,} entities)"
