"""Recommendation: which items next, ranked over the whole catalogue?

    dense    a softmax over the catalogue, cross-entropy against the window's item distribution
    sketch   (large catalogues) P hash partitions x W buckets, a softmax per partition trained on the hashed
             item distribution, decoded per item as the geometric mean over partitions of
             P(bucket) * pop(item) / pop(bucket) (popularity-corrected, EMDE-style)

Biases start at the log item popularity (log bucket mass for the sketch). Scores can add the entity's own
purchase history: weight * log1p(time-decayed count) per item, with the weight chosen on the validation set
(0 = the model alone), a hybrid of the model and "repeat what they bought" that the baseline comparison keeps
honest. Outputs are ranked items (``top_items``), judged by NDCG@10; the candidates are the ranking ones of
candidates/rerank.py. The predictions table holds a row per (entity, rank)."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import Scenario
from basemodel_pipeline.dates import DAY
from basemodel_pipeline.evaluation import metrics
from basemodel_pipeline.targets.columns import class_values
from basemodel_pipeline.targets.events import window_events
from basemodel_pipeline.targets.labels import (
    Examples,
    Labels,
    SparseLabels,
    TargetDetails,
    TargetSpec,
    dense_labels,
)
from basemodel_pipeline.targets.windows import candidate_pairs
from basemodel_pipeline.tasks.base import Task, register

Bonus = tuple[np.ndarray, np.ndarray, np.ndarray]  # (row, item, decayed count) of the entities' own history
REPEAT_HALF_LIFE_DAYS = 30.0
REPEAT_WEIGHTS = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)  # tried on validation
RANKED_ITEMS = 100  # items ranked per entity for the metrics (MRR over this list)


class RecommendationDetails(TargetDetails):
    """A recommendation spec's details: the catalogue, the head's layout and what ranking adds to the network.
    ``items`` and ``popularity`` (one entry per item) are stored in the checkpoint's target.json."""

    n_items: int  # the catalogue: item code k (1-based in the cache) is output k - 1
    head: Literal["dense", "sketch"] = "dense"
    partitions: int = 4  # sketch: P hash partitions of `width` buckets, hashed with `seed`
    width: int = 2048
    seed: int = 12345
    popularity: list[int]  # [n_items] training target counts
    source: str = ""  # where the items are: the target's source and column
    column: str = ""
    items: list[str] = []  # item names: output k -> items[k]
    repeat_weight: float | None = (
        None  # weight of the entity's own history in the scores (tuned on validation)
    )
    repeat_half_life_days: float = REPEAT_HALF_LIFE_DAYS  # half-life of that history's decayed counts


def sketch_table(d: RecommendationDetails) -> np.ndarray:
    """[P, n_items] global output index (p * W + bucket) of each item in each partition."""
    rng = np.random.default_rng(d.seed)
    table = rng.integers(0, d.width, size=(d.partitions, d.n_items))
    return (table + np.arange(d.partitions)[:, None] * d.width).astype(np.int64)


def window_items(cache: EventCache, scenario: Scenario, times: np.ndarray) -> Examples:
    """Items of the window as a distribution per example (weights sum to 1); examples without items dropped."""
    target = scenario.target
    src = cache.source(target.source)
    e, t = candidate_pairs(cache, scenario, times)
    owner, rows = window_events(cache, scenario, e, t)
    ts = np.asarray(src.ts)[rows]
    if target.next_basket:  # only the first active (UTC) day of each example's window
        day = ts // DAY
        first_day = np.full(len(e), np.iinfo(np.int64).max)
        np.minimum.at(first_day, owner, day)
        keep = day == first_day[owner]
        owner, rows, ts = owner[keep], rows[keep], ts[keep]
    size = src.info[target.column].vocab_size + 1
    code = np.asarray(src.columns[target.column])[rows].astype(np.int64)
    keep = code > 0
    owner, code, ts = owner[keep], code[keep], ts[keep]
    # first appearance of each (example, item): rows are time-ordered within an example
    key = owner * size + code
    _, first = np.unique(key, return_index=True)
    first.sort()
    owner, code, ts = owner[first], code[first], ts[first]
    if target.items != "all":
        h_owner, h_rows = src.window_rows(e, src.offsets[e], t)
        h_key = np.unique(h_owner * size + np.asarray(src.columns[target.column])[h_rows].astype(np.int64))
        seen = np.isin(owner * size + code, h_key)
        keep = ~seen if target.items == "new" else seen
        owner, code, ts = owner[keep], code[keep], ts[keep]
    if target.decay == "sequential":
        start = np.r_[0, np.cumsum(np.bincount(owner, minlength=len(e)))[:-1]]
        weight = target.gamma ** (np.arange(len(owner)) - start[owner])
    elif target.decay == "time":
        weight = 0.5 ** ((ts - t[owner]) / DAY / target.decay_half_life_days)
    else:
        weight = np.ones(len(owner))
    total = np.bincount(owner, weights=weight, minlength=len(e))
    has = total > 0
    remap = np.cumsum(has) - 1
    labels = SparseLabels.from_pairs(remap[owner], code - 1, weight / total[owner], int(has.sum()), size - 1)
    return Examples(e[has], t[has], labels)


