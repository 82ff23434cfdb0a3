"""Task heads: losses, bias initialisation and output decoding of the five task types.

Every head is the scenario model's linear layer (TrunkWithHead.head); only its width, loss and decoding
differ:

    binary, multilabel   sigmoid per output, binary cross-entropy (labels densified per mini-batch, so
                         thousands of classes cost memory only per batch)
    multiclass           softmax, cross-entropy
    regression           one output, MSE on the standardised target (mean/std of the training labels); for
                         a non-negative target that is often zero (spend), a hurdle: two outputs, the
                         probability of any amount (cross-entropy) and the standardised amount when there is
                         one (MSE on those rows); the prediction is their product, the expected amount.
                         Every regression output stays within the training labels' range.
    recommendation       dense: softmax over the catalogue, cross-entropy against the item distribution;
                         sketch (large catalogues): P hash partitions x W buckets, a softmax per partition
                         trained on the hashed item distribution, decoded per item as the geometric mean over
                         partitions of P(bucket) * pop(item) / pop(bucket) (popularity-corrected, EMDE-style)

Recommendation scores can add the entity's own purchase history: weight * log1p(time-decayed count) per
item, with the weight chosen on the validation set (0 = the model alone), a hybrid of the model and
"repeat what they bought" that the baseline comparison keeps honest.

Biases start at the training prior (log-odds of each label, log class frequencies, log bucket mass), which
matters with thousands of rare labels: the head starts at the base rate instead of p = 0.5.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.evaluation.baselines import decayed_history_items
from basemodel_pipeline.scenarios.examples import Examples, Labels, SparseLabels, TargetSpec, dense_labels

Bonus = tuple[np.ndarray, np.ndarray, np.ndarray]  # (row, item, decayed count) of the entities' own history
REPEAT_HALF_LIFE_DAYS = 30.0
REPEAT_WEIGHTS = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)  # tried on validation (recommendation)


def own_history(cache: EventCache, spec: TargetSpec, ex: Examples) -> Bonus | None:
    """Recommendation: each example's own past items (decayed counts), for the hybrid score."""
    if spec.task != "recommendation":
        return None
    src = cache.source(spec.extra["source"])
    half_life = spec.extra.get("repeat_half_life_days", REPEAT_HALF_LIFE_DAYS)
    return decayed_history_items(src, spec.extra["column"], ex.entity, ex.time, half_life)


def sketch_table(spec: TargetSpec) -> np.ndarray:
    """[P, n_items] global output index (p * W + bucket) of each item in each partition."""
    e = spec.extra
    rng = np.random.default_rng(e["seed"])
    table = rng.integers(0, e["width"], size=(e["partitions"], e["n_items"]))
    return (table + np.arange(e["partitions"])[:, None] * e["width"]).astype(np.int64)


