"""Decayed sketch features of an entity's history, computed in one vectorised pass.

Each event of a source contributes to a few *channels* of that source:
    channel 0                     the event itself (a count)
    numeric column                its value
    low-cardinality categorical   one channel per value (direct)
    high-cardinality categorical  one bucket in each of P hash partitions of width W (a count sketch)
The history feature of (entity, split time t) is, per half-life h, sum over events before t of
    value * exp(-(t - ts) / tau_h)                                   [C channels x H half-lives]
Optionally the automatic aggregates (windowed counts/sums, recency, frequency, monetary) are appended, so
the trunk sees what an analyst would compute (DESIGN §4).
Split points of one entity are processed in time order with the incremental identity (DESIGN §4):
    S(t_j) = exp(-(t_j - t_{j-1}) / tau) * S(t_{j-1}) + sketch(events in [t_{j-1}, t_j))
so every event is touched once, whatever the number of split points.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from basemodel_pipeline.cache.store import DAY, EventCache, EventSource, expand_ranges
from basemodel_pipeline.evaluation.aggregates import aggregate_features, feature_names

NO_HISTORY_DAYS = 3650.0


@dataclass
class ColumnPlan:
    name: str
    kind: str  # numeric | direct | hashed
    offset: int  # first channel of this column within its source
    width: int  # channels: 1 (numeric), vocab_size + 1 (direct), P * W (hashed)
    vocab_size: int = 0
    partitions: int = 0
    buckets: int = 0
    seed: int = 0

    def hash_table(self) -> np.ndarray:
        """[P, vocab_size + 1] bucket of each code in each partition (code 0 = missing -> bucket 0)."""
        rng = np.random.default_rng(self.seed)
        table = rng.integers(0, self.buckets, size=(self.partitions, self.vocab_size + 1))
        table[:, 0] = 0
        return (table + np.arange(self.partitions)[:, None] * self.buckets).astype(np.int64)

    def groups(self) -> list[tuple[int, int]]:
        """Channel ranges that form one distribution (for softmax targets)."""
        if self.kind == "direct":
            return [(self.offset, self.offset + self.width)]
        if self.kind == "hashed":
            return [
                (self.offset + p * self.buckets, self.offset + (p + 1) * self.buckets)
                for p in range(self.partitions)
            ]
        return []


@dataclass
class SourcePlan:
    name: str
    columns: list[ColumnPlan]
    channels: int  # including the count channel 0

    def numeric_channels(self) -> list[int]:
        return [0] + [c.offset for c in self.columns if c.kind == "numeric"]


@dataclass
class FeatureEncoder:
    sources: list[SourcePlan]
    half_lives_days: list[float]
    attributes: list[ColumnPlan] = field(default_factory=list)
    aggregate_dim: int = 0  # > 0: append the automatic aggregate features (evaluation/aggregates.py)
    _tables: dict[tuple[str, str], np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    EXTRAS_PER_SOURCE = 4  # log1p(count), log1p(recency days), log1p(tenure days), has history

    @classmethod
    def fit(
        cls,
        cache: EventCache,
        half_lives_days: list[float],
        max_direct_vocab: int,
        partitions: int,
        buckets: int,
        seed: int = 0,
        aggregates: bool = False,
    ) -> FeatureEncoder:
        sources = []
        for s_idx, (name, src) in enumerate(cache.sources.items()):
            cols, off = [], 1
            for c_idx, (col, info) in enumerate(src.info.items()):
                if info.type == "numeric":
                    cols.append(ColumnPlan(col, "numeric", off, 1))
                elif info.vocab_size <= max_direct_vocab:
                    cols.append(ColumnPlan(col, "direct", off, info.vocab_size + 1, info.vocab_size))
                else:
                    plan = ColumnPlan(
                        col, "hashed", off, partitions * buckets, info.vocab_size, partitions, buckets
                    )
                    plan.seed = seed * 1_000_003 + s_idx * 1009 + c_idx
                    cols.append(plan)
                off += cols[-1].width
            sources.append(SourcePlan(name, cols, off))
        attrs, off = [], 0
        for col, info in cache.attribute_info.items():
            width = info.vocab_size + 1 if info.type == "categorical" else 1
            attrs.append(
                ColumnPlan(
                    col, "direct" if info.type == "categorical" else "numeric", off, width, info.vocab_size
                )
            )
            off += width
        agg_dim = len(feature_names(cache)) if aggregates else 0
        return cls(sources, list(half_lives_days), attrs, agg_dim)

    # ---- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "sources": [
                {"name": s.name, "channels": s.channels, "columns": [asdict(c) for c in s.columns]}
                for s in self.sources
            ],
            "half_lives_days": self.half_lives_days,
            "attributes": [asdict(c) for c in self.attributes],
            "aggregate_dim": self.aggregate_dim,
        }

    @classmethod
    def from_dict(cls, d: dict) -> FeatureEncoder:
        sources = [
            SourcePlan(s["name"], [ColumnPlan(**c) for c in s["columns"]], s["channels"])
            for s in d["sources"]
        ]
        attrs = [ColumnPlan(**c) for c in d["attributes"]]
        return cls(sources, d["half_lives_days"], attrs, d.get("aggregate_dim", 0))

    # ---- sizes ---------------------------------------------------------------------------------
    @property
    def attribute_dim(self) -> int:
        return sum(c.width for c in self.attributes)

    @property
    def dim(self) -> int:
        per_source = sum(
            s.channels * len(self.half_lives_days) + self.EXTRAS_PER_SOURCE for s in self.sources
        )
        return per_source + self.attribute_dim + self.aggregate_dim

    # ---- event channels ------------------------------------------------------------------------
    def event_channels(
        self, plan: SourcePlan, src: EventSource, rows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Channel indices and values of events `rows`: two arrays [m, K]."""
        chans, vals = [np.zeros(len(rows), np.int64)], [np.ones(len(rows), np.float32)]
        for col in plan.columns:
            data = src.columns[col.name][rows]
            if col.kind == "numeric":
                chans.append(np.full(len(rows), col.offset, np.int64))
                vals.append(data.astype(np.float32))
            elif col.kind == "direct":
                chans.append(col.offset + data.astype(np.int64))
                vals.append(np.ones(len(rows), np.float32))
            else:
                key = (plan.name, col.name)
                if key not in self._tables:
                    self._tables[key] = col.hash_table()
                table = self._tables[key]  # [P, V+1]
                for p in range(col.partitions):
                    chans.append(col.offset + table[p, data])
                    vals.append(np.ones(len(rows), np.float32))
        return np.stack(chans, 1), np.stack(vals, 1)

    # ---- history features ----------------------------------------------------------------------
    def history(
        self, cache: EventCache, entity: np.ndarray, time: np.ndarray, chunk: int = 20000
    ) -> np.ndarray:
        """Features [n, dim] float32 of each (entity index, split time in epoch seconds); events with ts < time."""
        entity, time = np.asarray(entity, np.int64), np.asarray(time, np.int64)
        order = np.lexsort((time, entity))
        out = np.empty((len(entity), self.dim), np.float32)
        # chunk on entity boundaries so all split points of an entity stay together
        bounds = _entity_chunks(entity[order], chunk)
        for a, b in bounds:
            idx = order[a:b]
            out[idx] = self._history_sorted(cache, entity[idx], time[idx])
        return out

    def _history_sorted(self, cache: EventCache, e: np.ndarray, t: np.ndarray) -> np.ndarray:
        parts = []
        first = np.r_[True, e[1:] != e[:-1]]  # first split point of each entity in this sorted block
        rank = np.arange(len(e)) - np.maximum.accumulate(np.where(first, np.arange(len(e)), 0))
        for plan in self.sources:
            src = cache.source(plan.name)
            pos = src.positions(e, t)
            start = np.where(first, src.offsets[e], np.r_[0, pos[:-1]])
            owner, rows = expand_ranges(start, pos)  # each event belongs to the first split point after it
            chans, vals = self.event_channels(plan, src, rows)
            dt_days = (t[owner] - np.asarray(src.ts)[rows]) / DAY
            for h in self.half_lives_days:
                tau = h / np.log(2.0)
                w = (vals * np.exp(-dt_days / tau)[:, None].astype(np.float32)).ravel()
                flat = (owner[:, None] * plan.channels + chans).ravel()
                seg = np.bincount(flat, weights=w, minlength=len(e) * plan.channels).reshape(
                    len(e), plan.channels
                )
                gap = np.r_[0.0, np.diff(t) / DAY]
                decay = np.exp(-gap / tau)
                for r in range(1, int(rank.max(initial=0)) + 1):
                    q = np.nonzero(rank == r)[0]
                    seg[q] += decay[q, None] * seg[q - 1]
                parts.append(_squash(seg, plan.numeric_channels()))
            parts.append(_extras(src, e, t, pos))
        if self.attributes:
            parts.append(self._attribute_features(cache, e))
        if self.aggregate_dim:
            agg = np.nan_to_num(aggregate_features(cache, e, t)[0], nan=0.0)
            parts.append(np.sign(agg) * np.log1p(np.abs(agg)))
        return np.concatenate(parts, axis=1).astype(np.float32)

    def _attribute_features(self, cache: EventCache, e: np.ndarray) -> np.ndarray:
        out = np.zeros((len(e), self.attribute_dim), np.float32)
        for col in self.attributes:
            values = cache.attributes[col.name][e]
            if col.kind == "direct":
                out[np.arange(len(e)), col.offset + values.astype(np.int64)] = 1.0
            else:
                out[:, col.offset] = np.sign(values) * np.log1p(np.abs(values))
        return out

    # ---- future windows (self-supervised targets) ----------------------------------------------
    def window_channels(
        self, cache: EventCache, plan: SourcePlan, entity: np.ndarray, t0: np.ndarray, t1: np.ndarray
    ) -> np.ndarray:
        """Undecayed channel sums [n, channels] of events with t0 <= ts < t1."""
        src = cache.source(plan.name)
        owner, rows = src.window_rows(entity, t0, t1)
        chans, vals = self.event_channels(plan, src, rows)
        flat = (owner[:, None] * plan.channels + chans).ravel()
        n = len(entity)
        return np.bincount(flat, weights=vals.ravel(), minlength=n * plan.channels).reshape(n, plan.channels)


