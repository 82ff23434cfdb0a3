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
from basemodel_pipeline.tasks import task_for


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
    task = task_for(spec)
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
            labels.append(task.check_label(value))
        except ValueError as err:
            raise DataError(f"{where} {err} for entity {entity_id} at split {split.date()}") from None
        keep.append(i)
    idx = np.asarray(keep, dtype=np.int64)
    return Examples(e[idx], t[idx], task.stack_labels(labels))
