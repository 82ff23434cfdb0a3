"""The candidate examples of a scenario: the (entity, split time) pairs its labels are built for, entities
with history in the target's source before each split time."""

from __future__ import annotations

import numpy as np

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config.models import Scenario
from basemodel_pipeline.dates import DAY


def _grid(cache: EventCache, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = cache.n_entities
    return np.repeat(np.arange(n, dtype=np.int64), len(times)), np.tile(times.astype(np.int64), n)


def population(
    cache: EventCache, source: str, e: np.ndarray, t: np.ndarray, active_days: int | None
) -> np.ndarray:
    """Entities with history before t (and, if set, an event in the `active_days` before t)."""
    src = cache.source(source)
    pos = src.positions(e, t)
    if active_days is None:
        return pos > src.offsets[e]
    return pos > src.positions(e, t - active_days * DAY)


def candidate_pairs(
    cache: EventCache, scenario: Scenario, times: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(entity, split time) of every candidate example: entities with history in the target's source before
    each split time (and active in the last days, when the target says so)."""
    e, t = _grid(cache, times)
    keep = population(cache, scenario.target.source, e, t, scenario.target.active_in_last_days)
    return e[keep], t[keep]
