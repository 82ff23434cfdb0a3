"""Integrated-gradients explanations of a scenario model, per data source, column and value.

For an input x (an entity's features as of a date, features/sketch.py) and a baseline x', the attribution of
feature i is

    A_i = (x_i - x'_i) * integral over a in [0, 1] of d f(x' + a (x - x')) / d x_i

and the attributions add up to f(x) - f(x') (completeness). The integral is computed with Gauss-Legendre
quadrature on `steps` nodes (default 32; the network is smooth: GELU, LayerNorm, so the error falls fast with
the nodes, where the usual Riemann sum needs hundreds); rows whose gap |f(x) - f(x') - sum A| is still above
GAP_TOLERANCE * (1 + |f(x) - f(x')|) are recomputed with 64, 128, 256 nodes. The JSON reports the gap.

f is the scenario model's output: binary and multilabel the logit of the (chosen) class, multiclass the
log-probability of the chosen class (log-softmax), regression the predicted value on the target's scale
(log1p-space for log1p targets). The class defaults to the entity's top class (one entity) or the class with
the highest mean score (a population).

Baselines: ``mean`` (default), the mean features of the foundation's validation examples, stored in the
model (the trunk standardises its input with them, so the baseline is the centre of the data the model saw):
A says what makes the entity's output differ from the average example's, f(x') being that output.
``empty``: the same entity with no events (every source's decayed sums 0, recency "never", its own
attributes kept): A says what in its history moves it away from a brand-new entity with the same attributes
(attributes then get nothing). The empty point can lie far from the training data (features that never were
0 there are divided by their small standard deviation), so its completeness gap is larger; see docs/explain.md.

Aggregation (features/names.py describes every input index): per source (event sources, "attributes",
"aggregates"), per column (summing half-lives, values, buckets), per value (summing half-lives). A hashed
(high-cardinality) column's feature is a bucket shared by several values; each bucket's attribution at each
half-life is split among the entity's values in that bucket in proportion to their decayed event counts,
summed over partitions. With the empty baseline this is exact (buckets the entity never used have x = x' and
get nothing); with the mean baseline the attribution of the buckets the entity never used is reported as the
value "(buckets without the entity's values)". A population explanation is the mean |attribution| over the
entities (and the mean signed one) at every level, each entity's totals taken before the absolute value.

Writing explanations to files and into the scenario report: reports/explanations.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from basemodel_pipeline import runtime
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.dates import epoch_seconds
from basemodel_pipeline.errors import ArgumentError, UserError
from basemodel_pipeline.features.names import ATTRIBUTES, Vocabularies, describe
from basemodel_pipeline.features.sketch import FeatureEncoder
from basemodel_pipeline.inference.attributions import (
    OTHER_BUCKETS,
    AttributeValues,
    HashedValues,
    Totals,
    ValueTable,
    group_sum,
    index_keys,
)
from basemodel_pipeline.inference.predict import load_scenario
from basemodel_pipeline.model.checkpoint import CheckpointMeta
from basemodel_pipeline.model.trunk import TrunkWithHead
from basemodel_pipeline.tasks import TASKS, Task

DEFAULT_STEPS = 32
DEFAULT_POPULATION = 2000
MAX_STEPS = 256  # rows whose completeness gap stays above GAP_TOLERANCE get up to this many steps
GAP_TOLERANCE = 1e-3  # of 1 + |f(x) - f(baseline)|
MAX_ROWS = 8192  # path points per forward/backward pass
TOP_FEATURES = 50
TOP_VALUES_PER_COLUMN = 20
BASELINES = ("mean", "empty")
OWN_VALUE_KINDS = ("direct", "weekday", "hour")  # event columns whose every value has its own channels


# ---- the output being explained ---------------------------------------------------------------------
@dataclass
class Output:
    """Which scalar of the model is explained."""

    task: Task
    index: int  # output column (class index; 0 for binary and regression)
    label: str | None  # class label (multiclass, multilabel)

    @property
    def description(self) -> str:
        return self.task.explained_what(self.label)

    def _transform(self, out: torch.Tensor) -> torch.Tensor:
        """Model outputs [n, out_dim] -> the explained scalar [n] (Task.explained)."""
        return self.task.explained(out, self.index)

    def fn(self, model: TrunkWithHead) -> Callable[[torch.Tensor], torch.Tensor]:
        """x [n, dim] -> the explained output [n]."""
        return lambda x: self._transform(model(x))

    def split(self, model: TrunkWithHead) -> tuple[Affine, Callable[[torch.Tensor], torch.Tensor]]:
        """The model as rest(x @ W.T + b): its affine input layer (the trunk's standardisation and projection,
        Trunk.forward) and the rest. Integrated gradients then run in the hidden space (see Affine)."""
        trunk = model.trunk
        weight = (trunk.proj.weight / trunk.std).detach()  # [hidden, dim]
        bias = (trunk.proj.bias - weight @ trunk.mean).detach()

        def rest(z: torch.Tensor) -> torch.Tensor:
            for block in trunk.blocks:
                z = block(z)
            return self._transform(model.head(trunk.norm(z)))

        return Affine(weight, bias), rest


@dataclass
class Affine:
    """z = x @ weight.T + bias. The straight path from x' to x maps to the straight path from z' to z, and
    d f / d x = (d f / d z) @ weight, so the path's gradients are taken in the (smaller) hidden space and
    mapped back once per entity instead of once per step: the same attributions for less work."""

    weight: torch.Tensor
    bias: torch.Tensor


def explainable() -> list[str]:
    """The tasks whose outputs integrated gradients explain."""
    return [name for name, task in TASKS.items() if task.explainable]


def choose_output(task: Task, label: str | None, scores: np.ndarray | None) -> Output:
    """The class named `label`, else the top class of `scores` (mean over rows) for multi-class tasks."""
    if not task.explainable:
        raise UserError(f"explanations cover {', '.join(explainable())} scenarios, not {task.name}")
    if not task.per_class:
        if label is not None:
            raise ArgumentError("label", None, f"a {task.name} scenario has one output; leave the class out")
        return Output(task, 0, None)
    classes = [str(c) for c in task.spec.classes]
    if label is not None:
        if label not in classes:
            shown = ", ".join(classes[:10]) + (f", ... ({len(classes)} classes)" if len(classes) > 10 else "")
            raise ArgumentError(
                "label", repr(label), f"is not a class of this scenario; its classes: {shown}"
            )
        return Output(task, classes.index(label), label)
    assert scores is not None
    j = int(np.argmax(np.asarray(scores).reshape(-1, len(classes)).mean(0)))
    return Output(task, j, classes[j])


# ---- integrated gradients -----------------------------------------------------------------------------
def integrated_gradients(
    fn: Callable[[torch.Tensor], torch.Tensor],
    x: np.ndarray,
    baseline: np.ndarray,
    steps: int = DEFAULT_STEPS,
    first: Affine | None = None,
    max_rows: int = MAX_ROWS,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(attributions [n, d], f(x) [n], f(baseline) [n]) for rows x [n, d] and a baseline [d] or [n, d].

    Gauss-Legendre nodes a_k, weights w_k on [0, 1]: A = (x - x') * sum_k w_k grad f(x' + a_k (x - x')).
    With `first`, fn takes z = first(x) (Affine) instead of x."""
    nodes, weights = np.polynomial.legendre.leggauss(steps)
    alpha = torch.from_numpy(((nodes + 1) / 2).astype(np.float32))
    w = torch.from_numpy((weights / 2).astype(np.float32))
    X = torch.from_numpy(np.ascontiguousarray(x, np.float32))
    B = torch.from_numpy(np.ascontiguousarray(np.broadcast_to(baseline, x.shape), np.float32))
    if first is not None:
        with torch.no_grad():
            Zx, Zb = X @ first.weight.T + first.bias, B @ first.weight.T + first.bias
    else:
        Zx, Zb = X, B
    attr = np.zeros(x.shape, np.float32)
    per = max(1, max_rows // steps)
    for a in range(0, len(X), per):
        zx, zb = Zx[a : a + per], Zb[a : a + per]
        path = (zb.unsqueeze(1) + alpha[None, :, None] * (zx - zb).unsqueeze(1)).reshape(-1, Zx.shape[1])
        path.requires_grad_(True)
        (grad,) = torch.autograd.grad(fn(path).sum(), path)
        avg = (grad.view(len(zx), steps, -1) * w[None, :, None]).sum(1)
        if first is not None:
            avg = avg @ first.weight
        attr[a : a + per] = ((X[a : a + per] - B[a : a + per]) * avg).numpy()
    with torch.no_grad():
        fx = np.concatenate([fn(Zx[a : a + max_rows]).numpy() for a in range(0, len(X), max_rows)] or [[]])
        fb = np.concatenate([fn(Zb[a : a + max_rows]).numpy() for a in range(0, len(B), max_rows)] or [[]])
    return attr, fx.astype(np.float64), fb.astype(np.float64)


def refined_gradients(
    fn: Callable[[torch.Tensor], torch.Tensor],
    x: np.ndarray,
    baseline: np.ndarray,
    steps: int = DEFAULT_STEPS,
    first: Affine | None = None,
    max_steps: int = MAX_STEPS,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """integrated_gradients, then rows whose completeness gap exceeds GAP_TOLERANCE (absolute, plus relative
    to |f(x) - f(baseline)|) again with twice the steps, up to max_steps. Returns (A, f(x), f(x'), steps)."""
    base = np.broadcast_to(baseline, x.shape)
    A, fx, fb = integrated_gradients(fn, x, base, steps, first)
    used = np.full(len(x), steps)
    while steps < max_steps:
        bad = np.flatnonzero(
            np.abs(fx - fb - A.sum(1, dtype=np.float64)) > GAP_TOLERANCE * (1 + np.abs(fx - fb))
        )
        if not len(bad):
            break
        steps *= 2
        A[bad] = integrated_gradients(fn, x[bad], base[bad], steps, first)[0]
        used[bad] = steps
    return A, fx, fb, used


def baseline_features(
    kind: str, cache: EventCache, m: Model, entity: np.ndarray, times: np.ndarray
) -> np.ndarray:
    """The baseline: [dim] (mean) or [n, dim] (empty: each entity with no events, attributes kept)."""
    if kind == "mean":
        return m.model.trunk.mean.detach().cpu().numpy().astype(np.float32)
    before_data = np.full(len(entity), epoch_seconds(cache.min_date), np.int64)  # no event has ts < this
    return m.enc.history(cache, entity, before_data)


class Explainer:
    """Accumulates attributions of entity chunks per source, column, value and feature."""

    def __init__(self, cache: EventCache, enc: FeatureEncoder) -> None:
        self.cache, self.enc = cache, enc
        self.features = describe(enc, cache)
        self.vocab = Vocabularies(cache)
        self.sources_keys, self.source_idx = index_keys([(f.group,) for f in self.features])
        self.column_keys, self.column_idx = index_keys([(f.group, f.column) for f in self.features])
        own = [f.group != ATTRIBUTES and f.kind in OWN_VALUE_KINDS for f in self.features]
        value_keys, value_idx = index_keys(
            [(f.group, f.column, f.value) if v else ("",) for f, v in zip(self.features, own, strict=True)]
        )
        self.value_idx = np.where(own, value_idx, -1)
        self.levels = {
            "sources": Totals.new(self.sources_keys),
            "columns": Totals.new(self.column_keys),
            "values": Totals.new(value_keys),
            "features": Totals.new([(str(f.index),) for f in self.features]),
        }
        bases, H = enc.source_offsets(), len(enc.half_lives_days)
        self.tables: list[ValueTable] = [
            HashedValues(s.name, c, bases[s.name], s.channels, H)
            for s in enc.sources
            for c in s.columns
            if c.kind == "hashed"
        ]
        self.tables += [
            AttributeValues(
                ATTRIBUTES, c.name, c.vocab_size, np.arange(c.width) + enc.attribute_offset + c.offset
            )
            for c in enc.attributes
            if c.kind == "direct"
        ]
        self.n = 0

    def add(self, A: np.ndarray, e: np.ndarray, t: np.ndarray) -> None:
        """Attributions A [n, dim] of entities e (indices) as of times t (epoch seconds)."""
        A = A.astype(np.float64)
        self.n += len(A)
        self.levels["sources"].add(group_sum(A, self.source_idx, len(self.sources_keys)))
        self.levels["columns"].add(group_sum(A, self.column_idx, len(self.column_keys)))
        self.levels["values"].add(group_sum(A, self.value_idx, len(self.levels["values"].keys)))
        self.levels["features"].add(A)
        for table in self.tables:
            table.add(self.cache, self.enc, A, e, t)

    # ---- results -------------------------------------------------------------------------------
    def _rows(
        self, keys: list[tuple[str, ...]], abs_sum: np.ndarray, total: np.ndarray, names: tuple
    ) -> list:
        n = max(self.n, 1)
        rows = []
        for k in np.argsort(-abs_sum, kind="stable"):
            if abs_sum[k] == 0:
                break
            row: dict[str, Any] = dict(zip(names, keys[k], strict=True))
            if self.n == 1:
                row["attribution"] = float(total[k])
            else:
                row["mean_abs_attribution"] = float(abs_sum[k] / n)
                row["mean_attribution"] = float(total[k] / n)
            rows.append(row)
        return rows

    def _values(self) -> list[dict[str, Any]]:
        names = ("source", "column", "value")
        lv = self.levels["values"]
        rows = self._rows(lv.keys, lv.abs_sum, lv.sum, names)
        for vt in self.tables:
            top = np.argsort(-vt.abs_sum, kind="stable")[:TOP_VALUES_PER_COLUMN]
            keys = [
                (
                    vt.group,
                    vt.column,
                    OTHER_BUCKETS if c == len(vt.sum) - 1 else self.vocab.label(vt.group, vt.column, c),
                )
                for c in top
            ]
            rows += self._rows(keys, vt.abs_sum[top], vt.sum[top], names)
        score = "attribution" if self.n == 1 else "mean_abs_attribution"
        rows.sort(key=lambda r: -abs(r[score]))
        per_column: dict[tuple[str, str], int] = {}
        kept = []
        for r in rows:
            k = (r["source"], r["column"])
            per_column[k] = per_column.get(k, 0) + 1
            if per_column[k] <= TOP_VALUES_PER_COLUMN:
                kept.append(r)
        return kept

    def result(self) -> dict[str, Any]:
        lv = self.levels
        features = self._rows(lv["features"].keys, lv["features"].abs_sum, lv["features"].sum, ("index",))
        for row in features[:TOP_FEATURES]:
            f = self.features[int(row["index"])]
            row.update(
                index=f.index,
                source=f.group,
                column=f.column,
                value=f.value,
                half_life_days=f.half_life_days,
                kind=f.kind,
            )
        return {
            "sources": self._rows(lv["sources"].keys, lv["sources"].abs_sum, lv["sources"].sum, ("source",)),
            "columns": self._rows(
                lv["columns"].keys, lv["columns"].abs_sum, lv["columns"].sum, ("source", "column")
            ),
            "values": self._values(),
            "features": features[:TOP_FEATURES],
        }


# ---- explanations -------------------------------------------------------------------------------------
@dataclass
class Model:
    """A scenario model with its encoder and head."""

    model: TrunkWithHead
    enc: FeatureEncoder
    task: Task
    meta: CheckpointMeta | None = None  # None: a model not yet published (the report's explanation)

    @classmethod
    def load(cls, checkpoint: Path) -> Model:
        model, meta, task = load_scenario(checkpoint)
        return cls(model, FeatureEncoder.from_dict(meta.encoder), task, meta)


def explain(
    cache: EventCache,
    m: Model,
    entity: np.ndarray,
    times: np.ndarray,
    label: str | None = None,
    steps: int = DEFAULT_STEPS,
    baseline: str = "mean",
    X: np.ndarray | None = None,
    chunk: int = 4096,
) -> dict[str, Any]:
    """Explanation of entities (indices) as of times (epoch seconds): one entity, or a population summary.

    X: their features when already computed. Returns the JSON-ready dict (see docs/explain.md)."""
    if baseline not in BASELINES:
        raise ArgumentError("baseline", repr(baseline), f"choose one of {', '.join(BASELINES)}")
    started = time.perf_counter()
    entity, times = np.asarray(entity, np.int64), np.asarray(times, np.int64)
    if X is None:
        X = m.enc.history(cache, entity, times)
    training = m.model.training
    m.model.eval()
    try:
        scores = m.task.scores(runtime.predict(m.model, X, torch.device("cpu"), amp=None))
        out = choose_output(m.task, label, scores if m.task.per_class else None)
        ex = Explainer(cache, m.enc)
        base = baseline_features(baseline, cache, m, entity, times)
        first, rest = out.split(m.model)
        fx, fb, gap, steps_used = [], [], [], []
        for a in range(0, len(X), chunk):
            b = base if base.ndim == 1 else base[a : a + chunk]
            A, f_x, f_b, used = refined_gradients(rest, X[a : a + chunk], b, steps, first)
            steps_used.append(used)
            ex.add(A, entity[a : a + chunk], times[a : a + chunk])
            fx.append(f_x)
            fb.append(f_b)
            gap.append(f_x - f_b - A.astype(np.float64).sum(1))
    finally:
        m.model.train(training)
    f_x, f_b, g = np.concatenate(fx), np.concatenate(fb), np.concatenate(gap)
    score = np.asarray(scores)
    if score.ndim == 2:
        score = score[:, out.index]
    result: dict[str, Any] = {
        "task": m.task.name,
        "output": {"description": out.description, "class": out.label, "index": out.index},
        "baseline": {"kind": baseline, "output": float(f_b.mean())},
        "steps": {"initial": steps, "max_used": int(np.concatenate(steps_used).max())},
        "entities": len(entity),
        **ex.result(),
    }
    if len(entity) == 1:
        result["output"].update(value=float(f_x[0]), score=float(score[0]))
        result["completeness"] = {
            "output": float(f_x[0]),
            "baseline_output": float(f_b[0]),
            "sum_of_attributions": float(f_x[0] - f_b[0] - g[0]),
            "gap": float(g[0]),
        }
    else:
        result["output"].update(mean_value=float(f_x.mean()), mean_score=float(score.mean()))
        result["completeness"] = {
            "mean_abs_gap": float(np.abs(g).mean()),
            "max_abs_gap": float(np.abs(g).max()),
            "mean_abs_output_change": float(np.abs(f_x - f_b).mean()),
        }
    result["seconds"] = round(time.perf_counter() - started, 2)
    return result


def sample_entities(n_entities: int, n: int, seed: int = 0) -> np.ndarray:
    """A sorted, seeded sample of min(n, n_entities) entity indices."""
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n_entities, min(n, n_entities), replace=False)).astype(np.int64)