class Head:
    """Loss and decoding of one scenario's outputs."""

    def __init__(self, spec: TargetSpec) -> None:
        self.spec = spec
        self.task = spec.task
        self.sketch = self.task == "recommendation" and spec.extra["head"] == "sketch"
        self.hurdle = self.task == "regression" and bool(spec.extra.get("hurdle"))
        if self.task == "recommendation":
            pop = np.asarray(spec.extra["popularity"], np.float64) + 1.0
            self.log_pop = torch.from_numpy(np.log(pop / pop.sum()).astype(np.float32))
            if self.sketch:
                self.table = torch.from_numpy(sketch_table(spec))
                mass = np.zeros(spec.out_dim)
                for p in range(self.table.shape[0]):
                    np.add.at(mass, self.table[p].numpy(), pop)
                mass = mass / mass.reshape(self.table.shape[0], -1).sum(1).repeat(spec.extra["width"])
                self.log_mass = torch.from_numpy(np.log(np.maximum(mass, 1e-12)).astype(np.float32))

    # ---- training ------------------------------------------------------------------------------
    def init_bias(self, head: nn.Linear, labels: Labels) -> None:
        with torch.no_grad():
            if self.task in ("binary", "multilabel"):
                y = dense_labels(labels) if not isinstance(labels, SparseLabels) else None
                if y is None:
                    assert isinstance(labels, SparseLabels)
                    prev = np.bincount(labels.indices, minlength=labels.n_cols) / max(len(labels), 1)
                else:
                    prev = y.reshape(len(y), -1).mean(0)
                prev = np.clip(prev, 1e-4, 1 - 1e-4)
                head.bias.copy_(torch.from_numpy(np.log(prev / (1 - prev)).astype(np.float32)))
            elif self.task == "multiclass":
                freq = np.bincount(np.asarray(labels, np.int64), minlength=head.out_features) + 1.0
                head.bias.copy_(torch.from_numpy(np.log(freq / freq.sum()).astype(np.float32)))
            elif self.task == "recommendation":
                head.bias.copy_(self.log_mass if self.sketch else self.log_pop)
            else:
                head.bias.zero_()
                if self.hurdle:
                    share = float(np.clip(self.spec.extra["positive_share"], 1e-4, 1 - 1e-4))
                    head.bias[0] = float(np.log(share / (1 - share)))

    def targets(self, labels: Labels, idx: np.ndarray) -> torch.Tensor:
        """Training targets of rows `idx` as a tensor."""
        if self.task == "multiclass":
            return torch.from_numpy(np.asarray(labels, np.int64)[idx])
        if self.task == "regression":
            e = self.spec.extra
            y = np.asarray(labels, np.float32)[idx]
            if self.hurdle:
                pos = y > 0
                amount = np.where(pos, (y - e["positive_mean"]) / e["positive_std"], 0.0)
                return torch.from_numpy(np.stack([pos, amount], 1).astype(np.float32))
            return torch.from_numpy(((y - e["mean"]) / e["std"]).astype(np.float32)[:, None])
        if self.sketch:
            assert isinstance(labels, SparseLabels)
            part = labels.rows(idx)
            owner = np.repeat(np.arange(len(idx)), np.diff(part.indptr))
            out = torch.zeros(len(idx), self.spec.out_dim)
            cols = self.table[:, torch.from_numpy(part.indices)]  # [P, nnz]
            vals = torch.from_numpy(part.values)
            own = torch.from_numpy(owner)
            for p in range(cols.shape[0]):
                out.index_put_((own, cols[p]), vals, accumulate=True)
            return out
        y = dense_labels(labels, idx)
        return torch.from_numpy(np.ascontiguousarray(y.reshape(len(idx), -1), dtype=np.float32))

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.task in ("binary", "multilabel"):
            return nn.functional.binary_cross_entropy_with_logits(logits, target)
        if self.task == "multiclass":
            return nn.functional.cross_entropy(logits, target)
        if self.task == "regression":
            if not self.hurdle:
                return nn.functional.mse_loss(logits, target)
            pos = target[:, 0]
            any_amount = nn.functional.binary_cross_entropy_with_logits(logits[:, 0], pos)
            amount = ((logits[:, 1] - target[:, 1]) ** 2 * pos).sum() / pos.sum().clamp_min(1.0)
            return any_amount + amount
        if self.sketch:
            P = self.table.shape[0]
            lp = torch.log_softmax(logits.view(len(logits), P, -1), -1).view(len(logits), -1)
            return -(target * lp).sum(1).mean() / P
        return -(target * torch.log_softmax(logits, -1)).sum(1).mean()

    # ---- outputs -------------------------------------------------------------------------------
    def clip(self, values: np.ndarray) -> np.ndarray:
        """Regression values within the training labels' range (spec.extra min / max, when known)."""
        lo, hi = self.spec.extra.get("min"), self.spec.extra.get("max")
        return np.clip(values, -np.inf if lo is None else lo, np.inf if hi is None else hi)

    def scores(self, logits: np.ndarray) -> np.ndarray:
        """Metric-ready outputs: probabilities [n] / [n, C], values [n] (regression)."""
        if self.task in ("binary", "multilabel"):
            p = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
            return p[:, 0] if self.task == "binary" else p
        if self.task == "multiclass":
            z = logits - logits.max(1, keepdims=True)
            ez = np.exp(z.astype(np.float64))
            return ez / ez.sum(1, keepdims=True)
        if self.task == "regression":
            e, z = self.spec.extra, logits.astype(np.float64)
            if self.hurdle:
                p = 1.0 / (1.0 + np.exp(-z[:, 0]))
                amount = np.clip(z[:, 1] * e["positive_std"] + e["positive_mean"], 0.0, e.get("max", np.inf))
                return self.clip(p * amount)
            return self.clip(z[:, 0] * e["std"] + e["mean"])
        raise ValueError("recommendation outputs are ranked items: use top_items")

    @torch.no_grad()
    def item_scores(self, logits: torch.Tensor) -> torch.Tensor:
        """[n, n_items] log-scores of every item (recommendation)."""
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
        k = min(k, self.spec.extra["n_items"])
        w = self.spec.extra.get("repeat_weight", 0.0) if weight is None else weight
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
