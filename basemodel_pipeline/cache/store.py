"""Read the event cache: memory-mapped per-entity arrays (see cache/build.py for the layout)."""

from __future__ import annotations

import datetime as dt
import json
import os
import warnings
import weakref
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from basemodel_pipeline.errors import UserError


@dataclass(frozen=True)
class ColumnInfo:
    name: str
    type: str  # categorical | numeric
    vocab_size: int = 0  # categorical: codes are 1..vocab_size, 0 = missing
    list_of: str = ""  # a 0/1 indicator "<list_of>=<list_value>" of a list-valued column (cache/plan.py)
    list_value: str = ""


@dataclass
class EventSource:
    name: str
    offsets: np.ndarray  # int64 [n_entities + 1]
    ts: np.ndarray  # int64 [n_events], epoch seconds, sorted within entity
    columns: dict[str, np.ndarray]  # int32 codes or float32 values, [n_events]
    info: dict[str, ColumnInfo] = field(default_factory=dict)
    vocab_dir: Path | None = None
    vocab_dirs: list[Path] = field(default_factory=list)  # base then appended segments (default: vocab_dir)
    device_cache: dict = field(default_factory=dict, repr=False, compare=False)  # features/kernels.py

    @property
    def n_events(self) -> int:
        return int(self.ts.shape[0])

    def list_indicators(self, column: str) -> list[ColumnInfo]:
        """The 0/1 indicator columns of a list-valued column (empty when `column` is not one)."""
        return [i for i in self.info.values() if i.list_of == column]

    def positions(self, entity: np.ndarray, time: np.ndarray) -> np.ndarray:
        """Global row of the first event of `entity` at or after `time` (so rows before it have ts < time)."""
        entity = np.ascontiguousarray(entity, dtype=np.int64)
        time = np.ascontiguousarray(np.broadcast_to(np.asarray(time, np.int64), entity.shape))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only arrays: only read
            tensors = [
                torch.from_numpy(a) for a in (self.ts, np.asarray(self.offsets, np.int64), entity, time)
            ]
        return bisect_rows(*tensors).numpy()

    def window_rows(
        self, entity: np.ndarray, t0: np.ndarray, t1: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows of events with t0 <= ts < t1 per query, flattened: (query index per row, event row)."""
        lo, hi = self.positions(entity, t0), self.positions(entity, t1)
        return expand_ranges(lo, hi)

    def vocab(self, column: str) -> list[str]:
        """Values of a categorical column; code k is vocab[k - 1]."""
        assert self.vocab_dir is not None
        files = [d / f"col_{_stem(column)}.parquet" for d in (self.vocab_dirs or [self.vocab_dir])]
        values: list[str] = []
        for file in files:
            if file.exists() or file == files[0]:
                values += [str(v) for v in pq.read_table(file, columns=["value"]).column("value").to_pylist()]
        return values


def bisect_rows(
    ts: torch.Tensor, offsets: torch.Tensor, entity: torch.Tensor, time: torch.Tensor
) -> torch.Tensor:
    """First row r in [offsets[e], offsets[e+1]) with ts[r] >= time, per query (the run's end if none).

    A vectorised binary search inside each entity's run of the timestamps: ~log2(longest history) passes over
    the queries, no index array held in memory; works on CPU (memory maps) and GPU tensors alike."""
    lo, hi = offsets[entity].clone(), offsets[entity + 1].clone()
    active = torch.nonzero(lo < hi).squeeze(1)
    while active.numel():
        mid = (lo[active] + hi[active]) // 2
        right = ts[mid] < time[active]  # the answer is after mid
        lo[active[right]] = mid[right] + 1
        hi[active[~right]] = mid[~right]
        active = active[lo[active] < hi[active]]
    return lo


def expand_ranges_t(lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[lo_q, hi_q) ranges -> (owner q per element, element index), without a Python loop."""
    lengths = (hi - lo).clamp_min(0)
    owner = torch.repeat_interleave(torch.arange(len(lo), device=lo.device), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    rows = torch.arange(int(lengths.sum()), device=lo.device) - torch.repeat_interleave(starts - lo, lengths)
    return owner, rows


def expand_ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numpy form of expand_ranges_t."""
    owner, rows = expand_ranges_t(
        torch.from_numpy(np.asarray(lo, np.int64)), torch.from_numpy(np.asarray(hi, np.int64))
    )
    return owner.numpy(), rows.numpy()


def _stem(col: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in col)


class EventCache:
    """The cache as one CSR view: the base and its appended segments (a view merged once per version, see
    cache/view.py), entity ids in index order, vocabularies and main-entity attributes.

    Opening resolves `path` (the cache pointer, cache/<fingerprint>) to the version it names now and holds
    that version until close() (or the object is collected, or the process ends): a writer publishing a
    new version meanwhile changes nothing this object reads (cache/versions.py). `path` is then that
    version's directory."""

    def __init__(self, path: str | Path) -> None:
        from basemodel_pipeline.cache import integrity, versions
        from basemodel_pipeline.cache.view import events_root, segment_dirs

        self.path, lock = versions.open_version(Path(path))
        self._release = weakref.finalize(self, versions.release, lock, Path(path), os.getpid())
        manifest = self.path / "manifest.json"
        if not manifest.exists():
            self.close()
            if self.path.is_dir():  # the pointer names a version only once it is published with its manifest
                raise UserError(
                    f"event cache {self.path}: manifest.json missing: the files cannot be checked; rebuild it "
                    "with `basemodel cache CONFIG`"
                )
            raise UserError(f"no event cache at {path}; run the cache stage (`basemodel cache CONFIG`)")
        try:
            self.manifest = json.loads(manifest.read_text())
            integrity.check_on_open(self.path, self.manifest)
        except BaseException as exc:
            self.close()
            if isinstance(exc, ValueError):
                raise UserError(
                    f"{manifest} is unreadable ({exc}); rebuild it with `basemodel cache CONFIG`"
                ) from None
            raise
        self.n_entities: int = self.manifest["n_entities"]
        self.segments = segment_dirs(self.path, self.manifest)
        root = events_root(self.path, self.manifest)
        self.sources: dict[str, EventSource] = {}
        for name, meta in self.manifest["sources"].items():
            d = root / "events" / name
            self.sources[name] = EventSource(
                name=name,
                offsets=np.load(d / "offsets.npy"),
                ts=np.load(d / "ts.npy", mmap_mode="r"),
                columns={
                    c: np.load(d / f"{m['file']}.npy", mmap_mode="r") for c, m in meta["columns"].items()
                },
                info={
                    c: ColumnInfo(
                        c, m["type"], m.get("vocab_size", 0), m.get("list_of", ""), m.get("list_value", "")
                    )
                    for c, m in meta["columns"].items()
                },
                vocab_dir=self.path / "vocab" / name,
                vocab_dirs=[s / "vocab" / name for s in self.segments],
            )
        attrs = self.manifest.get("attributes") or {}
        self.attribute_info = {
            c: ColumnInfo(c, m["type"], m.get("vocab_size", 0)) for c, m in attrs.get("columns", {}).items()
        }
        self.attributes = {
            c: np.concatenate(
                [np.load(f) for s in self.segments if (f := s / "attributes" / f"{m['file']}.npy").exists()]
            )
            for c, m in attrs.get("columns", {}).items()
        }

    def close(self) -> None:
        """Let go of this cache version (a writer may delete it once no reader holds it)."""
        self._release()

    def __enter__(self) -> EventCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @cached_property
    def entity_ids(self) -> np.ndarray:
        """Entity id of each index (int64 or str): the base's entities, then each append's new ones."""
        parts = [
            pq.read_table(s / "entities.parquet").column("entity_id").to_numpy(zero_copy_only=False)
            for s in self.segments
            if (s / "entities.parquet").exists()
        ]
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    @cached_property
    def _id_order(self) -> np.ndarray:
        return np.argsort(self.entity_ids, kind="stable")

    def entity_index(self, ids: np.ndarray) -> np.ndarray:
        """Entity index of each id, -1 where unknown (the ids are not sorted: shards, then appends)."""
        ids = np.asarray(ids).astype(self.entity_ids.dtype)
        if not len(self.entity_ids):
            return np.full(len(ids), -1, dtype=np.int64)
        order = self._id_order
        sorted_ids = self.entity_ids[order]
        pos = np.clip(np.searchsorted(sorted_ids, ids), 0, len(order) - 1)
        return np.where(sorted_ids[pos] == ids, order[pos], -1)

    @property
    def shards(self) -> list[tuple[int, int]]:
        """Contiguous [start, end) entity-index ranges: the build's hash shards, then one per append."""
        return [(int(a), int(b)) for a, b in self.manifest.get("shards", [[0, self.n_entities]])]

    def appended_since(self, day: dt.date) -> list[dict]:
        """Appends (days, events, new entities, time) that added days after `day`."""
        return [a for a in self.manifest.get("appends", []) if max(a["days"]) > day.isoformat()]

    @property
    def max_date(self) -> dt.date:
        return max(
            dt.date.fromisoformat(s["max_date"]) for s in self.manifest["sources"].values() if s["max_date"]
        )

    def source_max_date(self, name: str) -> dt.date | None:
        """The last event day of one source (None when it has no events)."""
        day = self.manifest["sources"].get(name, {}).get("max_date")
        return dt.date.fromisoformat(day) if day else None

    @property
    def min_date(self) -> dt.date:
        return min(
            dt.date.fromisoformat(s["min_date"]) for s in self.manifest["sources"].values() if s["min_date"]
        )

    def source(self, name: str) -> EventSource:
        if name not in self.sources:
            raise UserError(
                f"event source '{name}' is not in the cache at {self.path}; known: {', '.join(self.sources)}"
            )
        return self.sources[name]
