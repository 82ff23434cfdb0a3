"""Python target functions: ``target: {kind: python, function: "my_pkg.targets:churn", ...}``.

The function is imported by its "module:name" reference and called once per candidate example (entities
with history in ``target.source`` before the split) as ``target(history, future, attributes, ctx)``. What it
must return, per task:

    binary       0 or 1 (a scalar or shape [1])         regression   a finite number (scalar or [1])
    multiclass   a class index in [0, C) or a class name multilabel   0/1 array of shape [C]

or ``None`` to drop the example. A function that raises, returns another shape, or NaN/inf stops training
with an error naming the scenario and the first offending entity and split date.
"""

from __future__ import annotations

import datetime as dt
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config.models import PythonTarget, Scenario
from basemodel_pipeline.dates import DAY, epoch_seconds
from basemodel_pipeline.errors import ConfigError, DataError
from basemodel_pipeline.scenarios.events import Events, SourceEvents, TargetContext
from basemodel_pipeline.scenarios.examples import Examples, TargetSpec, candidate_pairs


def load_function(scenario: Scenario) -> Callable[..., Any]:
    target = scenario.target
    assert isinstance(target, PythonTarget)
    module_name, _, name = target.function.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(
            f"scenario '{scenario.name}': target.function '{target.function}': cannot import module "
            f"'{module_name}' ({err}); put it next to the config file or on PYTHONPATH"
        ) from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(
            f"scenario '{scenario.name}': target.function '{target.function}': module '{module_name}' has no "
            f"function '{name}'"
        )
    return fn


def function_source(scenario: Scenario) -> str | None:
    """Source code of the target function (stored beside the checkpoint), or None when unavailable."""
    try:
        return inspect.getsource(inspect.getmodule(load_function(scenario)))  # type: ignore[arg-type]
    except (OSError, TypeError):
        return None


def attribute_values(cache: EventCache) -> dict[str, np.ndarray]:
    """Main-entity attributes per entity, decoded: text (object arrays) or float64."""
    out: dict[str, np.ndarray] = {}
    columns = (cache.manifest.get("attributes") or {}).get("columns", {})
    for col, info in cache.attribute_info.items():
        data = np.asarray(cache.attributes[col])
        if info.type != "categorical":
            out[col] = data.astype(np.float64)
            continue
        path = cache.path / "vocab" / "__attributes" / f"{columns[col]['file']}.parquet"
        values = pq.read_table(path).column("value").to_pylist() if path.exists() else []
        table = np.array([None, *map(str, values)], dtype=object)
        out[col] = table[np.clip(data.astype(np.int64), 0, len(table) - 1)]
    return out


def _check(value: Any, task: str, spec: TargetSpec) -> float | np.ndarray | str:
    """The validated label, or raise ValueError saying what is wrong."""
    classes = spec.classes
    if task == "multiclass" and isinstance(value, str):
        if value not in classes:
            raise ValueError(f"returned class '{value}', not one of target.classes {classes}")
        return float(classes.index(value))
    arr = np.asarray(value, dtype=np.float64)
    want = (len(classes),) if task == "multilabel" else (1,)
    if arr.size != int(np.prod(want)) or (task == "multilabel" and arr.shape != want):
        raise ValueError(f"returned shape {arr.shape}; a {task} target needs shape {want}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("returned NaN or inf")
    if task in ("binary", "multilabel") and not np.all((arr == 0) | (arr == 1)):
        raise ValueError(f"returned {arr.ravel()[:5].tolist()}; a {task} target holds 0/1 values")
    if task == "multiclass":
        k = float(arr.ravel()[0])
        if k != int(k) or not 0 <= k < len(classes):
            raise ValueError(f"returned class index {k}; needs an integer in [0, {len(classes)})")
    return arr if task == "multilabel" else float(arr.ravel()[0])


def python_examples(cache: EventCache, scenario: Scenario, spec: TargetSpec, times: np.ndarray) -> Examples:
    target = scenario.target
    assert isinstance(target, PythonTarget)
    fn = load_function(scenario)
    e, t = candidate_pairs(cache, scenario, times)
    data_end = epoch_seconds(cache.max_date) + DAY
    horizon = target.horizon_days * DAY
    bounds = {n: (s, s.positions(e, t), s.positions(e, t + horizon)) for n, s in cache.sources.items()}
    attrs = attribute_values(cache)
    ids = cache.entity_ids
    where = f"scenario '{scenario.name}': target function {target.function}"
    keep, labels = [], []
    for i in range(len(e)):
        ti = int(t[i])
        history = Events(
            {
                n: SourceEvents(s, np.arange(s.offsets[e[i]], p0[i]), ti, False)
                for n, (s, p0, _) in bounds.items()
            }
        )
        future = Events(
            {n: SourceEvents(s, np.arange(p0[i], p1[i]), ti, True) for n, (s, p0, p1) in bounds.items()}
        )
        entity_id = ids[e[i]].item() if isinstance(ids[e[i]], np.generic) else ids[e[i]]
        split = dt.datetime.fromtimestamp(ti, dt.UTC)
        ctx = TargetContext(
            scenario.name,
            entity_id,
            split,
            target.horizon_days,
            ti + horizon <= data_end,
            tuple(spec.classes),
        )
        try:
            value = fn(history, future, {c: v[e[i]] for c, v in attrs.items()}, ctx)
        except Exception as err:
            raise DataError(
                f"{where} raised {type(err).__name__}: {err} for entity {entity_id} at split {split.date()}"
            ) from err
        if value is None:
            continue
        try:
            labels.append(_check(value, scenario.task, spec))
        except ValueError as err:
            raise DataError(f"{where} {err} for entity {entity_id} at split {split.date()}") from None
        keep.append(i)
    idx = np.asarray(keep, dtype=np.int64)
    if scenario.task == "multilabel":
        y = np.asarray(labels, np.float32).reshape(len(idx), len(spec.classes))
    elif scenario.task == "multiclass":
        y = np.asarray(labels, np.int64)
    else:
        y = np.asarray(labels, np.float32)
    return Examples(e[idx], t[idx], y)