@register
class Recommendation(Task):
    name = "recommendation"
    primary_metric = "ndcg@10"
    ranked = True
    charts = "ranking"
    details = RecommendationDetails

    def __init__(self, spec: TargetSpec) -> None:
        super().__init__(spec)
        self.d: RecommendationDetails = spec.details  # type: ignore[assignment]  # checked by Task
        self.sketch = self.d.head == "sketch"
        pop = np.asarray(self.d.popularity, np.float64) + 1.0
        self.log_pop = torch.from_numpy(np.log(pop / pop.sum()).astype(np.float32))
        if self.sketch:
            self.table = torch.from_numpy(sketch_table(self.d))
            mass = np.zeros(self.out_dim)
            for p in range(self.table.shape[0]):
                np.add.at(mass, self.table[p].numpy(), pop)
            mass = mass / mass.reshape(self.table.shape[0], -1).sum(1).repeat(self.d.width)
            self.log_mass = torch.from_numpy(np.log(np.maximum(mass, 1e-12)).astype(np.float32))

    @property
    def out_dim(self) -> int:
        d = self.d
        return d.n_items if d.head == "dense" else d.partitions * d.width

    def truth(self, labels: Labels) -> tuple[np.ndarray, np.ndarray, int]:
        """The relevant items as CSR arrays (indptr, indices, n_items)."""
        assert isinstance(labels, SparseLabels)
        return (labels.indptr, labels.indices, labels.n_cols)

    # ---- target -> labels ----------------------------------------------------------------------------
    @classmethod
    def choose_spec(cls, cache: EventCache, scenario: Scenario, train_times: np.ndarray) -> TargetSpec:
        """The whole catalogue (the column's values), its training popularity and the head's layout."""
        target, values = scenario.target, class_values(cache, scenario)
        ex = window_items(cache, scenario, train_times)
        assert isinstance(ex.labels, SparseLabels)
        n_items = len(values) - 1
        pop = np.bincount(ex.labels.indices, minlength=n_items).astype(np.float64)
        details = RecommendationDetails(
            n_items=n_items,
            head="dense" if n_items <= target.dense_max_items else "sketch",
            partitions=target.sketch_partitions,
            width=target.sketch_width,
            popularity=pop.astype(int).tolist(),
            source=target.source,
            column=target.column,
            items=[str(v) for v in values[1:]],
        )
        return TargetSpec(cls.name, [], [], details)

    def examples(self, cache: EventCache, scenario: Scenario, times: np.ndarray) -> Examples:
        return window_items(cache, scenario, times)

    # ---- labels -> targets ---------------------------------------------------------------------------
    def init_bias(self, head: nn.Linear, labels: Labels) -> None:
        with torch.no_grad():
            head.bias.copy_(self.log_mass if self.sketch else self.log_pop)

    def targets(self, labels: Labels, idx: np.ndarray) -> torch.Tensor:
        """The item distribution [len(idx), n_items], or its hashed mass per bucket (sketch)."""
        if not self.sketch:
            y = dense_labels(labels, idx)
            return torch.from_numpy(np.ascontiguousarray(y.reshape(len(idx), -1), dtype=np.float32))
        assert isinstance(labels, SparseLabels)
        part = labels.rows(idx)
        owner = np.repeat(np.arange(len(idx)), np.diff(part.indptr))
        out = torch.zeros(len(idx), self.out_dim)
        cols = self.table[:, torch.from_numpy(part.indices)]  # [P, nnz]
        vals = torch.from_numpy(part.values)
        own = torch.from_numpy(owner)
        for p in range(cols.shape[0]):
            out.index_put_((own, cols[p]), vals, accumulate=True)
        return out

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.sketch:
            P = self.table.shape[0]
            lp = torch.log_softmax(logits.view(len(logits), P, -1), -1).view(len(logits), -1)
            return -(target * lp).sum(1).mean() / P
        return -(target * torch.log_softmax(logits, -1)).sum(1).mean()

    # ---- decoding ------------------------------------------------------------------------------------
    def scores(self, logits: np.ndarray) -> np.ndarray:
        raise ValueError("recommendation outputs are ranked items: use top_items")

    def network_outputs(self, logits: np.ndarray) -> np.ndarray:
        return self.top_items(logits, RANKED_ITEMS)[0]

    @torch.no_grad()
    def item_scores(self, logits: torch.Tensor) -> torch.Tensor:
        """[n, n_items] log-scores of every item."""
        if not self.sketch:
            return torch.log_softmax(logits, -1)
        P = self.table.shape[0]
        lp = torch.log_softmax(logits.view(len(logits), P, -1), -1).view(len(logits), -1) - self.log_mass
        return lp[:, self.table].mean(1) + self.log_pop

    @torch.no_grad()
    def top_items(
        self,
        logits: np.ndarray,
        k: int,
        chunk: int = 128,
        history: Bonus | None = None,
        weight: float | None = None,
        exclude: Bonus | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(item indices [n, k] best first, their scores) over the whole catalogue, `chunk` rows at a time.

        `history` (row, item, decayed count), sorted by row: the entity's own past items; each adds
        weight * log1p(count) to the item's score (weight: the spec's ``repeat_weight`` unless given).
        `exclude` (the same form): items never ranked for that row (``items: new`` targets)."""
        k = min(k, self.d.n_items)
        w = (self.d.repeat_weight or 0.0) if weight is None else weight
        items, scores = [], []
        for a in range(0, len(logits), chunk):
            s = self.item_scores(torch.from_numpy(np.asarray(logits[a : a + chunk], np.float32)))
            if history is not None and w > 0:
                row, item, count = history
                lo, hi = np.searchsorted(row, [a, a + chunk])
                bonus = torch.from_numpy((w * np.log1p(count[lo:hi])).astype(np.float32))
                s.index_put_(
                    (torch.from_numpy(row[lo:hi] - a), torch.from_numpy(item[lo:hi])), bonus, accumulate=True
                )
            if exclude is not None:
                row, item, _ = exclude
                lo, hi = np.searchsorted(row, [a, a + chunk])
                s[torch.from_numpy(row[lo:hi] - a), torch.from_numpy(item[lo:hi])] = -torch.inf
            top = torch.topk(s, k, dim=1)
            items.append(top.indices.numpy())
            scores.append(top.values.numpy())
        if not items:
            return np.zeros((0, k), np.int64), np.zeros((0, k), np.float32)
        return np.concatenate(items), np.concatenate(scores)

    # ---- metrics -------------------------------------------------------------------------------------
    @classmethod
    def evaluate(cls, y: Any, score: Any, k: int = 10, log1p: bool = False) -> dict[str, float]:
        """``y`` = (indptr, indices, n_items) of the relevant items, ``score`` = ranked items [n, K]."""
        indptr, indices, n_items = y
        hits = metrics.ranking_hits(score, indptr, indices, n_items)
        return metrics.ranking_metrics(hits, np.diff(indptr), tuple(sorted({k, 10, 20})))

    # ---- outputs -------------------------------------------------------------------------------------
    def output_table(
        self, ids: np.ndarray, as_of: dt.date, out: Any, top_k: int | None, threshold: float | None
    ) -> pa.Table:
        """A row per (entity, rank); a list shorter than k (few eligible items) ends in -1: not written."""
        items, scores = out
        names = np.array(self.d.items, dtype=object)
        k = items.shape[1]
        valid = items.ravel() >= 0
        return pa.table(
            {
                "entity_id": np.repeat(ids, k)[valid],
                "as_of": pa.array([as_of] * int(valid.sum()), pa.date32()),
                "rank": np.tile(np.arange(1, k + 1, dtype=np.int32), len(ids))[valid],
                "item": names[items.ravel()[valid]],
                "score": scores.ravel()[valid],
            }
        )

    def empty_outputs(self, top_k: int) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros((0, top_k), np.int64), np.zeros((0, top_k), np.float32)
