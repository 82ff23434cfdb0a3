"""Attributions summed by level, for inference/explain.py: per-entity totals of sources, columns, values and
features (Totals), and the value tables of columns whose values are not features of their own: a categorical
attribute's own value (AttributeValues), a hashed column's values sharing its buckets (HashedValues)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from basemodel_pipeline.cache.store import EventCache, expand_ranges
from basemodel_pipeline.dates import DAY
from basemodel_pipeline.features.names import bucket_codes
from basemodel_pipeline.features.sketch import ColumnPlan, FeatureEncoder

OTHER_BUCKETS = "(buckets without the entity's values)"


@dataclass
class Totals:
    """Per-entity signed totals of one level, accumulated as sums of |total| and of total."""

    keys: list[tuple[str, ...]]
    abs_sum: np.ndarray
    sum: np.ndarray

    @classmethod
    def new(cls, keys: list[tuple[str, ...]]) -> Totals:
        return cls(keys, np.zeros(len(keys)), np.zeros(len(keys)))

    def add(self, totals: np.ndarray) -> None:  # totals [n, len(keys)]
        self.abs_sum += np.abs(totals).sum(0)
        self.sum += totals.sum(0)


def index_keys(keys: list[tuple[str, ...]]) -> tuple[list[tuple[str, ...]], np.ndarray]:
    """Distinct keys in first-seen order and the position of each key among them."""
    order: dict[tuple[str, ...], int] = {}
    idx = np.array([order.setdefault(k, len(order)) for k in keys], np.int64)
    return list(order), idx


def group_sum(A: np.ndarray, idx: np.ndarray, size: int) -> np.ndarray:
    """[n, size]: A's columns summed by idx (columns with idx < 0 are dropped)."""
    M = np.zeros((A.shape[1], size))
    keep = np.flatnonzero(idx >= 0)
    M[keep, idx[keep]] = 1.0
    return A @ M


class ValueTable:
    """Value attributions of one column whose values are not features of their own: codes 0..V, then the
    OTHER_BUCKETS slot V + 1 (hashed columns: buckets the entity never used)."""

    def __init__(self, group: str, column: str, vocab_size: int, features: np.ndarray) -> None:
        self.group, self.column = group, column
        self.features = features  # the column's input indices
        self.abs_sum = np.zeros(vocab_size + 2)
        self.sum = np.zeros(vocab_size + 2)

    def accumulate(
        self, owner: np.ndarray, code: np.ndarray, contrib: np.ndarray, column: np.ndarray
    ) -> None:
        """contrib [m] of (entity owner, value code) pairs; column [n]: each entity's column total."""
        width = len(self.sum)
        keys, inverse = np.unique(owner * width + code, return_inverse=True)
        per_value = np.bincount(inverse, weights=contrib, minlength=len(keys))
        np.add.at(self.abs_sum, keys % width, np.abs(per_value))
        np.add.at(self.sum, keys % width, per_value)
        other = column - np.bincount(owner, weights=contrib, minlength=len(column))
        self.abs_sum[-1] += np.abs(other).sum()
        self.sum[-1] += other.sum()

    def add(
        self, cache: EventCache, enc: FeatureEncoder, A: np.ndarray, e: np.ndarray, t: np.ndarray
    ) -> None:
        raise NotImplementedError


class AttributeValues(ValueTable):
    """A categorical attribute: the whole column's attribution goes to the entity's own value (its one-hot
    moved from the baseline's to that value's channel)."""

    def add(
        self, cache: EventCache, enc: FeatureEncoder, A: np.ndarray, e: np.ndarray, t: np.ndarray
    ) -> None:
        column = A[:, self.features].sum(1)
        code = np.asarray(cache.attributes[self.column], np.int64)[e].clip(0, len(self.sum) - 2)
        self.accumulate(np.arange(len(e)), code, column, column)


class HashedValues(ValueTable):
    """A hashed column: each bucket's attribution at each half-life split among the entity's values in it in
    proportion to their decayed event counts, summed over partitions."""

    def __init__(self, group: str, plan: ColumnPlan, base: int, channels: int, half_lives: int) -> None:
        C, PW = channels, plan.partitions * plan.buckets
        feats = np.array([base + h * C + plan.offset + k for h in range(half_lives) for k in range(PW)])
        super().__init__(group, plan.name, plan.vocab_size, feats)
        self.plan, self.base, self.channels = plan, base, channels
        self.table = bucket_codes(plan)  # [P, V + 1] channel within the column

    def add(
        self, cache: EventCache, enc: FeatureEncoder, A: np.ndarray, e: np.ndarray, t: np.ndarray
    ) -> None:
        src, col, n = cache.source(self.group), self.plan, len(e)
        owner, rows = expand_ranges(np.asarray(src.offsets)[e], src.positions(e, t))
        code = np.asarray(src.columns[col.name][rows], np.int64)
        age = (t[owner] - np.asarray(src.ts[rows], np.int64)).astype(np.float64)
        contrib = np.zeros(len(rows))
        PW = col.partitions * col.buckets
        for h, half_life in enumerate(enc.half_lives_days):
            w = np.exp(-age * np.log(2.0) / (half_life * DAY))
            for p in range(col.partitions):
                key = owner * PW + self.table[p, code]
                mass = np.bincount(key, weights=w, minlength=n * PW)
                feature = self.base + h * self.channels + col.offset + self.table[p, code]
                contrib += A[owner, feature] * w / np.maximum(mass[key], 1e-300)
        self.accumulate(owner, code, contrib, A[:, self.features].sum(1))
