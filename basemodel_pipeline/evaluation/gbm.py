"""Gradient-boosted trees (LightGBM) on tabular rows, as a fitted object that scores new rows and saves as text
(LightGBM's own model format: no pickle). The caller names LightGBM's objective (a task says which,
``Task.lightgbm``); the labels' shape says how many boosters: ``binary`` fits one per column of a 2-d label
array (one-vs-rest, outputs [n, C]) and one for 1-d labels (outputs [n]).

One home for every LightGBM model of the project: the "hand-crafted aggregates + LightGBM" baseline, the
hybrid candidate on aggregates + foundation embedding (candidates/lightgbm.py) and the recommendation
re-ranker's ranking objective (candidates/rerank.py) all fit through ``fit_gbm`` / ``fit_ranker``.

    binary        one booster per label column, early-stopped on validation AUROC (log-loss when validation
                  has one class); the boosters of several columns share one binned Dataset; a column without both
                  classes in training is the training prevalence, a constant. The columns are fitted in
                  ``workers`` threads (default: the CPUs this process may use), one LightGBM thread each and
                  each with its own copy of the Dataset: the same models as one after the other, in less
                  time. With ``max_rows``, a booster trains on at most that many rows (``sample_rows``): every
                  row of the column's rarer class up to half of them, a seeded sample of the other class,
                  each class weighted by the inverse of its sampling rate (the probabilities stay calibrated)
    multiclass    one softmax booster, early-stopped on multi-log-loss
    regression    one booster, L2 loss
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from basemodel_pipeline import runtime
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.progress import NullProgress, Progress

PARAMS = {
    "objective": "binary",
    "learning_rate": 0.05,
    "num_leaves": 31,
    "min_data_in_leaf": 20,
    "feature_fraction": 0.8,
    "bagging_fraction": 0.8,
    "bagging_freq": 1,
    "lambda_l2": 1.0,
    "num_threads": 2,
    "verbose": -1,
    "deterministic": True,
    "force_col_wise": True,
}
MAX_ROUNDS = 500
EARLY_STOPPING = 30
OBJECTIVES = ("binary", "multiclass", "regression")  # LightGBM's objectives fit_gbm fits
WORKERS_ENV = "BASEMODEL_GBM_WORKERS"  # threads fitting one-vs-rest columns (default: from the CPUs)
# LightGBM's Dataset construction is not safe in two threads at once (a segfault in about one run in five with
# two workers); construction is a small part of a fit, the boosting itself runs side by side
_CONSTRUCTING = threading.Lock()


def _both(y: np.ndarray) -> bool:
    return bool(np.any(y > 0)) and bool(np.any(y <= 0))


def _datasets(X_train, X_val, categorical, params, group_train=None, group_val=None, train=None):
    """(train, valid) binned Datasets; with `train` (binned from X_train before) only the validation rows."""
    import lightgbm as lgb

    cats = list(categorical) if categorical else "auto"
    if train is None:
        train = lgb.Dataset(
            np.asarray(X_train, np.float32),
            label=np.zeros(len(X_train)),
            categorical_feature=cats,
            params=params,
            free_raw_data=False,
            group=group_train,
        ).construct()
    valid = lgb.Dataset(
        np.asarray(X_val, np.float32),
        label=np.zeros(len(X_val)),
        reference=train,
        free_raw_data=False,
        group=group_val,
    ).construct()
    return train, valid


def _train(params: dict, train, valid, rounds: int = MAX_ROUNDS) -> tuple[str, int]:
    """(model text, rounds kept): early-stopped on `valid`, or exactly `rounds` rounds without it."""
    import lightgbm as lgb

    if valid is None:
        booster = lgb.train(params, train, num_boost_round=max(rounds, 1))
        return booster.model_to_string(), booster.current_iteration()
    booster = lgb.train(
        params,
        train,
        num_boost_round=rounds,
        valid_sets=[valid],
        callbacks=[lgb.early_stopping(EARLY_STOPPING, verbose=False)],
    )
    best = booster.best_iteration or booster.current_iteration()
    return booster.model_to_string(num_iteration=best), int(best)


def _params(objective: str, seed: int, n_class: int = 0, metric: str = "auc") -> dict:
    params = {**PARAMS, "seed": seed, "objective": objective}
    if objective == "regression":
        return {**params, "metric": "l2"}
    if objective == "multiclass":
        return {**params, "num_class": n_class, "metric": "multi_logloss"}
    return {**params, "metric": metric}


def _one_booster(objective: str) -> bool:
    """One booster for all outputs (softmax, values), not one per label column."""
    return objective != "binary"


@dataclass
class GBM:
    """Fitted LightGBM model(s) of one objective. ``models`` holds LightGBM model text, one per label column
    (``columns``) or one in all; a float in place of the text is a constant output (a column without both
    classes in training)."""

    objective: str  # LightGBM's: binary, multiclass or regression
    models: list[str | float]
    n_out: int = 1  # multiclass: classes; label columns: columns
    rounds: list[int] = field(default_factory=list)
    max_rows: int = 0  # label columns: rows one booster may train on (0: all; see sample_rows)
    train_rows: list[int] = field(default_factory=list)  # rows each booster trained on (0: a constant)
    available_rows: int = 0  # training rows there were
    columns: bool = False  # one booster per column of 2-d labels: outputs [n, C]
    _boosters: list = field(default_factory=list, repr=False, compare=False)

    def _booster(self, i: int):
        import lightgbm as lgb

        if not self._boosters:
            self._boosters = [lgb.Booster(model_str=m) if isinstance(m, str) else None for m in self.models]
        return self._boosters[i]

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Probabilities [n] (binary) / [n, C] (label columns, multiclass) or values [n] (regression)."""
        X = np.asarray(X, np.float32)
        if self.objective == "multiclass":
            booster = self._booster(0)
            if len(X) == 0:
                return np.zeros((0, self.n_out))
            return np.asarray(booster.predict(X)).reshape(len(X), self.n_out)
        out = np.empty((len(X), len(self.models)), np.float64)
        for i, m in enumerate(self.models):
            if isinstance(m, str):
                out[:, i] = self._booster(i).predict(X) if len(X) else 0.0
            else:
                out[:, i] = m
        return out if self.columns else out[:, 0]

    def refit(self, X: np.ndarray, Y: np.ndarray, seed: int = 0, workers: int | None = None) -> GBM:
        """The same models trained again on (X, Y) (more windows) for the rounds early stopping kept, without
        a validation set, with the same row bound: what a production retrain on the newest windows does.
        One-vs-rest boosters train side by side like fit_gbm's (``workers``)."""
        Y = np.asarray(Y)
        if _one_booster(self.objective):
            train, _ = _datasets(X, X[:1], None, {**PARAMS, "seed": seed})
            train.set_label(Y.astype(np.float64))
            text, _ = _train(_params(self.objective, seed, self.n_out), train, None, self.rounds[0])
            return GBM(self.objective, [text], self.n_out, list(self.rounds))
        Y = Y.reshape(len(Y), -1)
        models: list[str | float] = list(self.models)
        rows = [0] * len(self.models)
        todo = []
        for c, m in enumerate(self.models):
            y = (Y[:, c] > 0).astype(np.float64)
            if isinstance(m, str) and _both(y):
                todo.append(c)
            else:
                models[c] = float(y.mean()) if y.size else 0.0

        def fit_column(c: int, train, _valid, threads: int) -> None:
            data, rows[c] = _column_data(train, (Y[:, c] > 0).astype(np.float64), self.max_rows, seed, c)
            params = {**_params(self.objective, seed), "num_threads": threads}
            models[c] = _train(params, data, None, self.rounds[c])[0]

        _fit_columns(
            todo,
            workers,
            lambda params, train=None: _datasets(X, X[:1], None, params, train=train),
            seed,
            fit_column,
            shared_train=bool(self.max_rows) and len(Y) > self.max_rows,
        )
        return GBM(
            self.objective, models, self.n_out, list(self.rounds), self.max_rows, rows, len(Y), self.columns
        )

    def sampling(self) -> dict:
        """What the boosters trained on: the bound, the rows available, each booster's rows (label columns)."""
        return {
            "max_rows": self.max_rows,
            "rows": self.available_rows,
            "rows_per_booster": list(self.train_rows),
            "boosters": sum(1 for m in self.models if isinstance(m, str)),
        }

    def to_json(self) -> str:
        return json.dumps(
            {
                "objective": self.objective,
                "columns": self.columns,
                "models": self.models,
                "n_out": self.n_out,
                "rounds": self.rounds,
                "max_rows": self.max_rows,
                "train_rows": self.train_rows,
                "available_rows": self.available_rows,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> GBM:
        d = json.loads(text)
        if "objective" not in d or "columns" not in d:
            raise UserError(
                "a LightGBM model of this checkpoint was saved in a format this version does not read (no "
                "objective recorded): run `basemodel finetune` again for its scenario"
            )
        return cls(
            d["objective"],
            d["models"],
            d["n_out"],
            d["rounds"],
            d["max_rows"],
            d["train_rows"],
            d["available_rows"],
            bool(d["columns"]),
        )


def _cpus() -> int:
    return runtime.cpus()


def default_workers() -> int:
    """Threads for one-vs-rest columns: $BASEMODEL_GBM_WORKERS, else the CPUs this process may use (each
    booster then runs one LightGBM thread), at least 1."""
    if os.environ.get(WORKERS_ENV):
        return max(1, int(os.environ[WORKERS_ENV]))
    return max(1, _cpus())


def sample_rows(y: np.ndarray, max_rows: int, seed: int, column: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(sorted row indices, weights) of one column's training sample of at most `max_rows` rows, or None when
    every row fits (``max_rows`` 0 or at least the rows there are).

    Every row of the rarer class up to ``max_rows // 2``, the rest from the other class, each drawn uniformly
    (seeded by the seed and the column: the same sample whatever the threads). Each class is weighted by its
    rows over its sampled rows, so the weighted sample has the class totals of all rows: the boosters start
    from the same prior and their probabilities stay calibrated. A uniform sample of one class leaves AUROC
    unchanged in expectation; keeping the rarer class whole keeps the rows that carry most information."""
    n = len(y)
    if not max_rows or n <= max_rows:
        return None
    pos = np.asarray(y) > 0
    rare = pos if 2 * int(pos.sum()) <= n else ~pos
    idx_rare, idx_common = np.flatnonzero(rare), np.flatnonzero(~rare)
    k_rare = min(len(idx_rare), max_rows // 2)
    k_common = min(len(idx_common), max_rows - k_rare)
    rng = np.random.default_rng([seed, column])
    idx = np.sort(
        np.r_[rng.choice(idx_rare, k_rare, replace=False), rng.choice(idx_common, k_common, replace=False)]
    )
    weight = np.where(rare[idx], len(idx_rare) / max(k_rare, 1), len(idx_common) / max(k_common, 1))
    return idx, weight


def _column_data(train, y: np.ndarray, max_rows: int, seed: int, column: int):
    """(the Dataset one column's booster trains on, its rows): `train` with the column's labels, or its row
    sample (a subset of the same bins, weighted; see sample_rows)."""
    sample = sample_rows(y, max_rows, seed, column)
    if sample is None:
        train.set_label(y)
        return train, len(y)
    idx, weight = sample
    with _CONSTRUCTING:
        sub = train.subset(idx.astype(np.int32)).construct()
    sub.set_label(y[idx])
    sub.set_weight(weight)
    return sub, len(idx)


def fit_gbm(
    objective: str,
    X_train: np.ndarray,
    Y_train: np.ndarray,
    X_val: np.ndarray,
    Y_val: np.ndarray,
    categorical_features: list[int] | None = None,
    seed: int = 0,
    workers: int | None = None,
    progress: Progress | None = None,
    label: str = "lightgbm",
    max_rows: int = 0,
    validation_rows: int = 0,
) -> GBM:
    """Gradient-boosted trees trained on (X_train, Y_train), early-stopped on (X_val, Y_val).

    Args:
        objective: LightGBM's: "binary" (Y [n] of 0/1, or Y [n, C] of 0/1 with one model per column),
            "multiclass" (Y [n] class indices; one softmax model) or "regression" (Y [n] values; L2 loss).
        categorical_features: column indices LightGBM treats as categorical (integer codes >= 0).
        seed: LightGBM seed (bagging, feature fraction).
        workers: threads fitting the one-vs-rest columns (default ``default_workers()``); any number gives
            the same models.
        progress: a line per fitted booster (``label: class i/C fitted ...``) with the elapsed seconds.
        max_rows: label columns: rows one booster may train on (0: all; see ``sample_rows``).
        validation_rows: a row-sampled booster early-stops on at most this many validation rows per row of
            its training sample, drawn the same way (0: every row): every round scores and ranks them.
    At most ``MAX_ROUNDS`` rounds, patience ``EARLY_STOPPING``."""
    if objective not in OBJECTIVES:
        raise ValueError(f"fit_gbm fits LightGBM's {', '.join(OBJECTIVES)} objectives, not '{objective}'")
    progress = progress or NullProgress()
    started = time.perf_counter()
    Y_train, Y_val = np.asarray(Y_train), np.asarray(Y_val)
    if _one_booster(objective):
        train, valid = _datasets(X_train, X_val, categorical_features, {**PARAMS, "seed": seed})
        train.set_label(Y_train.astype(np.float64))
        valid.set_label(Y_val.astype(np.float64))
        n_class = (
            int(max(Y_train.max(initial=0), Y_val.max(initial=0))) + 1 if objective == "multiclass" else 1
        )
        progress.log(f"{label}: fitting one {objective} booster on {len(Y_train):,} rows")
        text, rounds = _train(_params(objective, seed, n_class), train, valid)
        progress.log(f"{label}: fitted ({rounds} rounds) in {time.perf_counter() - started:.1f} s")
        return GBM(objective, [text], n_class, [rounds])
    columns = Y_train.ndim == 2
    if not columns:
        Y_train, Y_val = Y_train.reshape(-1, 1), Y_val.reshape(-1, 1)
    n_cols = Y_train.shape[1]
    max_rows = max_rows if columns else 0
    models: list[str | float] = [0.0] * n_cols
    kept, rows = [0] * n_cols, [0] * n_cols
    todo = []
    for c in range(n_cols):
        y_tr = (Y_train[:, c] > 0).astype(np.float64)
        if _both(y_tr):
            todo.append(c)
        else:
            models[c] = float(y_tr.mean()) if y_tr.size else 0.0
    what = f"{len(todo)} of {n_cols} classes" if columns else "one booster"
    bound = f", at most {max_rows:,} rows per booster" if max_rows and len(Y_train) > max_rows else ""
    progress.log(f"{label}: fitting {what} on {len(Y_train):,} rows{bound}")
    lock, done = threading.Lock(), [n_cols - len(todo)]

    def fit_column(c: int, train, valid, threads: int) -> None:
        t0 = time.perf_counter()
        y_tr, y_va = (Y_train[:, c] > 0).astype(np.float64), (Y_val[:, c] > 0).astype(np.float64)
        data, rows[c] = _column_data(train, y_tr, max_rows, seed, c)
        if max_rows and validation_rows:  # a sampled booster stops on a sample too
            valid = _column_data(valid, y_va, max_rows * validation_rows, seed + 1, c)[0]
        else:
            valid.set_label(y_va)
        metric = "auc" if _both(y_va) else "binary_logloss"
        fit_params = {**_params(objective, seed, metric=metric), "num_threads": threads}
        models[c], kept[c] = _train(fit_params, data, valid)
        with lock:
            done[0] += 1
            what = f"class {done[0]}/{n_cols}" if columns else "booster"
            progress.log(
                f"{label}: {what} fitted ({kept[c]} rounds, {rows[c]:,} rows) in "
                f"{time.perf_counter() - t0:.1f} s, {time.perf_counter() - started:.1f} s elapsed"
            )

    def datasets(params: dict, train=None):
        return _datasets(X_train, X_val, categorical_features, params, train=train)

    _fit_columns(todo, workers, datasets, seed, fit_column, shared_train=bool(bound))
    return GBM(objective, models, n_cols, kept, max_rows, rows, len(Y_train), columns)


def _fit_columns(
    todo: list[int], workers: int | None, datasets, seed: int, fit_column, shared_train: bool = False
) -> None:
    """Run ``fit_column(column, train, valid, threads)`` for each one-vs-rest column in `todo`, in ``workers``
    threads (default ``default_workers()``), each with its own binned Datasets from ``datasets(params)``;
    ``shared_train`` (every booster trains on a row sample, a subset of the training bins that leaves them
    unchanged): the training rows are binned once, ``datasets(params, train)`` bins each worker's validation.

    Boosters side by side, one LightGBM thread each: a lone booster keeps PARAMS["num_threads"]. LightGBM's
    OpenMP threads wait for each other at every step, which a busy machine turns into a 5x slowdown per tree
    (2 threads, CJ departments, load 10 on 2 cores); the trees are the same for any number of threads."""
    if not todo:
        return
    workers = max(1, min(workers or default_workers(), len(todo)))
    threads = max(1, min(int(PARAMS["num_threads"]), _cpus() // workers))

    params, binned = {**PARAMS, "seed": seed, "num_threads": threads}, []

    def run(columns: list[int]) -> None:
        with _CONSTRUCTING:
            train, valid = datasets(params, binned[0] if binned else None)
            if shared_train and not binned:
                binned.append(train)
        for c in columns:
            fit_column(c, train, valid, threads)

    if workers == 1:
        run(todo)
    else:  # LightGBM releases the GIL while it trains; each thread has its own binned Dataset
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(run, [todo[i::workers] for i in range(workers)]))


def fit_ranker(
    X_train: np.ndarray,
    rel_train: np.ndarray,
    group_train: np.ndarray,
    X_val: np.ndarray | None,
    rel_val: np.ndarray | None,
    group_val: np.ndarray | None,
    seed: int = 0,
    eval_at: int = 10,
    rounds: int = MAX_ROUNDS,
) -> tuple[str, int]:
    """A LambdaRank booster over candidate lists: rows grouped by query (``group_*``: rows per query, in
    order), relevance 0/1 per row; early-stopped on validation NDCG@eval_at, or exactly `rounds` rounds
    without validation rows. Returns (model text, rounds kept)."""
    params = {
        **PARAMS,
        "objective": "lambdarank",
        "metric": "ndcg",
        "eval_at": [eval_at],
        "lambdarank_truncation_level": max(2 * eval_at, 20),
        "seed": seed,
    }
    if X_val is None:
        train, _ = _datasets(X_train, X_train[:1], None, params, group_train, np.array([1]))
        train.set_label(np.asarray(rel_train, np.float64))
        return _train(params, train, None, rounds)
    train, valid = _datasets(X_train, X_val, None, params, group_train, group_val)
    train.set_label(np.asarray(rel_train, np.float64))
    valid.set_label(np.asarray(rel_val, np.float64))
    return _train(params, train, valid)
