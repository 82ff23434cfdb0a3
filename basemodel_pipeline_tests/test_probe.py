"""The fixed embedding probe learns a planted signal and picks its best epoch on validation."""

from __future__ import annotations

import numpy as np

from basemodel_pipeline.evaluation.metrics import auroc, macro_auroc
from basemodel_pipeline.training.probe import probe_scores


def _data(n: int, rng: np.random.Generator, classes: int = 1) -> tuple[np.ndarray, np.ndarray]:
    X = rng.normal(size=(n, 16)).astype(np.float32)
    logits = X[:, :classes] * 2.0 + 0.5 * X[:, 5:6]
    Y = (rng.random(logits.shape) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    return X, Y[:, 0] if classes == 1 else Y


def test_probe_learns_binary_signal() -> None:
    rng = np.random.default_rng(0)
    (Xtr, ytr), (Xv, yv), (Xte, yte) = (_data(n, rng) for n in (4000, 1000, 1000))
    scores = probe_scores(Xtr, ytr, Xv, yv, Xte, auroc)
    assert scores.shape == (1000,)
    assert auroc(yte, scores) > 0.8
    assert 0.45 < auroc(yte, rng.random(1000)) < 0.55  # the bar is meaningful


def test_probe_multilabel_shapes_and_signal() -> None:
    rng = np.random.default_rng(1)
    (Xtr, Ytr), (Xv, Yv), (Xte, Yte) = (_data(n, rng, classes=3) for n in (4000, 1000, 1000))
    scores = probe_scores(Xtr, Ytr, Xv, Yv, Xte, macro_auroc)
    assert scores.shape == (1000, 3)
    assert macro_auroc(Yte, scores) > 0.8


def test_foundation_embed_shape_dtype_and_determinism(tmp_path) -> None:
    """model.embed is what `basemodel embed` exports: [B, D] float32 before the float16 cast, the same for the
    same input (dropout off in eval), row-independent (batching does not change a row) and unchanged by a
    checkpoint round trip."""
    import torch

    from basemodel_pipeline.model.checkpoint import (
        CheckpointMeta,
        build_model,
        load_checkpoint,
        save_checkpoint,
        write_manifest,
    )

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
        save_checkpoint(tmp_path / "ckpt", model, CheckpointMeta(kind="foundation", arch=arch))
        write_manifest(tmp_path / "ckpt")  # as publish_checkpoint does: nothing loads unverified
        loaded, _ = load_checkpoint(tmp_path / "ckpt")
        assert torch.equal(loaded.embed(x), emb)


def test_input_dropout_acts_only_in_training_and_is_not_saved(tmp_path) -> None:
    """Input dropout sets standardised inputs to their mean while training: a training forward pass differs
    from the eval one, eval is unchanged by it, and a reloaded checkpoint has none (fine-tuning and inference
    never drop inputs)."""
    import torch

    from basemodel_pipeline.model.checkpoint import (
        CheckpointMeta,
        build_model,
        load_checkpoint,
        save_checkpoint,
        write_manifest,
    )

    arch = {"in_dim": 40, "hidden_dim": 16, "num_blocks": 1, "dropout": 0.0, "out_dim": 3}
    torch.manual_seed(0)
    model = build_model(arch)
    x = torch.randn(256, 40)
    model.train()
    reference = model(x)
    model.trunk.input_dropout = 0.5
    dropped = model(x)
    assert not torch.allclose(dropped, reference)
    # a dropped input equals an input at its mean: with all inputs at the mean, dropout changes nothing
    at_mean = model.trunk.mean.expand(8, 40)
    torch.testing.assert_close(model(at_mean), model(at_mean))
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference)
    save_checkpoint(tmp_path / "ckpt", model, CheckpointMeta(kind="foundation", arch=arch))
    write_manifest(tmp_path / "ckpt")
    loaded, _ = load_checkpoint(tmp_path / "ckpt")
    assert loaded.trunk.input_dropout == 0.0


def test_cross_fitted_scores_learn_signal_but_not_entities() -> None:
    """Out of fold: a planted signal is learned, while labels that are pure per-entity noise (learnable only
    by memorising the entity's own row) score at chance."""
    from basemodel_pipeline.training.probe import cross_fitted_scores

    rng = np.random.default_rng(2)
    X, y = _data(3000, rng)
    entity = np.arange(3000)
    scores = cross_fitted_scores(X, y, entity, auroc, folds=5)
    assert scores.shape == (3000,) and auroc(y, scores) > 0.8
    ident = rng.normal(size=(3000, 64)).astype(np.float32)  # a unique random code per entity
    noise = rng.integers(0, 2, 3000).astype(np.float32)
    assert 0.44 < auroc(noise, cross_fitted_scores(ident, noise, entity, auroc, folds=5)) < 0.56
