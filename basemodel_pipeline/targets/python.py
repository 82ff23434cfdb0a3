"""Python target functions: ``target: {kind: python, function: "my_pkg.targets:churn", ...}``.

The function is imported by its "module:name" reference and called once per candidate example (entities
with history in ``target.source`` before the split) as ``target(history, future, attributes, ctx)``. What it
must return, per task:

    binary       0 or 1 (a scalar or shape [1])         regression   a finite number (scalar or [1])
    multiclass   a class index in [0, C) or a class name multilabel   0/1 array of shape [C]

or ``None`` to drop the example. The module is trusted code: it runs in this process with the pipeline's
permissions (docs/scenarios.md, "Python targets"). Its import and each call are stopped after
``target.timeout_s`` (targets/time_limit.py). A module that fails to import, a function that raises
(SystemExit too), runs past the limit, returns another shape, or NaN/inf stops the stage with one line naming
the scenario and the function (and the first offending entity and split date); the original exception is
chained as the error's cause for library callers and logs.
"""

from __future__ import annotations

import datetime as dt
import importlib
import inspect
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow.parquet as pq

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config.models import PythonTarget, Scenario
from basemodel_pipeline.dates import DAY, epoch_seconds
from basemodel_pipeline.errors import ConfigError, DataError
from basemodel_pipeline.targets.events import Events, SourceEvents, TargetContext
from basemodel_pipeline.targets.labels import Examples, TargetSpec
from basemodel_pipeline.targets.time_limit import TimeLimit, TimeLimitExceeded
from basemodel_pipeline.targets.windows import candidate_pairs

USER_ERRORS = (Exception, SystemExit)  # what user code may raise that ends as one line (not Ctrl-C)


class Labeller(Protocol):
    """What a task gives a Python target: its spec (the classes), the check of one returned label and the
    label array of the kept ones (tasks/base.py, ``Task``)."""

    spec: TargetSpec

    def check_label(self, value: Any) -> Any: ...

    def stack_labels(self, labels: list[Any]) -> np.ndarray: ...


def described(err: BaseException, file: str | None = None) -> tuple[str, str]:
    """(`KeyError: 'x'`, ` (raised at targets.py:12)`), one line: where in `file` (the user's module) it was
    raised (the innermost frame there, else the innermost frame), or where a SyntaxError points ('' unknown)."""
    text = " ".join(str(err.msg if isinstance(err, SyntaxError) else err).split())
    text = text if len(text) <= 200 else text[:197] + "..."
    at = None
    if isinstance(err, SyntaxError) and err.filename:
        at = (err.filename, err.lineno)
    else:
        frames = traceback.extract_tb(err.__traceback__)
        own = [f for f in frames if file is not None and f.filename == file]
        if own or frames:
            frame = (own or frames)[-1]
            at = (frame.filename, frame.lineno)
    origin = f" (raised at {Path(at[0]).name}:{at[1]})" if at else ""
    return f"{type(err).__name__}{': ' + text if text else ''}", origin


def load_function(scenario: Scenario) -> Callable[..., Any]:
    """The target function, imported within target.timeout_s; ConfigError (one line) when the module cannot
    be imported, fails while importing, or has no such function."""
    target = scenario.target
    assert isinstance(target, PythonTarget)
    module_name, _, name = target.function.partition(":")
    where = f"scenario '{scenario.name}': target.function '{target.function}'"
    try:
        with TimeLimit(target.timeout_s) as limit:
            module = limit.call(importlib.import_module, module_name)
    except TimeLimitExceeded:
        raise ConfigError(
            f"{where}: importing module '{module_name}' took longer than {target.timeout_s:g} s "
            "(target.timeout_s); make its import fast (no work at module level) or raise target.timeout_s"
        ) from None
    except ModuleNotFoundError as err:
        if err.name != module_name and not module_name.startswith(f"{err.name}."):
            what, origin = described(err)
            raise ConfigError(f"{where}: importing module '{module_name}' raised {what}{origin}") from err
        raise ConfigError(
            f"{where}: cannot import module '{module_name}' ({err}); put it next to the config file or on "
            "PYTHONPATH"
        ) from None
    except USER_ERRORS as err:
        what, origin = described(err)
        raise ConfigError(
            f"{where}: importing module '{module_name}' raised {what}{origin}; fix the module"
        ) from err
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(
            f"scenario '{scenario.name}': target.function '{target.function}': module '{module_name}' has no "
            f"function '{name}'"
        )
    return fn


def function_source(scenario: Scenario) -> str | None:
    """Source code of a Python target's function (stored beside the checkpoint), or None when unavailable
    (a declarative target has none)."""
    if not isinstance(scenario.target, PythonTarget):
        return None
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


def python_examples(cache: EventCache, scenario: Scenario, task: Labeller, times: np.ndarray) -> Examples:
    """The examples the target function labels (None drops one), each label checked by `task`."""
    target, spec = scenario.target, task.spec
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
    file = getattr(inspect.getmodule(fn), "__file__", None)
    with TimeLimit(target.timeout_s) as limit:
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
            at = f"for entity {entity_id} at split {split.date()}"
            try:
                value = limit.call(fn, history, future, {c: v[e[i]] for c, v in attrs.items()}, ctx)
            except TimeLimitExceeded:
                raise DataError(
                    f"{where} took longer than {target.timeout_s:g} s (target.timeout_s) {at}; make it faster, "
                    "or raise target.timeout_s if it needs the time"
                ) from None
            except USER_ERRORS as err:
                what, origin = described(err, file)
                raise DataError(f"{where} raised {what} {at}{origin}") from err
            if value is None:
                continue
            try:
                labels.append(task.check_label(value))
            except ValueError as err:
                raise DataError(f"{where} {err} {at}") from None
            keep.append(i)
    idx = np.asarray(keep, dtype=np.int64)
    return Examples(e[idx], t[idx], task.stack_labels(labels))
