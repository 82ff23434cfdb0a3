"""The candidate models of a scenario (binary, multiclass, multilabel, regression), behind one protocol.

A scenario fits several candidates on its training windows, compares them on validation windows
(scenarios/selection.py) and publishes the best one, which ``predict`` then scores with
(inference/predict.py). Every candidate:

    fit(train: Rows, stop: Rows)   train on the training windows; `stop` (validation rows) only early-stops
    predict(rows: Rows)            metric-ready outputs: probabilities [n] / [n, C] or values [n]
    refit(rows: Rows)              train again on more windows (training + validation) for the epochs or
                                   rounds early stopping chose (finetune.refit_on_validation)
    save() -> (meta, files)        JSON-able meta and files (LightGBM model text, safetensors): no pickle
    load_candidate(meta, files, ctx)  the inverse, given the scenario context (scenarios/loading.py)

    neural               the fine-tuned network's head (trained in scenarios/finetune.py)
    lightgbm_hybrid      LightGBM on the automatic aggregates + the foundation embedding (PCA, 32 dims)
    lightgbm_aggregates  baseline: LightGBM on the automatic aggregates alone
    popularity           baseline: recent activity (binary), recent shares of each class, the same quantity
                         in the window before the split (regression), or the training prior (python targets)
    blend                a weighted combination of fitted models, weights fitted on validation rows

Regression outputs are kept inside the range of the training labels (a non-negative amount is never
predicted below zero), by every candidate, so what the report measures is what ``predict`` publishes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from basemodel_pipeline.config import Scenario
from basemodel_pipeline.evaluation import baselines, metrics
from basemodel_pipeline.evaluation.gbm import GBM, fit_gbm
from basemodel_pipeline.progress import NullProgress, Progress
from basemodel_pipeline.scenarios.inputs import Rows
from basemodel_pipeline.targets.labels import SparseLabels, TargetSpec, label_columns
from basemodel_pipeline.tasks import Task

EMBEDDING_COMPONENTS = 32  # lightgbm_hybrid: principal components of the foundation embedding
BLEND_STEP = 0.1  # multilabel / multiclass blends: grid step of the weights on the simplex


@dataclass
class Context:
    """What every candidate of one scenario shares."""

    scenario: Scenario
    spec: TargetSpec
    task: Task  # the scenario's task type (tasks/): decoding, metrics, baselines
    seed: int = 0
    progress: Progress = field(default_factory=NullProgress)  # LightGBM fits log a line per booster


class Candidate(Protocol):
    name: str

    def fit(self, train: Rows, stop: Rows) -> None: ...

    def predict(self, rows: Rows) -> np.ndarray: ...

    def refit(self, rows: Rows) -> None: ...

    def save(self) -> tuple[dict[str, Any], dict[str, bytes]]: ...


def labels_of(ctx: Context, rows: Rows) -> np.ndarray:
    """Dense labels of fitted rows (binary [n], multiclass [n], multilabel [n, C], regression [n])."""
    assert rows.labels is not None
    return np.asarray(ctx.task.truth(rows.labels))


# ---- neural ----------------------------------------------------------------------------------------
class Neural:
    """The scenario network's outputs (its training lives in scenarios/finetune.py)."""

    name = "neural"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def fit(self, train: Rows, stop: Rows) -> None:
        pass

    def predict(self, rows: Rows) -> np.ndarray:
        return self.ctx.task.scores(rows.logits())

    def refit(self, rows: Rows) -> None:
        pass  # the network is trained again by scenarios/finetune.py (it owns the training loop)

    def save(self) -> tuple[dict[str, Any], dict[str, bytes]]:
        return {"kind": "neural"}, {}


# ---- popularity ------------------------------------------------------------------------------------
class Popularity:
    """Scores that need no training: what a rule of thumb would say (see the module docstring). A declarative
    target asks its task (Task.popularity, the training prior breaking ties between classes); a python target
    has no column to read: the training prior, or recent activity for binary."""

    name = "popularity"

    def __init__(self, ctx: Context, sign: float = 1.0, prior: list[float] | None = None) -> None:
        self.ctx, self.sign, self.prior = ctx, sign, prior

    def fit(self, train: Rows, stop: Rows) -> None:
        target, task = self.ctx.scenario.target, self.ctx.task
        if target.declarative:
            prior = task.class_prior(train.labels)
        else:
            prior = task.constant_prior(labels_of(self.ctx, train))
            if prior is None:  # recent activity, its direction chosen on the early-stopping rows
                s = baselines.recent_activity(stop.cache, stop.entity, stop.time, target.source)
                self.sign = 1.0 if metrics.auroc(labels_of(self.ctx, stop), s) >= 0.5 else -1.0
        if prior is not None:
            self.prior = [float(v) for v in prior]

    def predict(self, rows: Rows) -> np.ndarray:
        ctx, target = self.ctx, self.ctx.scenario.target
        cache, e, t = rows.cache, rows.entity, rows.time
        if target.declarative:
            prior = None if self.prior is None else np.asarray(self.prior)
            return ctx.task.popularity(cache, e, t, ctx.scenario, prior)
        if self.prior is None:
            return self.sign * baselines.recent_activity(cache, e, t, target.source)
        return ctx.task.constant(self.prior, len(rows))

    def refit(self, rows: Rows) -> None:
        pass  # nothing learned beyond priors and a sign

    def save(self) -> tuple[dict[str, Any], dict[str, bytes]]:
        return {"kind": "popularity", "sign": self.sign, "prior": self.prior}, {}


