"""A scenario's target -> its spec and labelled examples from the event cache, each task building its own
(tasks/<task>.py, ``Task.choose_spec`` and ``Task.examples``; Python targets through targets/python.py).

Declarative targets are vectorised over all examples at once (CSR window rows, bincount); Python targets are
called per example. Labels with many columns (large multilabel, recommendation) are kept sparse
(``SparseLabels``, targets/labels.py) and densified one mini-batch at a time.
"""

from __future__ import annotations

import numpy as np

from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config.models import Scenario
from basemodel_pipeline.targets.labels import Examples, TargetSpec
from basemodel_pipeline.tasks import task_for, task_named


def choose_classes(cache: EventCache, scenario: Scenario, train_times: np.ndarray) -> TargetSpec:
    """The output space of a scenario, fixed on the training windows."""
    return task_named(scenario.task).spec_for(cache, scenario, train_times)


def build_examples(cache: EventCache, scenario: Scenario, spec: TargetSpec, times: np.ndarray) -> Examples:
    """The scenario's labelled examples at the split `times`."""
    return task_for(spec).labelled(cache, scenario, times)
