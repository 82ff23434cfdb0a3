"""The events API of Python target functions, and the column predicates shared with declarative targets.

A target function is called once per example (entity, split time)::

    def target(history: Events, future: Events, attributes: dict, ctx: TargetContext) -> array | None

``history`` holds the entity's events before the split, ``future`` those in [split, split + horizon_days).
``history["transactions"]`` is a ``SourceEvents``: filter it, cut a window in days from the split, count,
sum, average, or group by a column over given classes. Categorical values come back as text, numeric ones
as floats. Return ``None`` to drop the example (e.g. ``if not ctx.window_complete: return None``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from basemodel_pipeline.cache.store import EventCache, EventSource
from basemodel_pipeline.config.models import Condition, Scenario
from basemodel_pipeline.dates import DAY
from basemodel_pipeline.errors import ConfigError, UserError

_OPS = {
    "==": np.equal,
    "!=": np.not_equal,
    ">": np.greater,
    ">=": np.greater_equal,
    "<": np.less,
    "<=": np.less_equal,
}


_VOCABS: dict[tuple[Path | None, str], tuple[np.ndarray, dict[str, int]]] = {}


def vocab(src: EventSource, column: str) -> tuple[np.ndarray, dict[str, int]]:
    """(values by code [V + 1], value -> code) of a categorical column; code 0 (missing) is None."""
    key = (src.vocab_dir, column)
    size = src.info[column].vocab_size
    if key not in _VOCABS or len(_VOCABS[key][0]) != size + 1:
        values = src.vocab(column)
        _VOCABS[key] = (np.array([None, *values], dtype=object), {v: i + 1 for i, v in enumerate(values)})
    return _VOCABS[key]


def _check_column(src: EventSource, column: str, where: str) -> None:
    if column not in src.info:
        raise ConfigError(
            f"{where}: column '{column}' is not in event source '{src.name}' (known: {', '.join(src.info)})"
        )


def condition_mask(src: EventSource, rows: np.ndarray, cond: Condition, where: str) -> np.ndarray:
    """Boolean mask of event `rows` satisfying one condition; `where` names the config field in errors."""
    _check_column(src, cond.column, where)
    info = src.info[cond.column]
    data = np.asarray(src.columns[cond.column])[rows]
    values = cond.value if isinstance(cond.value, list) else [cond.value]
    if info.type == "categorical":
        if cond.op not in ("==", "!=", "in", "not in"):
            raise ConfigError(
                f"{where}: op '{cond.op}' needs a numeric column; '{cond.column}' is categorical"
            )
        _, codes = vocab(src, cond.column)
        missing = [v for v in values if str(v) not in codes]
        if missing:
            raise ConfigError(
                f"{where}: value {missing[0]!r} never occurs in column '{cond.column}' of '{src.name}'; "
                "check the spelling (values are compared as text)"
            )
        hit = np.isin(data, [codes[str(v)] for v in values])
        return ~hit if cond.op in ("!=", "not in") else hit
    try:
        nums = [float(v) for v in values]
    except (TypeError, ValueError):
        raise ConfigError(
            f"{where}: column '{cond.column}' is numeric; {cond.value!r} is not a number"
        ) from None
    if cond.op in ("in", "not in"):
        hit = np.isin(data, nums)
        return ~hit if cond.op == "not in" else hit
    return _OPS[cond.op](data, nums[0])


def filter_rows(src: EventSource, rows: np.ndarray, conds: Iterable[Condition], where: str) -> np.ndarray:
    """Mask of `rows` satisfying every condition (AND)."""
    mask = np.ones(len(rows), dtype=bool)
    for i, cond in enumerate(conds):
        mask &= condition_mask(src, rows, cond, f"{where}.filter[{i}]")
    return mask


class SourceEvents:
    """Events of one entity and one source in one window, oldest first."""

    def __init__(self, src: EventSource, rows: np.ndarray, split: int, future: bool) -> None:
        self._src, self.rows, self._split, self._future = src, rows, split, future

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        return (
            f"SourceEvents({self._src.name}, {len(self)} events, {'future' if self._future else 'history'})"
        )

    @property
    def ts(self) -> np.ndarray:
        """Timestamps, epoch seconds."""
        return np.asarray(self._src.ts)[self.rows]

    @property
    def days(self) -> np.ndarray:
        """Days from the split: after it for the future window, before it for history (both >= 0)."""
        d = (self.ts - self._split) / DAY
        return d if self._future else -d

    def column(self, name: str) -> np.ndarray:
        """Values of a column: text (object array) for categorical columns, float64 for numeric ones."""
        _check_column(self._src, name, "events.column")
        data = np.asarray(self._src.columns[name])[self.rows]
        if self._src.info[name].type == "categorical":
            return vocab(self._src, name)[0][data]
        return data.astype(np.float64)

    def _take(self, mask: np.ndarray) -> SourceEvents:
        return SourceEvents(self._src, self.rows[mask], self._split, self._future)

    def filter(self, column: str | np.ndarray, op: str = "==", value: object = None) -> SourceEvents:
        """Events matching ``column op value`` (ops: == != in "not in" > >= < <=), or a boolean mask."""
        if not isinstance(column, str):
            return self._take(np.asarray(column, dtype=bool))
        cond = Condition(column=column, op=op, value=value)  # type: ignore[arg-type]
        return self._take(condition_mask(self._src, self.rows, cond, "events.filter"))

    def within_days(self, start: float = 0.0, end: float = float("inf")) -> SourceEvents:
        """Events with start <= days < end (days measured from the split, see ``days``)."""
        d = self.days
        return self._take((d >= start) & (d < end))

    def count(self) -> int:
        return len(self.rows)

    def exists(self) -> bool:
        return len(self.rows) > 0

    def sum(self, column: str) -> float:
        return float(self.column(column).sum()) if len(self) else 0.0

    def mean(self, column: str) -> float:
        return float(self.column(column).mean()) if len(self) else float("nan")

    def group_count(self, column: str, classes: Sequence[str]) -> np.ndarray:
        """Events per class (float64 [len(classes)]) of a categorical column."""
        values = self.column(column)
        return np.array([np.count_nonzero(values == c) for c in classes], dtype=np.float64)

    def group_exists(self, column: str, classes: Sequence[str]) -> np.ndarray:
        """1.0 where at least one event has that class, else 0.0."""
        return (self.group_count(column, classes) > 0).astype(np.float64)


class Events(Mapping[str, SourceEvents]):
    """Events of one entity in one window, per source: ``events["transactions"]``."""

    def __init__(self, parts: dict[str, SourceEvents]) -> None:
        self._parts = parts

    def __getitem__(self, source: str) -> SourceEvents:
        if source not in self._parts:
            raise KeyError(f"no event source '{source}'; known: {', '.join(self._parts)}")
        return self._parts[source]

    def __iter__(self):
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)


@dataclass(frozen=True)
class TargetContext:
    scenario: str
    entity_id: object
    split_time: dt.datetime  # UTC
    horizon_days: int
    window_complete: bool  # the future window ends before the data does
    classes: tuple[str, ...]


# ---- the events of a declarative target's window ------------------------------------------------
def target_source(cache: EventCache, scenario: Scenario) -> EventSource:
    try:
        return cache.source(scenario.target.source)
    except UserError as err:  # the config names a source the cache does not hold; anything else is a bug
        raise ConfigError(f"scenario '{scenario.name}': target.source: {err}") from None


def window_events(
    cache: EventCache, scenario: Scenario, e: np.ndarray, t: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(example index, event row) of the target's matching events in [t, t + horizon_days)."""
    target = scenario.target
    src = target_source(cache, scenario)
    owner, rows = src.window_rows(e, t, t + target.horizon_days * DAY)
    if target.filter:
        keep = filter_rows(src, rows, target.filter, f"scenario '{scenario.name}': target")
        owner, rows = owner[keep], rows[keep]
    return owner, rows


def regression_values(cache: EventCache, scenario: Scenario, e: np.ndarray, t: np.ndarray) -> np.ndarray:
    target = scenario.target
    owner, rows = window_events(cache, scenario, e, t)
    if target.aggregation == "count":
        y = np.bincount(owner, minlength=len(e)).astype(np.float64)
    else:
        vals = np.asarray(cache.source(target.source).columns[target.column])[rows].astype(np.float64)
        y = np.bincount(owner, weights=vals, minlength=len(e))
    return np.log1p(np.maximum(y, 0.0)) if target.log1p else y
