"""bench/bench_peers.py: the peers are compared on the same test rows, and CoLES's state "as of a split time"
is the encoding of the history before it.

The CoLES test needs pytorch-lifestream (``make peers-venv``); the project's .venv skips it. To run it:
``PYTHONPATH=. .venv-peers/bin/python -m pytest --noconftest -o addopts= -o filterwarnings= basemodel_pipeline_tests/test_bench_peers.py``
(no Dagster there, so neither the conftest nor the project's pytest options).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_peers  # noqa: E402


def _part(workspace: Path, part: str, entity: np.ndarray, truth: np.ndarray, out: dict) -> None:
    arrays = {
        "churn/task": np.array("binary"),
        "churn/entity": entity,
        "churn/time": np.full(len(entity), 100),
        "churn/truth": truth,
        **{f"churn/out/{k}": v for k, v in out.items()},
    }
    info = {
        "train_s": 1.0,
        "score_s": 1.0,
        "churn.score_entities": 4,
        "churn.score_s": 1.0,
        "peak_rss_mb": 1.0,
        "peak_anon_mb": 1.0,
        "wall_s": 1.0,
        "loadavg_before": [0, 0, 0],
        "loadavg_after": [0, 0, 0],
        "times": {},
    }
    bench_peers.save_part(workspace / "peers" / part, arrays, info)


def test_collect_compares_only_the_same_test_rows(tmp_path: Path) -> None:
    truth = np.array([0, 1, 0, 1, 1, 0, 1, 0])
    good = np.array([0.1, 0.9, 0.2, 0.8, 0.7, 0.3, 0.6, 0.4])
    _part(tmp_path, "lgbm", np.arange(8), truth, {"lgbm": good})
    _part(tmp_path, "coles", np.arange(8), truth, {"coles_probe": 1 - good, "coles_lgbm": good})
    flat = bench_peers.collect(tmp_path, ["churn"], ["lgbm", "coles"])
    assert flat["churn.lgbm"] == 1.0 and flat["churn.coles_probe"] == 0.0
    assert flat["churn.metric"] == "auroc"  # the scenario's task, saved with its rows, says how to score it
    lo, hi = flat["churn.lgbm_ci95"]
    assert lo <= 1.0 <= hi
    # a peer scored on other households (or the same ones in another order) is refused, not compared
    _part(tmp_path, "coles", np.arange(8)[::-1], truth, {"coles_probe": good, "coles_lgbm": good})
    with pytest.raises(SystemExit, match="not the same rows"):
        bench_peers.collect(tmp_path, ["churn"], ["lgbm", "coles"])
    info = json.loads((tmp_path / "peers" / "lgbm.json").read_text())
    assert info["churn.score_entities"] == 4


def test_coles_state_is_the_encoding_of_the_history_before_the_split() -> None:
    """coles_states reads each example's state off one GRU pass over the household's events; it must equal
    ptls encoding just the events before the split time (the prefix), and the starter state without any."""
    pytest.importorskip("ptls", reason="pytorch-lifestream lives in .venv-peers (make peers-venv)")
    from ptls.data_load.utils import collate_feature_dict
    from ptls.nn import RnnSeqEncoder, TrxEncoder

    torch.manual_seed(0)
    enc = RnnSeqEncoder(
        trx_encoder=TrxEncoder(
            embeddings={"department": {"in": 6, "out": 3}}, numeric_values={"sales_value": "log"}
        ),
        hidden_size=bench_peers.COLES_HIDDEN,
        type="gru",
    ).eval()
    rng = np.random.default_rng(0)
    records, take = [], []
    for n in (7, 1, 0, 12):
        records.append(
            {
                "event_time": torch.arange(n, dtype=torch.float32),
                "department": torch.from_numpy(rng.integers(1, 6, n)),
                "sales_value": torch.from_numpy(rng.random(n).astype(np.float32) * 10),
            }
        )
        take.append(np.array(sorted({0, n, n // 2, max(n - 1, 0)})))
    states = bench_peers.coles_states(enc, records, take)
    assert enc.is_reduce_sequence  # restored
    starter = torch.tanh(enc.seq_encoder.starter_h[0, 0]).detach().numpy()
    with torch.no_grad():
        for rec, ks, got in zip(records, take, states, strict=True):
            assert got.shape == (len(ks), bench_peers.COLES_HIDDEN)
            for k, row in zip(ks, got, strict=True):
                if k == 0:
                    np.testing.assert_allclose(row, starter, atol=1e-6)
                    continue
                prefix = collate_feature_dict([{c: v[:k] for c, v in rec.items()}])
                np.testing.assert_allclose(row, enc(prefix)[0].numpy(), atol=1e-5)
