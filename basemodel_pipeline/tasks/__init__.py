"""The task types of a scenario, one class each (docs/tasks.md): importing the package registers the five."""

from basemodel_pipeline.tasks import binary, multiclass, multilabel, recommendation, regression
from basemodel_pipeline.tasks.base import (
    TASKS,
    Task,
    register,
    spec_from_dict,
    task_for,
    task_named,
    unregister,
)

__all__ = [
    "TASKS",
    "Task",
    "binary",
    "multiclass",
    "multilabel",
    "recommendation",
    "register",
    "regression",
    "spec_from_dict",
    "task_for",
    "task_named",
    "unregister",
]
