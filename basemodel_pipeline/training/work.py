"""The work a training stage actually did: examples, history events featurised, coverage of the data.

Throughput figures divide these counts by seconds. "Dataset events per second" (the data set's size over the
wall time) is not one of them: with a capped number of examples per epoch it grows with the data set while the
work stays the same (docs/benchmarks.md, "Throughput"). Definitions:

- ``examples``: (entity, split time) queries trained on, all epochs;
- ``history_events``: events before each query's split time, summed over the queries: what the featuriser
  folds into the examples' features (an event in the history of two queries counts twice);
- ``events_scanned``: events the featuriser reads (queries are sorted per entity, and the incremental pass
  reads each entity's events once per chunk up to its latest split time);
- ``entities_covered_fraction``: entities with at least one example / all entities;
- ``pairs_covered_fraction``: distinct (entity, split day) examples / all (entity, split day) pairs of the
  training range where the entity has history (what an uncapped sampler could draw).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.dates import DAY


def history_lengths(cache: EventCache, sources: list[str], e: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Events before time t of entity e, per query, summed over `sources`."""
    n = np.zeros(len(e), np.int64)
    for name in sources:
        src = cache.source(name)
        n += src.positions(e, t) - np.asarray(src.offsets, np.int64)[e]
    return n


def _scanned(cache: EventCache, sources: list[str], e: np.ndarray, t: np.ndarray) -> int:
    """Events read by one incremental pass over queries: per entity, its history up to its latest split."""
    if len(e) == 0:
        return 0
    order = np.lexsort((t, e))
    e, t = e[order], t[order]
    last = np.r_[e[1:] != e[:-1], True]
    return int(history_lengths(cache, sources, e[last], t[last]).sum())


@dataclass
class WorkCounter:
    """Accumulates the examples of a run, chunk by chunk; `summary` turns them into the work figures."""

    cache: EventCache
    sources: list[str]
    examples: int = 0
    history_events: int = 0
    events_scanned: int = 0
    _keys: list[np.ndarray] = field(default_factory=list)

    def add(self, e: np.ndarray, t: np.ndarray) -> None:
        """Count one featurised chunk of queries (entity ids, split times in epoch seconds)."""
        e, t = np.asarray(e, np.int64), np.asarray(t, np.int64)
        self.examples += len(e)
        self.history_events += int(history_lengths(self.cache, self.sources, e, t).sum())
        self.events_scanned += _scanned(self.cache, self.sources, e, t)
        self._keys.append(e * (1 << 24) + t // DAY)  # (entity, day): days since 1970 fit in 24 bits

    def possible_pairs(self, lo: int, hi: int) -> int:
        """(entity, split day) pairs with lo <= day <= hi (split days lo + k * DAY) where the entity has history."""
        first = np.full(self.cache.n_entities, np.iinfo(np.int64).max)
        for name in self.sources:
            src = self.cache.source(name)
            off = np.asarray(src.offsets, np.int64)
            has = off[1:] > off[:-1]
            first[has] = np.minimum(first[has], np.asarray(src.ts)[off[:-1][has]])
        n_days = (hi - lo) // DAY + 1
        active = first < np.iinfo(np.int64).max
        # history before split day k needs first < lo + k * DAY, i.e. k > (first - lo) / DAY
        k_min = np.clip(np.floor_divide(first[active] - lo, DAY) + 1, 0, None)
        return int(np.clip(n_days - k_min, 0, None).sum())

    def summary(self, seconds: float, lo: int | None = None, hi: int | None = None) -> dict[str, float]:
        """Counts, rates per second of `seconds`, and coverage (pairs only when the split range is given)."""
        keys = np.unique(np.concatenate(self._keys)) if self._keys else np.zeros(0, np.int64)
        entities = len(np.unique(keys >> 24))
        out: dict[str, float] = {
            "examples": self.examples,
            "history_events": self.history_events,
            "events_scanned": self.events_scanned,
            "distinct_examples": len(keys),
            "entities_covered": entities,
            "entities_covered_fraction": round(entities / max(self.cache.n_entities, 1), 4),
            "examples_per_s": round(self.examples / max(seconds, 1e-9), 1),
            "history_events_per_s": round(self.history_events / max(seconds, 1e-9), 1),
            "events_scanned_per_s": round(self.events_scanned / max(seconds, 1e-9), 1),
        }
        if lo is not None and hi is not None:
            possible = self.possible_pairs(lo, hi)
            out["possible_pairs"] = possible
            out["pairs_covered_fraction"] = round(len(keys) / max(possible, 1), 6)
        return out
