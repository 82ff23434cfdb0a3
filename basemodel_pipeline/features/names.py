"""What every input feature of a FeatureEncoder means: source, column, value, half-life.

The input layout (features/sketch.py) is, in order:

    per event source s:  channels(s) x half-lives decayed sums, index h * channels(s) + c
                         then 4 extras: log count, log recency days, log tenure days, has history
    main-entity attributes: one-hot per categorical attribute (code 0 = missing), one value per numeric one
    automatic aggregates (features/aggregates.py), named by aggregates.feature_names(cache)

Channels of a source: 0 = the event count, then each column's block (ColumnPlan offset/width): numeric 1,
direct vocab_size + 1 (code k; 0 = missing), hashed P x W sketch buckets (partition p, bucket b at
p * W + b), fourier 2 x scales (sin then cos), weekday 7 (Monday first), hour 24 / HOUR_BIN.

A hashed column's buckets mix several values; ``bucket_codes`` gives the bucket of every value in every
partition so that an explanation can split a bucket's attribution among the values that fell into it
(inference/explain.py). Only the encoder's public attributes and the cache's vocabularies are used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow.parquet as pq

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.features.aggregates import feature_names as aggregate_names
from basemodel_pipeline.features.sketch import HOUR_BIN, ColumnPlan, FeatureEncoder

ATTRIBUTES = "attributes"
AGGREGATES = "aggregates"
COUNT_COLUMN = "event count"  # channel 0 of every source: the decayed number of events
EXTRAS = ("log count", "log recency days", "log tenure days", "has history")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MISSING = "(missing)"


@dataclass(frozen=True)
class Feature:
    """One input feature of the encoder."""

    index: int
    group: str  # event source name | "attributes" | "aggregates"
    column: str  # column name; COUNT_COLUMN, one of EXTRAS, or the aggregate's name
    value: str  # value label ("" for numeric features); hashed: "partition p bucket b"
    half_life_days: float | None  # decayed sums only
    kind: str  # count | numeric | direct | hashed | fourier | weekday | hour | extra | aggregate
    code: int = -1  # direct, weekday, hour: the value's code within the column; hashed: the bucket
    partition: int = -1  # hashed: the partition


@dataclass
class Vocabularies:
    """Value labels of the cache's categorical columns, read on first use."""

    cache: EventCache
    _labels: dict[tuple[str, str], list[str]] = field(default_factory=dict)

    def labels(self, group: str, column: str) -> list[str]:
        """Label of each code: [MISSING, value of code 1, value of code 2, ...]."""
        if (group, column) not in self._labels:
            self._labels[(group, column)] = [MISSING, *self._read(group, column)]
        return self._labels[(group, column)]

    def _read(self, group: str, column: str) -> list[str]:
        if group == ATTRIBUTES:
            meta = (self.cache.manifest.get("attributes") or {}).get("columns", {}).get(column, {})
            file = self.cache.path / "vocab" / "__attributes" / f"{meta.get('file', '')}.parquet"
            if not file.is_file():
                return []
            return [str(v) for v in pq.read_table(file, columns=["value"]).column("value").to_pylist()]
        if group in self.cache.sources and column in self.cache.sources[group].info:
            return self.cache.source(group).vocab(column)
        return []

    def label(self, group: str, column: str, code: int) -> str:
        labels = self.labels(group, column)
        return labels[code] if 0 <= code < len(labels) else f"code {code}"


def value_label(col: ColumnPlan, k: int, vocab: Vocabularies, group: str) -> tuple[str, int, int]:
    """(label, code, partition) of channel k (0-based within the column)."""
    if col.kind == "direct":
        return vocab.label(group, col.name, k), k, -1
    if col.kind == "hashed":
        p, b = divmod(k, col.buckets)
        return f"partition {p} bucket {b}", b, p
    if col.kind == "weekday":
        return WEEKDAYS[k], k, -1
    if col.kind == "hour":
        return f"{k * HOUR_BIN:02d}-{(k + 1) * HOUR_BIN:02d}h", k, -1
    if col.kind == "fourier":
        n = len(col.scales)
        return f"{'sin' if k < n else 'cos'}({col.scales[k % n]:g} x)", -1, -1
    return "", -1, -1


def describe(enc: FeatureEncoder, cache: EventCache) -> list[Feature]:
    """One Feature per input index of `enc` (len == enc.dim), in order."""
    vocab = Vocabularies(cache)
    out: list[Feature] = []

    def add(**kw: object) -> None:
        out.append(Feature(index=len(out), **kw))  # type: ignore[arg-type]

    for plan in enc.sources:
        columns = [("", COUNT_COLUMN, "count", -1, -1)] * plan.channels
        for col in plan.columns:
            for k in range(col.width):
                label, code, part = value_label(col, k, vocab, plan.name)
                columns[col.offset + k] = (label, col.name, col.kind, code, part)
        for h in enc.half_lives_days:
            for label, name, kind, code, part in columns:
                add(
                    group=plan.name,
                    column=name,
                    value=label,
                    half_life_days=h,
                    kind=kind,
                    code=code,
                    partition=part,
                )
        for extra in EXTRAS:
            add(group=plan.name, column=extra, value="", half_life_days=None, kind="extra")
    for col in enc.attributes:
        for k in range(col.width):
            label, code, _ = value_label(col, k, vocab, ATTRIBUTES)
            add(group=ATTRIBUTES, column=col.name, value=label, half_life_days=None, kind=col.kind, code=code)
    if enc.aggregate_dim:
        names = aggregate_names(cache)
        if len(names) != enc.aggregate_dim:  # the cache changed since the encoder was fitted
            names = [f"aggregate #{j}" for j in range(enc.aggregate_dim)]
        for name in names:
            add(group=AGGREGATES, column=name, value="", half_life_days=None, kind="aggregate")
    assert len(out) == enc.dim, (len(out), enc.dim)
    return out


def bucket_codes(col: ColumnPlan) -> np.ndarray:
    """[P, vocab_size + 1] channel within the column (p * W + bucket) of every value code of a hashed column."""
    return col.hash_table()
