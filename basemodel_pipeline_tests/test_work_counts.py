"""Throughput counts the work done: examples, history events featurised, coverage of the data."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import load_config
from basemodel_pipeline.dates import DAY
from basemodel_pipeline.pipeline import run_cache, run_extract, run_finetune, run_pretrain
from basemodel_pipeline.training.work import WorkCounter
from basemodel_pipeline.workspace import cache_dir


@pytest.fixture(scope="module")
def built(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("work")
    shutil.copytree(tiny_dataset.parent / "data", d / "data")
    cfg = load_config(shutil.copy(tiny_dataset, d / "config.yaml"))
    run_extract(cfg)
    run_cache(cfg)
    return cfg, EventCache(cache_dir(cfg))


def _brute(cache: EventCache, e: np.ndarray, t: np.ndarray) -> tuple[int, int]:
    """(history events, events scanned) by reading each entity's timestamps directly."""
    history = scanned = 0
    latest: dict[int, int] = {}
    for ei, ti in zip(e.tolist(), t.tolist(), strict=True):
        for name in cache.sources:
            src = cache.source(name)
            ts = np.asarray(src.ts)[src.offsets[ei] : src.offsets[ei + 1]]
            history += int((ts < ti).sum())
        latest[ei] = max(latest.get(ei, ti), ti)
    for ei, ti in latest.items():
        for name in cache.sources:
            src = cache.source(name)
            scanned += int((np.asarray(src.ts)[src.offsets[ei] : src.offsets[ei + 1]] < ti).sum())
    return history, scanned


