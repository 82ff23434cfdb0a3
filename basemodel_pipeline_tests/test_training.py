"""Pretraining, fine-tuning and prediction on the tiny dataset: real models, real checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from safetensors.torch import load_file

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import ConfigError
from basemodel_pipeline.pipeline import run_cache, run_extract, run_finetune, run_predict, run_pretrain


@pytest.fixture(scope="module")
def trained(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory):
    import shutil

    d = tmp_path_factory.mktemp("train")
    shutil.copytree(tiny_dataset.parent / "data", d / "data")
    cfg = load_config(shutil.copy(tiny_dataset, d / "config.yaml"))
    run_extract(cfg)
    run_cache(cfg)
    return cfg, run_pretrain(cfg)


def test_foundation_checkpoint_is_safetensors_plus_json(trained) -> None:
    cfg, meta = trained
    path = Path(meta["path"])
    assert ws.latest_foundation_dir(cfg) == path
    weights = load_file(str(path / "model.safetensors"))
    info = json.loads((path / "model.json").read_text())
    assert weights["trunk.proj.weight"].shape == (info["arch"]["hidden_dim"], info["arch"]["in_dim"])
    assert np.isfinite(meta["val_loss"]) and meta["epochs"] >= 1
    assert len(info["history"]) == meta["epochs"]
    assert info["input_dropout"] == cfg.training_params.foundation.input_dropout  # how the trunk was trained
    assert not list(path.parent.glob(".*.tmp"))


@pytest.mark.parametrize("scenario", ["churn", "department_propensity"])
def test_finetune_evaluates_model_and_baselines(trained, scenario: str) -> None:
    cfg, _ = trained
    meta = run_finetune(cfg, scenario)
    metrics = json.loads((Path(meta["path"]) / "metrics.json").read_text())
    assert metrics["metric"] == ("auroc" if scenario == "churn" else "macro_auroc")
    for name in ("model", "lightgbm_aggregates", "popularity"):
        assert 0.0 <= metrics["test"][name] <= 1.0
    assert metrics["examples"]["train"] > 0 and metrics["examples"]["test"] > 0
    # tested on training_end_date and the weekly split points after it whose windows fit the tiny data set
    points = metrics["test_split_points"]
    assert points[0] == str(cfg.data_params.test_date) and len(points) == (1 if scenario == "churn" else 3)
    info = json.loads((Path(meta["path"]) / "model.json").read_text())
    assert info["foundation_version"] == trained[1]["version"]
    if scenario == "department_propensity":
        assert len(info["target"]["classes"]) == meta["classes"] >= 2


def test_predictions_cover_every_entity(trained) -> None:
    cfg, _ = trained
    run_finetune(cfg, "churn")
    meta = run_predict(cfg, "churn")
    table = pq.read_table(meta["path"])
    assert table.num_rows == meta["entities"] > 0
    scores = table.column("score").to_numpy()
    assert ((scores >= 0) & (scores <= 1)).all() and scores.std() > 0
    assert len(set(table.column("entity_id").to_pylist())) == table.num_rows


def test_horizon_longer_than_training_window_names_the_field(trained) -> None:
    cfg, _ = trained
    tp = cfg.training_params
    foundation = tp.foundation.model_copy(update={"horizon_days": 400})
    bad = cfg.model_copy(update={"training_params": tp.model_copy(update={"foundation": foundation})})
    with pytest.raises(ConfigError, match=r"training_params.foundation.horizon_days"):
        run_pretrain(bad)


def test_frozen_mode_keeps_the_foundation_trunk_and_full_mode_changes_it(trained) -> None:
    cfg, pre = trained
    foundation = load_file(str(Path(pre["path"]) / "model.safetensors"))
    for mode in ("frozen", "full"):
        tp = cfg.training_params
        ft = tp.finetune.model_copy(update={"mode": mode})
        run = cfg.model_copy(update={"training_params": tp.model_copy(update={"finetune": ft})})
        meta = run_finetune(run, "churn")
        weights = load_file(str(Path(meta["path"]) / "model.safetensors"))
        same = all(bool((weights[k] == v).all()) for k, v in foundation.items() if k.startswith("trunk."))
        assert same == (mode == "frozen")


def test_embeddings_export_float16_in_recsys_layout(trained) -> None:
    from basemodel_pipeline.inference.options import EmbedOptions
    from basemodel_pipeline.pipeline import run_embed

    cfg, pre = trained
    meta = run_embed(cfg)
    out = Path(meta["path"])
    ids = np.load(out / "client_ids.npy", allow_pickle=False)
    emb = np.load(out / "embeddings.npy")
    assert emb.dtype == np.float16 and emb.shape == (len(ids), meta["dim"])
    assert np.isfinite(emb.astype(np.float32)).all() and emb.std() > 0
    table = pq.read_table(out / "embeddings.parquet")
    assert table.column("entity_id").to_pylist() == ids.tolist()
    np.testing.assert_array_equal(
        np.stack(table.column("embedding").to_numpy(zero_copy_only=False)), emb.astype(np.float32)
    )
    assert meta["foundation_version"] == pre["version"]
    # as of the latest date the features come from the per-entity state; a replay from the history agrees
    state = np.load(Path(run_embed(cfg, EmbedOptions(precision="fp32"))["path"]) / "embeddings.npy")
    state = state.astype(np.float32)
    replay = run_embed(cfg, EmbedOptions(precision="fp32", replay=True))
    assert replay["precision"] == "fp32"
    again = np.load(Path(replay["path"]) / "embeddings.npy").astype(np.float32)
    np.testing.assert_allclose(state, again, atol=0.05)


def test_activity_targets_match_a_direct_count(trained) -> None:
    import torch

    from basemodel_pipeline.cache.store import EventCache
    from basemodel_pipeline.dates import DAY
    from basemodel_pipeline.training.pretrain import ACTIVITY_DAYS, activity_targets, fit_encoder
    from basemodel_pipeline.workspace import cache_dir

    cfg, _ = trained
    cache = EventCache(cache_dir(cfg))
    enc = fit_encoder(cache, cfg)
    src = cache.source("transactions")
    rng = np.random.default_rng(3)
    e = np.sort(rng.integers(0, cache.n_entities, 40))
    t = int(src.ts.min()) + rng.integers(0, 90, 40) * DAY
    curve = (1, 3, 7, 14, 21)  # next_event_days: more points of the time-to-next-event curve
    for days in (ACTIVITY_DAYS, curve):
        got = activity_targets(enc, cache, torch.from_numpy(e), torch.from_numpy(t), 28 * DAY, days).numpy()
        assert got.shape == (40, len(days) + 1)
        for q in range(40):
            ts = np.asarray(src.ts[src.offsets[e[q]] : src.offsets[e[q] + 1]])
            future = ts[(ts >= t[q]) & (ts < t[q] + 28 * DAY)]
            want = [float(np.any((ts >= t[q]) & (ts < t[q] + d * DAY))) for d in days]
            want.append(np.log1p(len(np.unique(future // DAY))))
            np.testing.assert_allclose(got[q], want, rtol=1e-6)


def test_next_event_days_add_points_shorter_than_the_horizon() -> None:
    from basemodel_pipeline.config.params import FoundationParams
    from basemodel_pipeline.training.pretrain import ACTIVITY_DAYS, activity_days

    assert activity_days(FoundationParams()) == ACTIVITY_DAYS
    p = FoundationParams(next_event_days=[3, 1, 7, 28, 60], horizon_days=28)
    assert activity_days(p) == (1, 3, 7, 14)  # 7 once; 28 and 60 are not inside the horizon
    with pytest.raises(ValueError, match="next_event_days"):
        FoundationParams(next_event_days=[0])


@pytest.mark.parametrize(
    ("setting", "field", "message"),
    [
        ("hidden_dim: 0", "training_params.foundation.hidden_dim", "greater than 0"),
        ("batch_size: -8", "training_params.foundation.batch_size", "greater than 0"),
        ("max_examples_per_epoch: 0", "training_params.foundation.max_examples_per_epoch", "greater than 0"),
        ("sketch_width: 12", "training_params.foundation", "power of two"),
    ],
)
def test_bad_training_sizes_name_the_field(
    tiny_dataset: Path, setting: str, field: str, message: str
) -> None:
    import yaml

    from basemodel_pipeline.config import parse_config

    raw = yaml.safe_load(tiny_dataset.read_text())
    raw["training_params"]["foundation"].update(yaml.safe_load(setting))
    with pytest.raises(ConfigError) as err:
        parse_config(yaml.safe_dump(raw), tiny_dataset)
    assert field in str(err.value) and message in str(err.value)


def test_finetune_many_scenarios_in_one_pass(trained) -> None:
    from basemodel_pipeline.pipeline import run_finetune_many

    cfg, _ = trained
    names = [s.name for s in cfg.scenarios]
    assert len(names) >= 2
    out = run_finetune_many(cfg, names)
    assert set(out) == set(names)
    for name in names:
        assert Path(out[name]["path"]).is_dir() and np.isfinite(out[name]["test_model"])


def test_training_sizes_do_not_follow_the_memory_free_at_the_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The featurisation chunk groups the epoch's entities and sets the schedule's length, so it shapes the
    trained model: it comes from the machine's memory, not from what other processes leave free at the moment
    (the same seed gave different foundations run to run). Free memory too short for it lowers it with a line
    saying so."""
    from types import SimpleNamespace

    import torch

    from basemodel_pipeline.config.params import FoundationParams
    from basemodel_pipeline.training import calibrate as cal

    gib = 2**30
    p = FoundationParams()
    sizes = []
    for available in (20 * gib, 14 * gib, 9 * gib):
        monkeypatch.setattr(
            cal.psutil, "virtual_memory", lambda a=available: SimpleNamespace(total=24 * gib, available=a)
        )
        sizes.append(cal.calibrate(p, 25_000, 2160, 600, torch.device("cpu")))
    assert len({s.chunk_examples for s in sizes}) == 1
    lines: list[str] = []
    monkeypatch.setattr(
        cal.psutil, "virtual_memory", lambda: SimpleNamespace(total=24 * gib, available=gib // 4)
    )
    short = cal.calibrate(p, 25_000, 2160, 600, torch.device("cpu"), log=lines.append)
    assert short.chunk_examples < sizes[0].chunk_examples
    assert len(lines) == 1 and "chunk" in lines[0] and "free" in lines[0]


def test_a_frozen_trunks_head_takes_larger_batches_on_many_examples_and_small_data_keeps_256() -> None:
    """finetune.batch_size auto: 256, doubled for a head on a frozen trunk up to 2048 while an epoch keeps
    at least 128 steps; a trained trunk (full, lora) keeps 256; a number is taken as it is."""
    from basemodel_pipeline.config.params import FinetuneParams
    from basemodel_pipeline.scenarios.network import head_batch_size

    assert FinetuneParams().batch_size == "auto"
    assert head_batch_size("auto", "frozen", 20_000) == 256  # 78 steps: small data keeps small batches
    assert head_batch_size("auto", "frozen", 65_535) == 256  # 512 would leave 127 steps
    assert head_batch_size("auto", "frozen", 65_536) == 512  # 128 steps
    assert head_batch_size("auto", "frozen", 131_072) == 1024
    assert head_batch_size("auto", "frozen", 400_000) == 2048
    assert head_batch_size("auto", "frozen", 10**8) == 2048
    assert head_batch_size("auto", "full", 10**6) == head_batch_size("auto", "lora", 10**6) == 256
    assert head_batch_size(64, "frozen", 10**6) == 64
    with pytest.raises(ValueError):
        FinetuneParams(batch_size=0)


@pytest.mark.parametrize("features", ["float32", "float16"])
def test_the_trunk_in_bf16_stays_within_bf16_rounding_of_fp32_on_features_far_from_zero(
    features: str,
) -> None:
    """Features whose mean is far from zero against their spread (a count that is never zero): folded into
    the projection, the standardisation becomes (W / s) x minus a bias of the same size, a cancellation bf16
    cannot hold. Under bf16 autocast (pretraining's validation, the frozen fine-tuning pass, `predict`) the
    trunk centres the features before rounding them to bf16 (half-precision ones in half precision), so its
    outputs stay within bf16's rounding of the fp32 ones."""
    import torch

    from basemodel_pipeline.model.trunk import Trunk

    torch.manual_seed(0)
    trunk = Trunk(64, 32, 2, 0.0).eval()
    x = (10.0 + 0.01 * torch.randn(512, 64)).to(getattr(torch, features))
    trunk.set_stats(x.float().mean(0), x.float().std(0))
    with torch.no_grad():
        fp32 = trunk.residual(x.float())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = trunk.residual(x).float()
    assert ((bf16 - fp32).abs().mean() / fp32.abs().mean()).item() < 0.02


def test_torchs_compiler_stack_is_imported_beside_the_caller() -> None:
    """The first optimizer imports torch._dynamo (about a second of Python): fine-tuning has it imported on
    a second thread while it featurises. In a fresh interpreter the module is not loaded before and is
    loaded once the thread ends."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from basemodel_pipeline import runtime\n"
        "assert 'torch._dynamo' not in sys.modules\n"
        "thread = runtime.import_beside()\n"
        "assert thread.name == 'imports' and thread.daemon\n"
        "thread.join(); assert 'torch._dynamo' in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
