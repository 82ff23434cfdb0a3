"""Baselines computed on the same split as the model (DESIGN.md §6): LightGBM on aggregates, popularity."""

from __future__ import annotations

import numpy as np

from basemodel_pipeline.cache.store import DAY, EventCache, expand_ranges
from basemodel_pipeline.evaluation.aggregates import _bounds, _days_between, _prepared

LGB_PARAMS = {
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


def _both(y: np.ndarray) -> bool:
    return bool(np.any(y > 0)) and bool(np.any(y <= 0))


def lightgbm_scores(
    task: str,
    X_train: np.ndarray,
    Y_train: np.ndarray,
    X_val: np.ndarray,
    Y_val: np.ndarray,
    X_test: np.ndarray,
    categorical_features: list[int] | None = None,
    seed: int = 0,
) -> np.ndarray:
    """Test scores of gradient-boosted trees trained on (X_train, Y_train), early-stopped on (X_val, Y_val).

    Args:
        task: "binary" (Y [n] of 0/1) or "multilabel" (Y [n, C] of 0/1; one model per class).
        categorical_features: column indices LightGBM treats as categorical (integer codes >= 0).
        seed: LightGBM seed (bagging, feature fraction).

    Binary models stop on validation AUROC (log-loss when the validation labels hold one class), at most
    ``MAX_ROUNDS`` rounds, patience ``EARLY_STOPPING``. In the multilabel case a class without positives (or
    without negatives) in training gets the training prevalence as a constant score.

    Returns:
        float64 probabilities for X_test: [n_test] (binary) or [n_test, C] (multilabel).
    """
    import lightgbm as lgb

    if task not in ("binary", "multilabel"):
        raise ValueError(f"lightgbm_scores supports binary and multilabel tasks, not '{task}'")
    Y_train, Y_val = np.asarray(Y_train), np.asarray(Y_val)
    single = task == "binary"
    if single:
        Y_train, Y_val = Y_train.reshape(-1, 1), Y_val.reshape(-1, 1)
    cats = list(categorical_features) if categorical_features else "auto"
    params = {**LGB_PARAMS, "seed": seed}
    train = lgb.Dataset(
        np.asarray(X_train, np.float32),
        label=np.zeros(len(X_train)),
        categorical_feature=cats,
        params=params,
        free_raw_data=False,
    ).construct()
    valid = lgb.Dataset(
        np.asarray(X_val, np.float32), label=np.zeros(len(X_val)), reference=train, free_raw_data=False
    ).construct()
    X_test = np.asarray(X_test, np.float32)
    out = np.empty((len(X_test), Y_train.shape[1]), dtype=np.float64)
    for c in range(Y_train.shape[1]):
        y_tr, y_va = (Y_train[:, c] > 0).astype(np.float64), (Y_val[:, c] > 0).astype(np.float64)
        if not _both(y_tr):
            out[:, c] = y_tr.mean() if y_tr.size else 0.0
            continue
        train.set_label(y_tr)
        valid.set_label(y_va)
        metric = "auc" if _both(y_va) else "binary_logloss"
        booster = lgb.train(
            {**params, "metric": metric},
            train,
            num_boost_round=MAX_ROUNDS,
            valid_sets=[valid],
            callbacks=[lgb.early_stopping(EARLY_STOPPING, verbose=False)],
        )
        out[:, c] = booster.predict(X_test, num_iteration=booster.best_iteration or None)
    return out[:, 0] if single else out


def _window_code_counts(
    cache: EventCache,
    source: str,
    entity: np.ndarray,
    time: np.ndarray,
    days: int,
    column: str,
    class_codes: np.ndarray,
    chunk_events: int = 1 << 24,
) -> tuple[np.ndarray, np.ndarray]:
    """Per query: events in [time - days, time) (``[n]``) and those among them per class code (``[n, C]``)."""
    src = cache.source(source)
    p = _prepared(cache)[source]
    hi = _bounds(p, entity, time)
    lo = _bounds(p, entity, time - days * DAY)
    total = (hi - lo).astype(np.float64)
    codes = np.asarray(src.columns[column])
    info = src.info[column]
    lut = np.full(max(info.vocab_size, int(np.max(class_codes, initial=0))) + 1, -1, dtype=np.int64)
    lut[np.asarray(class_codes, dtype=np.int64)] = np.arange(len(class_codes))
    C = len(class_codes)
    counts = np.zeros((len(entity), C), dtype=np.float64)
    n_ev = hi - lo
    # chunks of queries holding at most ~chunk_events events, gathered with one np.repeat each
    ends = np.cumsum(n_ev)
    start_q = 0
    while start_q < len(entity):
        base = ends[start_q - 1] if start_q else 0
        stop_q = max(int(np.searchsorted(ends, base + chunk_events, side="right")), start_q + 1)
        owner, ev = expand_ranges(lo[start_q:stop_q], hi[start_q:stop_q])
        cls = lut[codes[ev]]
        keep = cls >= 0
        n_q = stop_q - start_q
        flat = np.bincount(owner[keep] * C + cls[keep], minlength=n_q * C)
        counts[start_q:stop_q] = flat.reshape(n_q, C)
        start_q = stop_q
    return total, counts


def popularity_scores(
    task: str,
    cache: EventCache,
    entity: np.ndarray,
    time: np.ndarray,
    source: str,
    column: str | None = None,
    class_codes: np.ndarray | None = None,
    window_days: int | None = None,
) -> np.ndarray:
    """Popularity / recent-activity baseline scores per query (``entity[i]`` as of ``time[i]``).

    - ``binary``: the number of distinct active days (UTC days with an event of ``source``) in the 28 days
      (``window_days``) before the split; **higher = more active**. For churn (positive = no activity) pass ``-score``.
      Returns float64 [n].
    - ``multilabel``: for each class (a vocabulary code of ``column`` in ``class_codes`` [C]), the entity's
      share of its events in the 90 days (``window_days``) before the split that carry that code, plus 1e-3 x the class's
      share among all the queries' events in those windows (global popularity, to break ties; it only uses
      events before each split). Returns float64 [n, C].
    """
    entity = np.asarray(entity, dtype=np.int64).ravel()
    time = np.broadcast_to(np.asarray(time, dtype=np.int64), entity.shape).ravel()
    cache.source(source)
    if task == "binary":
        p = _prepared(cache)[source]
        days = window_days or 28
        return _days_between(p, _bounds(p, entity, time - days * DAY), _bounds(p, entity, time))
    if task == "multilabel":
        if column is None or class_codes is None:
            raise ValueError("multilabel popularity needs column and class_codes")
        total, counts = _window_code_counts(
            cache, source, entity, time, window_days or 90, column, np.asarray(class_codes)
        )
        share = counts / np.maximum(total, 1.0)[:, None]
        glob = counts.sum(axis=0) / max(total.sum(), 1.0)
        return share + 1e-3 * glob[None, :]
    raise ValueError(f"popularity_scores supports binary and multilabel tasks, not '{task}'")