# ---- gradient-boosted trees ------------------------------------------------------------------------
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


# ---- blend -----------------------------------------------------------------------------------------
def _simplex(k: int, step: float) -> list[np.ndarray]:
    n = round(1 / step)
    return [np.array(c) / n for c in itertools.product(range(n + 1), repeat=k) if sum(c) == n]


class Blend:
    """A weighted combination of fitted candidates on the link scale (Task.link: logits, log-probabilities or
    values), weights fitted on validation rows:

    binary          the weights on the simplex (step 0.1) that maximise AUROC, on the logits, then Platt
                    scaling of the blended logit (a scale and an intercept) so the output is a probability
    multilabel      the weights on the simplex that maximise macro AUROC, on the logits
    multiclass      the weights on the simplex that maximise accuracy, on the log-probabilities
    regression      least squares with non-negative weights and an intercept, clipped to the label range
    """

    name = "blend"

    def __init__(self, ctx: Context, members: list[Candidate]) -> None:
        self.ctx, self.members = ctx, members
        self.weights = np.full(len(members), 1.0 / max(len(members), 1))
        self.scale, self.intercept = 1.0, 0.0

    def fit_outputs(self, outputs: list[np.ndarray], y: np.ndarray) -> Blend:
        """Fit the weights on the members' outputs of the same validation rows."""
        task = self.ctx.task
        Z = [task.link(o) for o in outputs]
        if task.least_squares_blend:
            from sklearn.linear_model import LinearRegression

            lr = LinearRegression(positive=True).fit(np.c_[tuple(Z)], y)
            self.weights, self.intercept = lr.coef_.astype(np.float64), float(lr.intercept_)
            return self
        self.scale, self.intercept, best = 1.0, 0.0, -np.inf
        sign = 1.0 if task.higher_is_better() else -1.0
        for w in _simplex(len(Z), BLEND_STEP):
            score = sign * task.primary(y, self._combine(Z, w))
            if np.isfinite(score) and score > best + 1e-12:
                best, self.weights = score, w
        if task.calibrate_blend and len(np.unique(y)) > 1:  # calibrate the blended logit (Platt scaling)
            from sklearn.linear_model import LogisticRegression

            z = sum(wi * zi for wi, zi in zip(self.weights, Z, strict=True))
            lr = LogisticRegression(C=1.0).fit(np.asarray(z).reshape(-1, 1), y)
            self.scale, self.intercept = float(lr.coef_[0, 0]), float(lr.intercept_[0])
        return self

    def _combine(self, Z: list[np.ndarray], w: np.ndarray) -> np.ndarray:
        z = self.scale * sum(wi * zi for wi, zi in zip(w, Z, strict=True)) + self.intercept
        return self.ctx.task.unlink(z)

    def combine(self, outputs: list[np.ndarray]) -> np.ndarray:
        return self._combine([self.ctx.task.link(o) for o in outputs], self.weights)

    def fit(self, train: Rows, stop: Rows) -> None:
        pass  # members are fitted first; the weights come from fit_outputs on validation rows

    def predict(self, rows: Rows) -> np.ndarray:
        return self.combine([m.predict(rows) for m in self.members])

    def refit(self, rows: Rows) -> None:
        for m in self.members:  # the weights stay those fitted on validation
            m.refit(rows)

    def save(self) -> tuple[dict[str, Any], dict[str, bytes]]:
        members, files = [], {}
        for m in self.members:
            meta, f = m.save()
            members.append(meta)
            files.update(f)
        return {
            "kind": "blend",
            "members": members,
            "weights": [float(w) for w in self.weights],
            "scale": self.scale,
            "intercept": self.intercept,
        }, files


def fitted_blend(ctx: Context, candidates: dict[str, Candidate], info: dict[str, Any]) -> Blend:
    """The blend a selection fitted (Selection.blend: members, weights, scale, intercept), rebuilt from its
    fitted members (for the report or the calibration when another candidate is published)."""
    blend = Blend(ctx, [candidates[m] for m in info["members"]])
    blend.weights = np.asarray(info["weights"], np.float64)
    blend.scale, blend.intercept = float(info.get("scale", 1.0)), float(info["intercept"])
    return blend
