"""Decayed sketch features of an entity's history, computed in one vectorised pass.

Each event of a source contributes to a few *channels* of that source:
    channel 0                     the event itself (a count)
    numeric column                its value
    low-cardinality categorical   one channel per value (direct)
    high-cardinality categorical  one bucket in each of P hash partitions of width W (a count sketch)
The history feature of (entity, split time t) is, per half-life h, sum over events before t of
    value * exp(-(t - ts) / tau_h)                                   [C channels x H half-lives]
Optionally the automatic aggregates (windowed counts/sums, recency, frequency, monetary) are appended, so
the trunk sees what an analyst would compute (docs/design.md, "Aggregate features").
Split points of one entity are processed in time order with the incremental identity
(docs/design.md, "Decayed sketches are incremental"):
    S(t_j) = exp(-(t_j - t_{j-1}) / tau) * S(t_{j-1}) + sketch(events in [t_{j-1}, t_j))
so every event is touched once, whatever the number of split points.
"""

from __future__ import annotations

import base64
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from basemodel_pipeline.cache.store import EventCache, EventSource
from basemodel_pipeline.dates import DAY
from basemodel_pipeline.features.aggregates import aggregate_features_t, feature_names
from basemodel_pipeline.features.cleora import cleora, incidence
from basemodel_pipeline.features.dlsh import dlsh_table
from basemodel_pipeline.features.kernels import (
    SourceTensors,
    as_tensor,
    entity_chunks,
    incremental_sums,
    source_tensors,
    window_sums,
)
from basemodel_pipeline.features.transforms import history_extras, squash, unsquash

HOUR_BIN = 4  # hours per time-of-day channel


def _fit_dlsh(plan: ColumnPlan, src: EventSource, embedding: dict) -> None:
    """Cleora embeddings of the column's values, then their DLSH bucket table (features/dlsh.py)."""
    B = incidence(src, plan.name, embedding.get("max_events", 2_000_000), plan.seed)
    E = cleora(B, embedding.get("dim", 32), embedding.get("iterations", 4), plan.seed)
    weights = np.asarray(B.sum(0)).ravel()
    plan.method = "dlsh"
    plan.set_table(dlsh_table(E, weights, plan.partitions, plan.buckets, plan.seed))


@dataclass
class ColumnPlan:
    name: str
    kind: str  # numeric | direct | hashed | fourier (of a numeric column) | weekday | hour (of the timestamp)
    offset: int  # first channel of this column within its source
    width: int  # channels: 1 (numeric), vocab_size + 1 (direct), P * W (hashed)
    vocab_size: int = 0
    partitions: int = 0
    buckets: int = 0
    seed: int = 0
    scales: list[float] = field(default_factory=list)  # fourier: sin/cos(scale * signed log1p(value))
    method: str = "random"  # hashed columns: random (seeded hash) | dlsh (Cleora embeddings + DLSH)
    table_b64: str = ""  # dlsh: the [P, vocab_size + 1] bucket table, uint8/uint16, base64 (JSON-safe)

    def set_table(self, buckets: np.ndarray) -> None:
        """Store a [P, vocab_size + 1] table of buckets (0..W-1) learned from data."""
        dtype = np.uint8 if self.buckets <= 256 else np.uint16
        self.table_b64 = base64.b64encode(np.ascontiguousarray(buckets, dtype).tobytes()).decode()

    def hash_table(self) -> np.ndarray:
        """[P, vocab_size + 1] channel (within the column) of each code in each partition; code 0 -> bucket 0."""
        shape = (self.partitions, self.vocab_size + 1)
        if self.table_b64:
            dtype = np.uint8 if self.buckets <= 256 else np.uint16
            table = np.frombuffer(base64.b64decode(self.table_b64), dtype).reshape(shape).astype(np.int64)
        else:
            table = np.random.default_rng(self.seed).integers(0, self.buckets, size=shape)
            table[:, 0] = 0
        return (table + np.arange(self.partitions)[:, None] * self.buckets).astype(np.int64)

    @property
    def values_per_event(self) -> int:
        return {"hashed": self.partitions, "fourier": 2 * len(self.scales)}.get(self.kind, 1)

    @property
    def is_numeric(self) -> bool:
        """Channels are summed values (signed log squash, MSE targets), not counts of categories."""
        return self.kind in ("numeric", "fourier")

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

    @property
    def values_per_event(self) -> int:
        """Channels each event adds to: the count plus one or P per column."""
        return 1 + sum(c.values_per_event for c in self.columns)

    def numeric_channels(self) -> list[int]:
        """Channel 0 (the count) and every channel of numeric and Fourier columns."""
        return [0] + [c.offset + k for c in self.columns if c.is_numeric for k in range(c.width)]


