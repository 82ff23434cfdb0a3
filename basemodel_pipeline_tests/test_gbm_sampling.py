"""The multilabel LightGBM baseline's cost bound: each one-vs-rest booster trains on at most
``max_rows`` rows — every row of the rarer class up to half of them, a sample of the other class, each class
weighted by the inverse of its sampling rate so the probabilities stay calibrated — and one LightGBM thread per
booster, the boosters side by side. What each booster saw is recorded with the model."""

from __future__ import annotations

import numpy as np
import pytest

from basemodel_pipeline.evaluation import gbm
from basemodel_pipeline.evaluation.gbm import GBM, fit_gbm


def trees(gbm_: GBM) -> list:
    """The models without their parameters section (which records the LightGBM threads used)."""
    return [m[: m.index("end of trees")] if isinstance(m, str) else m for m in gbm_.models]


def _data(n: int = 3000, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6))
    # prevalences ~5%, ~30%, ~70%, and a constant column
    score = X[:, :3] + 0.5 * rng.normal(size=(n, 3))
    Y = np.c_[score[:, 0] > 1.65, score[:, 1] > 0.55, score[:, 2] > -0.55, np.zeros(n)].astype(np.float64)
    return X, Y


def test_each_booster_trains_on_at_most_max_rows_keeping_the_rarer_class() -> None:
    X, Y = _data()
    tr, va = slice(0, 2400), slice(2400, None)
    m = fit_gbm("binary", X[tr], Y[tr], X[va], Y[va], seed=1, max_rows=800)
    assert m.max_rows == 800
    assert m.train_rows[3] == 0  # the constant column: no booster
    assert all(0 < r <= 800 for r in m.train_rows[:3]), m.train_rows
    assert m.train_rows[0] == 800  # 5% positives (~120) are all kept, the negatives fill the rest
    # calibrated: the weights undo the sampling, so the mean probability stays near the prevalence
    p = m.predict(X[tr])
    np.testing.assert_allclose(p[:, :3].mean(0), Y[tr, :3].mean(0), atol=0.03)
    # the sample is the column's own (seed, column): the same models whatever the threads
    again = fit_gbm("binary", X[tr], Y[tr], X[va], Y[va], seed=1, max_rows=800, workers=1)
    other = fit_gbm("binary", X[tr], Y[tr], X[va], Y[va], seed=1, max_rows=800, workers=3)
    assert trees(again) == trees(other) == trees(m)
    assert again.train_rows == m.train_rows


def test_no_sample_when_every_row_fits() -> None:
    X, Y = _data(1200)
    tr, va = slice(0, 900), slice(900, None)
    full = fit_gbm("binary", X[tr], Y[tr], X[va], Y[va], seed=2)
    roomy = fit_gbm("binary", X[tr], Y[tr], X[va], Y[va], seed=2, max_rows=900)
    assert full.max_rows == 0 and full.train_rows[:3] == [900, 900, 900]
    assert roomy.models == full.models and roomy.train_rows == full.train_rows


def test_the_sample_is_kept_with_the_model_and_by_refit() -> None:
    X, Y = _data()
    m = fit_gbm("binary", X[:2400], Y[:2400], X[2400:], Y[2400:], seed=0, max_rows=600)
    back = GBM.from_json(m.to_json())
    assert back.max_rows == 600 and back.train_rows == m.train_rows
    refit = m.refit(X, Y, seed=0)
    assert refit.max_rows == 600 and all(r <= 600 for r in refit.train_rows)
    assert refit.sampling()["max_rows"] == 600
    assert m.sampling() == {
        "max_rows": 600,
        "rows": 2400,
        "rows_per_booster": m.train_rows,
        "boosters": 3,
    }


