"""The fixed embedding probe learns a planted signal and picks its best epoch on validation."""

from __future__ import annotations

import numpy as np

from basemodel_pipeline.evaluation.metrics import auroc, macro_auroc
from basemodel_pipeline.evaluation.probe import probe_scores


def _data(n: int, rng: np.random.Generator, classes: int = 1) -> tuple[np.ndarray, np.ndarray]:
    X = rng.normal(size=(n, 16)).astype(np.float32)
    logits = X[:, :classes] * 2.0 + 0.5 * X[:, 5:6]
    Y = (rng.random(logits.shape) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    return X, Y[:, 0] if classes == 1 else Y


def test_probe_learns_binary_signal() -> None:
    rng = np.random.default_rng(0)
    (Xtr, ytr), (Xv, yv), (Xte, yte) = (_data(n, rng) for n in (4000, 1000, 1000))
    scores = probe_scores(Xtr, ytr, Xv, yv, Xte, "binary")
    assert scores.shape == (1000,)
    assert auroc(yte, scores) > 0.8
    assert 0.45 < auroc(yte, rng.random(1000)) < 0.55  # the bar is meaningful


def test_probe_multilabel_shapes_and_signal() -> None:
    rng = np.random.default_rng(1)
    (Xtr, Ytr), (Xv, Yv), (Xte, Yte) = (_data(n, rng, classes=3) for n in (4000, 1000, 1000))
    scores = probe_scores(Xtr, Ytr, Xv, Yv, Xte, "multilabel")
    assert scores.shape == (1000, 3)
    assert macro_auroc(Yte, scores) > 0.8


def test_foundation_embed_shape_dtype_and_determinism(tmp_path) -> None:
    """model.embed is what `basemodel embed` exports: [B, D] float32 before the float16 cast, the same for the
    same input (dropout off in eval), row-independent (batching does not change a row) and unchanged by a
    checkpoint round trip."""
    import torch

    from basemodel_pipeline.model.checkpoint import build_model, load_checkpoint, save_checkpoint

    arch = {"in_dim": 12, "hidden_dim": 32, "num_blocks": 2, "dropout": 0.5, "out_dim": 7}
    torch.manual_seed(0)
    model = build_model(arch).eval()
    x = torch.randn(64, 12)
    with torch.no_grad():
        emb = model.embed(x)
        assert emb.shape == (64, 32) and emb.dtype == torch.float32
        assert torch.equal(emb, model.embed(x))
        torch.testing.assert_close(model.embed(x[:5]), emb[:5])
        # the embedding is the residual stream the scenario heads read after the trunk's final LayerNorm
        torch.testing.assert_close(model.trunk.norm(emb), model.trunk(x))
        half = emb.numpy().astype(np.float16)
        assert half.dtype == np.float16 and np.isfinite(half).all()
        save_checkpoint(tmp_path / "ckpt", model, {"arch": arch})
        loaded, _ = load_checkpoint(tmp_path / "ckpt")
        assert torch.equal(loaded.embed(x), emb)