@dataclass
class FeatureEncoder:
    sources: list[SourcePlan]
    half_lives_days: list[float]
    attributes: list[ColumnPlan] = field(default_factory=list)
    aggregate_dim: int = 0  # > 0: append the automatic aggregate features (features/aggregates.py)
    _tables: dict[tuple[str, str, str], torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

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
        sketch: str = "random",
        embedding: dict | None = None,
        fourier_scales: list[float] | None = None,
        calendar: bool = False,
    ) -> FeatureEncoder:
        """Plan every column; sketch="dlsh" learns bucket tables from Cleora embeddings (embedding: dim,
        iterations, max_events), "random" hashes values to buckets."""
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
                    if sketch == "dlsh":
                        _fit_dlsh(plan, src, embedding or {})
                    cols.append(plan)
                off += cols[-1].width
                if info.type == "numeric" and fourier_scales and not info.list_of:  # not for 0/1 indicators
                    cols.append(
                        ColumnPlan(col, "fourier", off, 2 * len(fourier_scales), scales=list(fourier_scales))
                    )
                    off += cols[-1].width
            if calendar:
                cols.append(ColumnPlan("__weekday", "weekday", off, 7))
                off += 7
                if (np.asarray(src.ts[:100_000]) % DAY).any():  # timestamps carry a time of day
                    cols.append(ColumnPlan("__hour", "hour", off, 24 // HOUR_BIN))
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

    def source_width(self, plan: SourcePlan) -> int:
        """Inputs of one event source: its decayed channels at every half-life, then the extras."""
        return plan.channels * len(self.half_lives_days) + self.EXTRAS_PER_SOURCE

    def source_offsets(self) -> dict[str, int]:
        """First input index of each event source's block, by source name."""
        starts = np.cumsum([0] + [self.source_width(p) for p in self.sources])
        return {plan.name: int(a) for plan, a in zip(self.sources, starts, strict=False)}

    @property
    def attribute_offset(self) -> int:
        """First input index of the main-entity attributes (after every source's block)."""
        return sum(self.source_width(p) for p in self.sources)

    @property
    def aggregate_offset(self) -> int:
        """First input index of the automatic aggregate features (the last block)."""
        return self.attribute_offset + self.attribute_dim

    @property
    def dim(self) -> int:
        return self.aggregate_offset + self.aggregate_dim

    # ---- event channels ------------------------------------------------------------------------
    def _table(self, plan: SourcePlan, col: ColumnPlan, device: torch.device) -> torch.Tensor:
        key = (plan.name, col.name, str(device))
        if key not in self._tables:
            # [V + 1, P]: the channels (offset included) of each code, one row per code
            self._tables[key] = torch.from_numpy((col.hash_table() + col.offset).T.copy()).to(device)
        return self._tables[key]

    def event_channels_t(
        self, plan: SourcePlan, st: SourceTensors, rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Channel indices [m, K] (int64) and values [m, K] (float32) of the events `rows`.

        Row-major on purpose: the K channels of one event land in one query's block of the output, which
        keeps the scatter-add cache-friendly (several times faster than channel-major on CPU)."""
        m, dev = len(rows), rows.device
        chans = [torch.zeros((m, 1), dtype=torch.int64, device=dev)]  # the count channel 0
        vals = [torch.ones((m, 1), dtype=torch.float32, device=dev)]
        for col in plan.columns:
            if col.kind in ("weekday", "hour"):
                ts = st.ts[rows]
                bucket = (
                    (torch.div(ts, DAY, rounding_mode="floor") + 3) % 7
                    if col.kind == "weekday"
                    else (torch.div(ts % DAY, HOUR_BIN * 3600, rounding_mode="floor"))
                )  # 1970-01-01 was a Thursday: weekday 0 = Monday
                chans.append((bucket + col.offset).unsqueeze(1))
                vals.append(torch.ones((m, 1), dtype=torch.float32, device=dev))
                continue
            data = st.columns[col.name][rows]
            if col.kind in ("direct", "hashed"):
                # codes added to the vocabulary after the encoder was fitted (cache appends) count as missing
                data = torch.where(data > col.vocab_size, torch.zeros_like(data), data)
            if col.kind == "fourier":
                x = data.to(torch.float32)
                x = torch.sign(x) * torch.log1p(x.abs())
                angles = x.unsqueeze(1) * torch.tensor(col.scales, device=dev)  # [m, S]
                vals.append(torch.cat([torch.sin(angles), torch.cos(angles)], 1))
                chans.append((torch.arange(col.width, device=dev) + col.offset).expand(m, col.width))
            elif col.kind == "numeric":
                chans.append(torch.full((m, 1), col.offset, dtype=torch.int64, device=dev))
                vals.append(data.to(torch.float32).unsqueeze(1))
            elif col.kind == "direct":
                chans.append((data.to(torch.int64) + col.offset).unsqueeze(1))
                vals.append(torch.ones((m, 1), dtype=torch.float32, device=dev))
            else:
                chans.append(torch.index_select(self._table(plan, col, dev), 0, data))  # [m, P]
                vals.append(torch.ones((m, col.partitions), dtype=torch.float32, device=dev))
        return torch.cat(chans, 1), torch.cat(vals, 1)

    def event_channels(
        self, plan: SourcePlan, src: EventSource, rows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """numpy form of event_channels_t (for tests and notebooks)."""
        st = source_tensors(src, torch.device("cpu"))
        chans, vals = self.event_channels_t(plan, st, torch.from_numpy(np.asarray(rows, np.int64)))
        return chans.numpy(), vals.numpy()

    # ---- history features ----------------------------------------------------------------------
    def history(
        self,
        cache: EventCache,
        entity: np.ndarray,
        time: np.ndarray,
        chunk: int = 32768,
        device: torch.device | str = "cpu",
    ) -> np.ndarray:
        """Features [n, dim] float32 of each (entity index, split time in epoch seconds); events with ts < time."""
        return self.history_t(cache, entity, time, chunk, torch.device(device)).cpu().numpy()

    def history_t(
        self,
        cache: EventCache,
        entity: np.ndarray,
        time: np.ndarray,
        chunk: int,
        device: torch.device,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """history() as a tensor, in the order of the queries: a new float32 tensor on `device`, or written
        into `out` [n, dim] (any float dtype, any device: fine-tuning's float16 matrix in host memory)."""
        entity, time = np.asarray(entity, np.int64), np.asarray(time, np.int64)
        order = np.lexsort((time, entity))
        in_order = bool((order == np.arange(len(order))).all())  # a chunk is then one slice of `out`
        if out is None:
            out = torch.empty((len(entity), self.dim), dtype=torch.float32, device=device)
        # chunks on entity boundaries so all split points of an entity stay together
        for a, b in entity_chunks(entity[order], chunk):
            idx = order[a:b]
            e = torch.from_numpy(entity[idx]).to(device)
            t = torch.from_numpy(time[idx]).to(device)
            if in_order and out.device == device:
                self.history_sorted(cache, e, t, out=out[a:b])
            elif in_order:
                out[a:b].copy_(self.history_sorted(cache, e, t))
            else:
                out[torch.from_numpy(idx).to(out.device)] = self.history_sorted(cache, e, t).to(out)
        return out

    def _rates(self, device: torch.device) -> torch.Tensor:
        """Decay rate per second of each half-life."""
        return torch.tensor([np.log(2.0) / (h * DAY) for h in self.half_lives_days], device=device)

    def history_sorted(
        self,
        cache: EventCache,
        e: torch.Tensor,
        t: torch.Tensor,
        totals: dict | None = None,
        windows: dict | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        sums, pos = [], []
        for plan in self.sources:
            st = source_tensors(cache.source(plan.name), e.device)
            s, sg = incremental_sums(
                st,
                e,
                t,
                self._rates(e.device),
                plan.channels,
                lambda rows, owner, a, plan=plan, st=st: self.event_channels_t(plan, st, rows),
            )
            sums.append(s)
            pos.append(sg.pos)
        return self.assemble(cache, e, t, sums, pos, totals, windows, out)

    def assemble(
        self,
        cache: EventCache,
        e: torch.Tensor,
        t: torch.Tensor,
        sums: list[torch.Tensor],
        pos: list[torch.Tensor],
        totals: dict | None = None,
        windows: dict | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Model input [n, dim] from each source's raw decayed sums [n, H, C] and first row at/after t [n],
        written block by block into `out` (a new float32 tensor without it; any float dtype with it).

        ``totals`` / ``windows``: precomputed aggregate sums per source (aggregates.all_history_totals,
        window_totals); without them the aggregates read the events before t."""
        n, H = len(e), len(self.half_lives_days)
        if out is None:
            out = torch.empty((n, self.dim), dtype=torch.float32, device=e.device)
        col = 0
        for plan, s, p in zip(self.sources, sums, pos, strict=True):
            st = source_tensors(cache.source(plan.name), e.device)
            width = H * plan.channels
            squash(s, plan.numeric_channels(), out[:, col : col + width].view(n, H, plan.channels))
            out[:, col + width : col + width + self.EXTRAS_PER_SOURCE] = history_extras(st, e, t, p)
            col += width + self.EXTRAS_PER_SOURCE
        if self.attributes:
            out[:, col : col + self.attribute_dim] = self._attribute_features(cache, e)
            col += self.attribute_dim
        if self.aggregate_dim:
            agg = torch.nan_to_num(aggregate_features_t(cache, e, t, totals, windows), nan=0.0)
            out[:, col : col + self.aggregate_dim] = torch.sign(agg) * torch.log1p(agg.abs())
            col += self.aggregate_dim
        assert col == out.shape[1], f"feature layout: {col} columns filled of {out.shape[1]}"
        return out

    def raw_sums(self, X: torch.Tensor) -> list[torch.Tensor]:
        """Inverse of assemble's squashing for the decayed sums: per source [n, H, C] float32 from features X."""
        n, H, offsets, out = len(X), len(self.half_lives_days), self.source_offsets(), []
        for plan in self.sources:
            off = offsets[plan.name]
            block = X[:, off : off + H * plan.channels].to(torch.float32).reshape(n, H, plan.channels)
            out.append(unsquash(block, plan.numeric_channels()))
        return out

    def _attribute_features(self, cache: EventCache, e: torch.Tensor) -> torch.Tensor:
        out = torch.zeros((len(e), self.attribute_dim), dtype=torch.float32, device=e.device)
        for col in self.attributes:
            values = as_tensor(np.asarray(cache.attributes[col.name]), e.device)[e]
            if col.kind == "direct":
                code = values.to(torch.int64)
                code = torch.where(code > col.vocab_size, torch.zeros_like(code), code)  # unseen at fit time
                out[torch.arange(len(e), device=e.device), col.offset + code] = 1.0
            else:
                v = values.to(torch.float32)
                out[:, col.offset] = torch.sign(v) * torch.log1p(v.abs())
        return out

    # ---- future windows (self-supervised targets) ----------------------------------------------
    def window_channels_t(
        self, cache: EventCache, plan: SourcePlan, e: torch.Tensor, t0: torch.Tensor, t1: torch.Tensor
    ) -> torch.Tensor:
        """Undecayed channel sums [n, channels] of events with t0 <= ts < t1."""
        st = source_tensors(cache.source(plan.name), e.device)
        return window_sums(
            st, e, t0, t1, lambda rows, *_: self.event_channels_t(plan, st, rows), plan.channels
        )

    def window_channels(
        self, cache: EventCache, plan: SourcePlan, entity: np.ndarray, t0: np.ndarray, t1: np.ndarray
    ) -> np.ndarray:
        """numpy form of window_channels_t."""
        e, a, b = (torch.from_numpy(np.asarray(x, np.int64)) for x in (entity, t0, t1))
        return self.window_channels_t(cache, plan, e, a, b).numpy()
