"""The fixed embedding probe learns a planted signal and picks its best epoch on validation."""

from __future__ import annotations

import numpy as np

from basemodel_pipeline.evaluation.metrics import auroc, macro_auroc
from basemodel_pipeline.evaluation.probe import paired_bootstrap, probe_scores


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


def test_entity_folds_keep_an_entity_together_and_are_balanced() -> None:
    from basemodel_pipeline.evaluation.probe import entity_folds

    entity = np.repeat(np.arange(5000), 3)
    fold = entity_folds(entity, 5)
    assert (fold.reshape(-1, 3) == fold.reshape(-1, 3)[:, :1]).all()  # every row of an entity in one fold
    assert np.array_equal(entity_folds(entity[::-1], 5), fold[::-1])  # fixed by the entity, not the row order
    counts = np.bincount(fold, minlength=5)
    assert counts.min() > 0.9 * counts.mean()


def test_cross_fitted_scores_learn_signal_but_not_entities() -> None:
    """Out of fold: a planted signal is learned, while labels that are pure per-entity noise (learnable only
    by memorising the entity's own row) score at chance."""
    from basemodel_pipeline.evaluation.probe import cross_fitted_scores

    rng = np.random.default_rng(2)
    X, y = _data(3000, rng)
    entity = np.arange(3000)
    scores = cross_fitted_scores(X, y, entity, auroc, folds=5)
    assert scores.shape == (3000,) and auroc(y, scores) > 0.8
    ident = rng.normal(size=(3000, 64)).astype(np.float32)  # a unique random code per entity
    noise = rng.integers(0, 2, 3000).astype(np.float32)
    assert 0.44 < auroc(noise, cross_fitted_scores(ident, noise, entity, auroc, folds=5)) < 0.56


def test_paired_bootstrap_interval() -> None:
    from basemodel_pipeline.evaluation.probe import paired_bootstrap

    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 2000).astype(np.float32)
    weak = rng.random(2000)
    strong = y + rng.normal(0, 0.8, 2000)
    diff, lo, hi = paired_bootstrap(auroc, y, strong, weak, rounds=200)
    assert diff > 0.2 and 0 < lo < diff < hi
    assert paired_bootstrap(auroc, y, weak, weak, rounds=50) == (0.0, 0.0, 0.0)
    diff, lo, hi = paired_bootstrap(auroc, y, weak, rng.random(2000), rounds=200)
    assert lo < 0 < hi  # two random scorers: the interval covers zero


def test_fold_metric_ignores_calibration_differences_between_folds() -> None:
    """Out-of-fold scores of probes with different calibrations: pooling them into one AUROC penalises the
    offsets; the mean of per-fold AUROCs is what each fold's probe ranks."""
    from basemodel_pipeline.evaluation.probe import fold_metric

    rng = np.random.default_rng(4)
    fold = np.repeat(np.arange(5), 400)
    y = rng.integers(0, 2, 2000).astype(np.float32)
    scores = y + rng.normal(0, 1.0, 2000)
    shifted = scores + 3.0 * fold  # each fold's probe outputs on its own scale
    per_fold = [auroc(y[fold == f], scores[fold == f]) for f in range(5)]
    assert fold_metric(auroc, y, shifted, fold) == np.mean(per_fold)
    assert fold_metric(auroc, y, shifted) < fold_metric(auroc, y, shifted, fold) - 0.1  # pooled
    assert fold_metric(auroc, y, scores) == auroc(y, scores)


def test_paired_bootstrap_by_fold() -> None:
    from basemodel_pipeline.evaluation.probe import fold_metric, paired_bootstrap

    rng = np.random.default_rng(5)
    fold = np.repeat(np.arange(5), 400)
    y = rng.integers(0, 2, 2000).astype(np.float32)
    strong = y + rng.normal(0, 0.8, 2000) + 5.0 * fold
    weak = rng.random(2000)
    diff, lo, hi = paired_bootstrap(auroc, y, strong, weak, rounds=100, groups=fold)
    assert diff == fold_metric(auroc, y, strong, fold) - fold_metric(auroc, y, weak, fold)
    assert 0.2 < lo < diff < hi
    diff, lo, hi = paired_bootstrap(auroc, y, weak, rng.random(2000), rounds=100, groups=fold)
    assert lo < 0 < hi


def test_paired_bootstrap_resamples_entities_not_rows() -> None:
    """Several windows of one entity are not independent evidence: 250 entities with 8 near-identical rows
    each carry about as much information as 250 rows. A row bootstrap reads them as 2,000 and calls a noise
    gap significant; resampling entities (`clusters`) gives the interval of 250."""
    from basemodel_pipeline.evaluation.probe import paired_bootstrap

    rng = np.random.default_rng(6)
    entity = np.repeat(np.arange(250), 8)
    y = rng.integers(0, 2, 250).astype(np.float32)[entity]
    a = (y + rng.normal(0, 1.0, 250)[entity]) + rng.normal(0, 0.01, 2000)
    b = (y + rng.normal(0, 1.0, 250)[entity]) + rng.normal(0, 0.01, 2000)
    _, lo_rows, hi_rows = paired_bootstrap(auroc, y, a, b, rounds=200)
    d, lo, hi = paired_bootstrap(auroc, y, a, b, rounds=200, clusters=entity)
    assert hi - lo > 2.0 * (hi_rows - lo_rows)  # about sqrt(8) wider
    assert lo < d < hi
    groups = entity % 2  # clusters within groups: each half resampled on its own
    d2, lo2, hi2 = paired_bootstrap(auroc, y, a, b, rounds=200, groups=groups, clusters=entity)
    assert lo2 < d2 < hi2 and hi2 - lo2 > 2.0 * (hi_rows - lo_rows)


def test_paired_bootstrap_with_no_measurable_resample_returns_nan_bounds() -> None:
    """A select set whose rows hold one class (tiny data): no resample has an AUROC; the selection must go
    on (without a proven gain) instead of crashing."""
    y = np.array([1, 1, 1], dtype=np.float32)
    a, b = np.array([0.9, 0.1, 0.5]), np.array([0.2, 0.8, 0.5])
    _, lo, hi = paired_bootstrap(auroc, y, a, b, rounds=5, clusters=np.array([0, 1, 1]))
    assert np.isnan(lo) and np.isnan(hi)