def test_counts_match_a_direct_count(built) -> None:
    _, cache = built
    rng = np.random.default_rng(0)
    ts = np.asarray(cache.source("transactions").ts)
    lo, hi = int(ts.min()) // DAY * DAY, int(ts.max()) // DAY * DAY
    counter = WorkCounter(cache, list(cache.sources))
    all_e, all_t = [], []
    for _ in range(3):  # three chunks, with repeated entities and a repeated (entity, day) pair
        e = rng.integers(0, cache.n_entities, 40)
        t = lo + rng.integers(0, (hi - lo) // DAY + 1, 40) * DAY
        e[1], t[1] = e[0], t[0]
        counter.add(e, t)
        all_e.append(e)
        all_t.append(t)
    history, _ = _brute(cache, np.concatenate(all_e), np.concatenate(all_t))
    scanned = sum(_brute(cache, a, b)[1] for a, b in zip(all_e, all_t, strict=True))
    s = counter.summary(2.0, lo, hi)
    assert s["examples"] == 120 and s["examples_per_s"] == 60.0
    assert s["history_events"] == history > 0 and s["history_events_per_s"] == history / 2
    assert s["events_scanned"] == scanned <= history
    pairs = {
        (int(a), int(b) // DAY) for a, b in zip(np.concatenate(all_e), np.concatenate(all_t), strict=True)
    }
    assert s["distinct_examples"] == len(pairs) < 120
    assert s["entities_covered"] == len({p[0] for p in pairs})
    # every (entity, day) pair of the range with an event before it, counted directly
    possible = 0
    for ei in range(cache.n_entities):
        first = min(
            (int(np.asarray(src.ts)[src.offsets[ei]]) for src in map(cache.source, cache.sources)
             if src.offsets[ei + 1] > src.offsets[ei]),
            default=None,
        )  # fmt: skip
        if first is not None:
            possible += sum(1 for day in range(lo, hi + 1, DAY) if first < day)
    assert s["possible_pairs"] == possible
    assert s["pairs_covered_fraction"] == round(len(pairs) / possible, 6)


def test_pretrain_and_finetune_report_the_work_done(built) -> None:
    cfg, cache = built
    pre = run_pretrain(cfg)
    assert "train_events_per_s" not in pre  # the data set's size over time is not a throughput
    assert pre["work.examples"] == pre["examples"] > 0
    assert pre["work.history_events"] >= pre["work.events_scanned"] > 0
    # the rate is per second of the stage's wall time, which the result rounds to 10 ms (a tiny foundation
    # trains in well under a second, so compare the times, not the rates)
    assert pre["examples"] / pre["train_examples_per_s"] == pytest.approx(
        pre["time_to_foundation_s"], abs=0.006
    )
    assert 0 < pre["work.entities_covered_fraction"] <= 1
    assert 0 < pre["work.pairs_covered_fraction"] <= 1
    assert pre["work.distinct_examples"] <= min(pre["examples"], pre["work.possible_pairs"])
    meta = run_finetune(cfg, "churn")
    assert meta["featurise_examples"] > 0 and meta["featurise_history_events"] > meta["featurise_examples"]
    assert meta["train_examples_per_s"] > 0


def test_finetune_caps_its_examples_and_says_how_many_there_were(built, tmp_path: Path) -> None:
    """Without a cap the features of every (entity, week) pair sit in memory: 11.6M churn examples (about
    50 GB in float16) on the 50M synthetic set. The cap samples each split and the metrics and report say so."""
    import json

    import yaml

    cfg, _ = built
    if not (Path(cfg.workspace) / "checkpoints" / "foundation" / "LATEST").exists():
        run_pretrain(cfg)
    raw = yaml.safe_load((Path(cfg.config_dir) / "config.yaml").read_text())
    raw.setdefault("training_params", {}).setdefault("finetune", {}).update(
        {"max_train_examples": 30, "max_validation_examples": 20, "max_test_examples": 20}
    )
    capped = Path(cfg.config_dir) / "config_capped.yaml"
    capped.write_text(yaml.safe_dump(raw, sort_keys=False))
    meta = run_finetune(load_config(capped), "churn")
    metrics = json.loads((Path(meta["path"]) / "metrics.json").read_text())
    ex = metrics["examples"]
    assert ex["train"] == 30 and ex["stop"] + ex["select"] == 20 and ex["test"] == 20
    assert ex["available"]["train"] > 30 and ex["available"]["val"] > 20 and ex["available"]["test"] > 20
    assert meta["featurise_examples"] <= 30 + 20 + 20
    assert "sampled from train" in (Path(meta["path"]) / "report.html").read_text()
    uncapped = json.loads((Path(run_finetune(cfg, "churn")["path"]) / "metrics.json").read_text())["examples"]
    assert uncapped["train"] == ex["available"]["train"]  # the default caps do not bind on small data


def _featurised(cfg, cache: EventCache, n: int):
    """The shared fine-tuning features of the first n entities three days before the data's end."""
    from basemodel_pipeline.progress import NullProgress
    from basemodel_pipeline.scenarios.shared import open_shared
    from basemodel_pipeline.targets.labels import Examples

    if not (Path(cfg.workspace) / "checkpoints" / "foundation" / "LATEST").exists():
        run_pretrain(cfg)
    shared = open_shared(cfg, NullProgress())
    e = np.arange(min(cache.n_entities, n), dtype=np.int64)
    t = np.full(len(e), int(np.asarray(cache.source(next(iter(cache.sources))).ts).max()) - 3 * DAY, np.int64)
    shared.featurise([Examples(e, t, None)])
    return shared


def _fp32(shared):
    """`shared` with finetune.precision fp32: its frozen trunk passes in fp32."""
    tp = shared.cfg.training_params
    tp = tp.model_copy(update={"finetune": tp.finetune.model_copy(update={"precision": "fp32"})})
    shared.cfg = shared.cfg.model_copy(update={"training_params": tp})
    return shared


def test_finetune_keeps_its_features_in_half_the_memory_of_float32(built) -> None:
    """The featurised examples are the largest allocation of fine-tuning (7.8 GB of float32 at the default caps
    on the 50M synthetic set): they are stored as float16, which they already were rounded to (the per-entity
    state stores float16), so nothing is lost and the models read float32 tensors."""
    import torch

    from basemodel_pipeline import runtime

    cfg, cache = built
    shared = _featurised(cfg, cache, 12)
    assert shared.X is not None and shared.X.dtype == np.float16
    assert shared.X.nbytes == len(shared.keys) * shared.enc.dim * 2
    full = shared.enc.history_t(cache, shared.keys[:, 0], shared.keys[:, 1], 1024, torch.device("cpu"))
    np.testing.assert_array_equal(shared.X.astype(np.float32), full.half().float().numpy())
    batch = runtime.take(shared.X, np.arange(3), torch.device("cpu"))
    assert batch.dtype == torch.float32  # the network's parameters are float32
    H = _fp32(shared).trunk_outputs(torch.device("cpu"))
    model = shared.new_model(1)
    expected = runtime.predict(model.trunk, full.half().float().numpy(), torch.device("cpu"), amp=None)
    np.testing.assert_array_equal(H, expected)


def test_a_frozen_trunk_reads_the_featurised_examples_once_for_outputs_and_embeddings(built) -> None:
    """The frozen trunk's outputs are the LayerNorm of its embeddings (the residual stream): one pass over the
    featurised examples gives both, the same numbers as two separate passes."""
    import torch

    from basemodel_pipeline import runtime
    from basemodel_pipeline.candidates.inputs import _Embed

    cfg, cache = built
    shared = _fp32(_featurised(cfg, cache, 40))  # the same numbers, compared exactly in fp32
    cpu = torch.device("cpu")
    rows_read = []
    hook = torch.nn.modules.module.register_module_forward_pre_hook(
        lambda module, args: (
            rows_read.append(len(args[0]))
            if args and getattr(args[0], "ndim", 0) == 2 and args[0].shape[1] == shared.enc.dim
            else None
        )
    )
    try:
        H, E = shared.trunk_outputs(cpu), shared.embeddings(cpu)
    finally:
        hook.remove()
    assert sum(rows_read) == len(shared.keys)  # the featurised examples went through a module once
    model = shared.new_model(1)
    X = shared.X.astype(np.float32)
    np.testing.assert_allclose(H, runtime.predict(model.trunk, X, cpu), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(E, runtime.predict(_Embed(model), X, cpu))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_frozen_trunks_pass_runs_in_the_finetune_precision(built, precision: str) -> None:
    """finetune.precision sets the matmul precision of the frozen trunk's pass (the outputs the head learns
    from): fp32 gives the fp32 pass, bf16 the bf16 autocast pass, which differs from fp32 by bf16's rounding."""
    import torch

    from basemodel_pipeline import runtime
    from basemodel_pipeline.candidates.inputs import _Embed

    cfg, cache = built
    tp = cfg.training_params
    tp = tp.model_copy(update={"finetune": tp.finetune.model_copy(update={"precision": precision})})
    shared = _featurised(cfg.model_copy(update={"training_params": tp}), cache, 40)
    cpu = torch.device("cpu")
    E = shared.embeddings(cpu)
    model, X = shared.new_model(1), shared.X  # float16, as fine-tuning keeps it
    fp32, bf16 = (runtime.predict(_Embed(model), X, cpu, amp=a) for a in (None, torch.bfloat16))
    np.testing.assert_array_equal(E, fp32 if precision == "fp32" else bf16)
    assert not np.array_equal(fp32, bf16)
    assert np.abs(bf16 - fp32).mean() < 0.05 * np.abs(fp32).mean()  # rounding, not another computation


def test_the_frozen_trunks_pass_is_bf16_by_default_where_the_hardware_runs_it_natively(built) -> None:
    """auto: the frozen pass in bf16 where the device runs bf16 natively, the precision `predict` serves the
    model in there (inference/precision.py), so the head learns the trunk outputs it is served."""
    import torch

    from basemodel_pipeline import runtime
    from basemodel_pipeline.config.params import FinetuneParams
    from basemodel_pipeline.inference.precision import choose

    cfg, cache = built
    assert FinetuneParams().precision == "auto"
    tp = cfg.training_params
    tp = tp.model_copy(update={"finetune": tp.finetune.model_copy(update={"precision": "auto"})})
    shared = _featurised(cfg.model_copy(update={"training_params": tp}), cache, 4)
    cpu = torch.device("cpu")
    assert (shared.trunk_amp(cpu) == torch.bfloat16) == runtime.native_bf16(cpu)
    assert (shared.trunk_amp(cpu) == torch.bfloat16) == (choose("auto", cpu) == "bf16")


def test_a_frozen_trunks_head_trains_on_one_cpu_thread(built, monkeypatch: pytest.MonkeyPatch) -> None:
    """A linear head on the frozen trunk's outputs is made of tiny operations: split over several CPU threads
    they spend their time waiting for each other (8-15 ms per step instead of 1.4 on a loaded 2-core machine),
    so the head's steps run on one thread; the threads the rest of the stage uses are restored after."""
    import torch

    cfg, cache = built
    if not (Path(cfg.workspace) / "checkpoints" / "foundation" / "LATEST").exists():
        run_pretrain(cfg)
    monkeypatch.setenv("BASEMODEL_TORCH_THREADS", "2")
    threads_in_training = set()
    hook = torch.nn.modules.module.register_module_forward_pre_hook(
        lambda module, args: (
            threads_in_training.add(torch.get_num_threads())
            if isinstance(module, torch.nn.Linear) and module.training and torch.is_grad_enabled()
            else None
        )
    )
    try:
        run_finetune(cfg, "churn")
    finally:
        hook.remove()
    assert threads_in_training == {1}
    assert torch.get_num_threads() == 2


def test_a_frozen_trunks_lightgbm_candidates_fit_while_its_head_trains(built) -> None:
    """With a frozen trunk no candidate but the network reads the trained head: the LightGBM candidates fit
    on a second thread while the head trains on one (the two CPUs both busy), with the same results."""
    import threading

    from basemodel_pipeline.cache.windows import resolve_windows
    from basemodel_pipeline.scenarios.finetune import finetune_many

    cfg, cache = built
    if not (Path(cfg.workspace) / "checkpoints" / "foundation" / "LATEST").exists():
        run_pretrain(cfg)
    events: list[tuple[str, str]] = []

    class Recorder:
        def start(self, task: str, total: int | None) -> None:
            events.append(("start", task))

        def advance(self, task: str, amount: int = 1, **metrics: float) -> None:
            events.append(("step", threading.current_thread().name))

        def log(self, message: str) -> None:
            events.append((message, threading.current_thread().name))

    rcfg = resolve_windows(cfg)
    finetune_many(rcfg, [rcfg.scenario("churn")], Recorder())
    steps = [i for i, (what, _) in enumerate(events) if what == "step"]
    fitting = [i for i, (what, _) in enumerate(events) if "fitting candidate lightgbm" in what]
    assert steps and fitting
    assert min(fitting) < max(steps)  # a LightGBM candidate started before the head's last step
    assert {events[i][1] for i in fitting} != {threading.main_thread().name}


def test_a_frozen_trunks_refit_boosters_refit_while_its_head_trains_again(
    built, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The production refit of a published blend on a frozen trunk: its boosters read no head, so they refit
    on a second thread while the head trains again on one (the two CPUs both busy)."""
    import threading
    import time

    from basemodel_pipeline.cache.windows import resolve_windows
    from basemodel_pipeline.candidates.lightgbm import LightGBM
    from basemodel_pipeline.scenarios.finetune import finetune_many

    cfg, cache = built
    if not (Path(cfg.workspace) / "checkpoints" / "foundation" / "LATEST").exists():
        run_pretrain(cfg)
    refits: list[tuple[str, float]] = []
    steps: list[float] = []
    original = LightGBM.refit

    def recorded(self, rows) -> None:
        refits.append((threading.current_thread().name, time.perf_counter()))
        original(self, rows)

    monkeypatch.setattr(LightGBM, "refit", recorded)

    class Recorder:
        refitting = False

        def start(self, task: str, total: int | None) -> None:
            pass

        def advance(self, task: str, amount: int = 1, **metrics: float) -> None:
            if self.refitting:
                steps.append(time.perf_counter())

        def log(self, message: str) -> None:
            self.refitting = self.refitting or "refitting the network" in message

    rcfg = resolve_windows(cfg)
    churn = rcfg.scenario("churn").model_copy(update={"publish": "blend"})
    finetune_many(rcfg.model_copy(update={"scenarios": [churn]}), [churn], Recorder())
    assert refits and steps
    assert {name for name, _ in refits} == {"candidates"}
    assert min(at for _, at in refits) < max(steps)  # a booster refit started before the head's last step
