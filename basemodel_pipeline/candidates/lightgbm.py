"""Gradient-boosted trees as candidates: LightGBM on the automatic aggregates (``lightgbm_aggregates``, a
baseline) or on the aggregates plus the first principal components of the foundation embedding
(``lightgbm_hybrid``). The boosters themselves are evaluation/gbm.py's."""

from __future__ import annotations

from typing import Any

import numpy as np

from basemodel_pipeline.candidates.base import (
    AGGREGATES,
    EMBEDDING,
    Context,
    description,
    labels_of,
    ordered,
    summary,
)
from basemodel_pipeline.candidates.inputs import Rows
from basemodel_pipeline.candidates.popularity import Popularity
from basemodel_pipeline.evaluation.gbm import GBM, fit_gbm
from basemodel_pipeline.targets.labels import SparseLabels, label_columns

EMBEDDING_COMPONENTS = 32  # lightgbm_hybrid: principal components of the foundation embedding


class LightGBM:
    """LightGBM on the automatic aggregates (``features="aggregates"``, the baseline) or on the aggregates
    plus the first principal components of the foundation embedding (``features="hybrid"``).

    Multilabel: one model per label for the ``lightgbm_top_labels`` most frequent labels, popularity for the
    rest (thousands of one-vs-rest models would cost hours); each trains on at most ``lightgbm_max_rows``
    rows (evaluation/gbm.py, ``sample_rows``)."""

    def __init__(self, ctx: Context, features: str) -> None:
        self.ctx, self.features = ctx, features
        self.name = f"lightgbm_{features}"
        self.gbm: GBM | None = None
        self.top: np.ndarray | None = None  # multilabel: the modelled label columns
        self.pca: tuple[np.ndarray, np.ndarray] | None = None  # (mean [h], components [k, h])
        self.fallback = Popularity(ctx)  # multilabel: the labels without a model of their own

    def _matrix(self, rows: Rows) -> np.ndarray:
        A = rows.tabular()
        if self.features != "hybrid":
            return A
        assert self.pca is not None
        mean, comp = self.pca
        return np.c_[A, (rows.embedding() - mean) @ comp.T]

    def fit(self, train: Rows, stop: Rows) -> None:
        ctx = self.ctx
        if self.features == "hybrid":
            from sklearn.decomposition import PCA

            E = train.embedding()
            k = min(EMBEDDING_COMPONENTS, E.shape[1], max(len(E) - 1, 1))
            pca = PCA(k, random_state=ctx.seed).fit(E)
            # C order: safetensors writes the raw buffer, and sklearn's components_ can be Fortran-ordered
            self.pca = (
                np.ascontiguousarray(pca.mean_, np.float32),
                np.ascontiguousarray(pca.components_, np.float32),
            )
        F_train, F_stop = self._matrix(train), self._matrix(stop)
        if ctx.task.per_label:  # the most frequent labels, without densifying thousands of columns
            self.fallback.fit(train, stop)
            lab = train.labels
            freq = (
                np.bincount(lab.indices, minlength=lab.n_cols)
                if isinstance(lab, SparseLabels)
                else (np.asarray(lab) > 0).sum(0)
            )
            self.top = np.sort(np.argsort(-freq, kind="stable")[: ctx.scenario.lightgbm_top_labels])
            if len(self.top):
                y_train, y_stop = (label_columns(x, self.top) for x in (lab, stop.labels))
                self.gbm = self._fit(F_train, y_train, F_stop, y_stop)
            return
        y_train, y_stop = labels_of(ctx, train), labels_of(ctx, stop)
        self.gbm = self._fit(F_train, y_train, F_stop, y_stop)

    def _fit(self, F_train: np.ndarray, y_train: np.ndarray, F_stop: np.ndarray, y_stop: np.ndarray) -> GBM:
        ctx = self.ctx
        label = f"{ctx.scenario.name} {self.name}"
        assert ctx.task.lightgbm is not None
        return fit_gbm(
            ctx.task.lightgbm,
            F_train,
            y_train,
            F_stop,
            y_stop,
            seed=ctx.seed,
            progress=ctx.progress,
            label=label,
            max_rows=ctx.scenario.lightgbm_max_rows if ctx.task.per_label else 0,
            validation_rows=ctx.scenario.lightgbm_validation_rows,
        )

    def refit(self, rows: Rows) -> None:
        if self.gbm is None:
            return
        F = self._matrix(rows)
        if self.ctx.task.per_label:
            assert self.top is not None
            Y = label_columns(rows.labels, self.top)
        else:
            Y = labels_of(self.ctx, rows)
        self.gbm = self.gbm.refit(F, Y, seed=self.ctx.seed)

    def predict(self, rows: Rows) -> np.ndarray:
        if self.ctx.task.per_label:
            out = self.fallback.predict(rows).astype(np.float64)
            if self.gbm is not None and self.top is not None and len(self.top):
                out[:, self.top] = self.gbm.predict(self._matrix(rows))
            return out
        assert self.gbm is not None
        return self.ctx.task.finish(self.gbm.predict(self._matrix(rows)))

    def save(self) -> tuple[dict[str, Any], dict[str, bytes]]:
        from safetensors.numpy import save

        meta: dict[str, Any] = {
            "kind": "lightgbm",
            "features": self.features,
            "fallback": self.fallback.save()[0],
        }
        files: dict[str, bytes] = {}
        if self.gbm is not None:
            files[f"{self.name}.json"] = self.gbm.to_json().encode()
        if self.top is not None:
            meta["top"] = self.top.tolist()
        if self.pca is not None:
            files[f"{self.name}_pca.safetensors"] = save({"mean": self.pca[0], "components": self.pca[1]})
        return meta, files

    def describe(self) -> dict[str, Any]:
        hybrid = self.features == "hybrid"
        text = (
            "LightGBM on the automatic aggregates and the first principal components of the foundation embedding"
            if hybrid
            else "baseline: LightGBM on the automatic aggregates"
        )
        inputs = [AGGREGATES, *([EMBEDDING] if hybrid else [])]
        params: dict[str, Any] = {}
        if self.gbm is not None:
            params.update(objective=self.gbm.objective, rounds=summary(list(self.gbm.rounds)))
        if self.pca is not None:
            params["embedding_components"] = len(self.pca[1])
        if self.ctx.task.per_label:  # the labels without a booster score by popularity
            inputs = ordered([*inputs, *self.fallback.describe()["inputs"]])
            params["labels_modelled"] = 0 if self.top is None else len(self.top)
            params["max_rows"] = self.ctx.scenario.lightgbm_max_rows
            params["validation_rows"] = self.ctx.scenario.lightgbm_validation_rows
        return description(self.name, text, inputs, **params)