def _squash(x: np.ndarray, numeric: list[int]) -> np.ndarray:
    """log1p for counts; signed log1p for numeric sums (channel 0 is the event count)."""
    out = np.log1p(np.maximum(x, 0.0))
    num = [c for c in numeric if c != 0]
    if num:
        out[:, num] = np.sign(x[:, num]) * np.log1p(np.abs(x[:, num]))
    return out


def _extras(src: EventSource, e: np.ndarray, t: np.ndarray, pos: np.ndarray) -> np.ndarray:
    lo = src.offsets[e]
    count = pos - lo
    has = count > 0
    ts = np.asarray(src.ts)
    last = np.where(has, ts[np.maximum(pos - 1, 0)], 0)
    first = np.where(has, ts[np.minimum(lo, max(len(ts) - 1, 0))], 0)
    recency = np.where(has, (t - last) / DAY, NO_HISTORY_DAYS)
    tenure = np.where(has, (t - first) / DAY, 0.0)
    return np.stack([np.log1p(count), np.log1p(recency), np.log1p(tenure), has.astype(np.float64)], 1)


def _entity_chunks(sorted_entity: np.ndarray, chunk: int) -> list[tuple[int, int]]:
    """Split a sorted array into ~chunk-sized blocks without cutting an entity's run."""
    n, bounds, a = len(sorted_entity), [], 0
    while a < n:
        b = min(a + chunk, n)
        while b < n and sorted_entity[b] == sorted_entity[b - 1]:
            b += 1
        bounds.append((a, b))
        a = b
    return bounds