def test_one_lightgbm_thread_per_one_vs_rest_booster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Boosters side by side, one thread each: no OpenMP barrier to wait on when the CPUs are shared (a
    2-thread booster ran 5x slower per tree on a loaded 2-core machine). A single booster keeps its threads."""
    monkeypatch.delenv(gbm.WORKERS_ENV, raising=False)
    monkeypatch.setattr(gbm, "_cpus", lambda: 4)
    assert gbm.default_workers() == 4
    X, Y = _data(800)
    multi = fit_gbm("binary", X[:600], Y[:600], X[600:], Y[600:], seed=0)
    assert all("[num_threads: 1]" in t for t in multi.models if isinstance(t, str))
    binary = fit_gbm("binary", X[:600], Y[:600, 1], X[600:], Y[600:, 1], seed=0)
    assert f"[num_threads: {gbm.PARAMS['num_threads']}]" in binary.models[0]


def test_refit_fits_its_one_vs_rest_boosters_side_by_side_like_the_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The production refit of a multilabel model trains its boosters the way the fit did: one LightGBM thread
    each, side by side, and the same trees for any number of workers."""
    monkeypatch.delenv(gbm.WORKERS_ENV, raising=False)
    monkeypatch.setattr(gbm, "_cpus", lambda: 4)
    X, Y = _data(1600)
    m = fit_gbm("binary", X[:1200], Y[:1200], X[1200:], Y[1200:], seed=0, max_rows=700)
    side_by_side = m.refit(X, Y, seed=0)
    assert all("[num_threads: 1]" in t for t in side_by_side.models if isinstance(t, str))
    one = m.refit(X, Y, seed=0, workers=1)
    three = m.refit(X, Y, seed=0, workers=3)
    assert trees(one) == trees(three) == trees(side_by_side)
    assert one.train_rows == side_by_side.train_rows and one.rounds == m.rounds


def test_a_saved_model_without_its_objective_is_refused_in_one_line() -> None:
    """A LightGBM model saved without its objective (a format no release writes) is not guessed from a task
    name: loading it names what to do."""
    import json

    from basemodel_pipeline.errors import UserError

    X, Y = _data(600)
    saved = json.loads(fit_gbm("binary", X[:400], Y[:400], X[400:], Y[400:], seed=0).to_json())
    del saved["objective"]
    with pytest.raises(UserError, match="run `basemodel finetune` again") as err:
        GBM.from_json(json.dumps(saved))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("max_rows", [0, 700])
def test_sampled_boosters_share_one_binned_training_set_across_workers(
    monkeypatch: pytest.MonkeyPatch, max_rows: int
) -> None:
    """Row-sampled one-vs-rest boosters each train on a subset of the same bins: the training rows are binned
    once for all the workers of a fit or a refit, each worker binning only its validation rows; without a
    sample each worker labels a training set of its own. The same trees for any number of workers."""
    monkeypatch.delenv(gbm.WORKERS_ENV, raising=False)
    monkeypatch.setattr(gbm, "_cpus", lambda: 4)
    X, Y = _data(1600)
    binned: list[int] = []
    real = gbm._datasets

    def counting(X_train, X_val, *args, **kwargs):
        if kwargs.get("train") is None:
            binned.append(len(X_train))
        return real(X_train, X_val, *args, **kwargs)

    monkeypatch.setattr(gbm, "_datasets", counting)
    m = fit_gbm("binary", X[:1200], Y[:1200], X[1200:], Y[1200:], seed=0, max_rows=max_rows, workers=3)
    assert binned == ([1200] if max_rows else [1200] * 3)
    binned.clear()
    refit = m.refit(X, Y, seed=0, workers=3)
    assert binned == ([1600] if max_rows else [1600] * 3)
    one = fit_gbm("binary", X[:1200], Y[:1200], X[1200:], Y[1200:], seed=0, max_rows=max_rows, workers=1)
    assert trees(one) == trees(m)
    assert trees(m.refit(X, Y, seed=0, workers=1)) == trees(refit)


def test_a_row_sampled_booster_stops_on_a_sample_of_the_validation_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Early stopping scores and ranks every validation row at every round, which costs more than the
    round's tree when the booster trains on a sample: a row-sampled booster stops on at most
    `validation_rows` validation rows per training row (drawn like the training sample, its weights undoing
    the rate); with 0 or without a row bound, on every validation row."""
    X, Y = _data(6000)
    tr, va = slice(0, 2000), slice(2000, None)
    seen: list[int] = []
    train = gbm._train

    def recorded(params, data, valid, rounds=gbm.MAX_ROUNDS):
        seen.append(valid.num_data())
        return train(params, data, valid, rounds)

    monkeypatch.setattr(gbm, "_train", recorded)
    fit_gbm("binary", X[tr], Y[tr], X[va], Y[va], seed=1, max_rows=300, validation_rows=2, workers=1)
    assert seen == [600] * 3
    for bound in ({"max_rows": 300, "validation_rows": 0}, {"validation_rows": 2}):
        seen.clear()
        fit_gbm("binary", X[tr], Y[tr], X[va], Y[va], seed=1, workers=1, **bound)
        assert seen == [4000] * 3
