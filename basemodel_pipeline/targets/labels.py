"""Labelled examples and what they are made of: the labels (dense or ``SparseLabels``), ``Examples`` (entity
index, split time, label) and the ``TargetSpec`` a checkpoint stores. Each task builds them from its
declarative target (tasks/<task>.py, ``Task.examples``); Python targets (targets/python.py) too."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict


@dataclass
class SparseLabels:
    """Row-compressed labels [n, n_cols]: row i holds columns indices[indptr[i]:indptr[i+1]] with values."""

    indptr: np.ndarray  # int64 [n + 1]
    indices: np.ndarray  # int64 [nnz]
    values: np.ndarray  # float32 [nnz]
    n_cols: int

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.indptr) - 1, self.n_cols

    def __len__(self) -> int:
        return len(self.indptr) - 1

    def rows(self, idx: np.ndarray) -> SparseLabels:
        idx = np.asarray(idx, dtype=np.int64)
        lo, hi = self.indptr[idx], self.indptr[idx + 1]
        lengths = hi - lo
        take = np.repeat(lo - np.r_[0, np.cumsum(lengths)[:-1]], lengths) + np.arange(lengths.sum())
        return SparseLabels(np.r_[0, np.cumsum(lengths)], self.indices[take], self.values[take], self.n_cols)

    def dense(self, idx: np.ndarray | None = None) -> np.ndarray:
        part = self if idx is None else self.rows(idx)
        out = np.zeros(part.shape, dtype=np.float32)
        owner = np.repeat(np.arange(len(part)), np.diff(part.indptr))
        out[owner, part.indices] = part.values
        return out

    @classmethod
    def from_pairs(
        cls, owner: np.ndarray, col: np.ndarray, value: np.ndarray, n: int, n_cols: int
    ) -> SparseLabels:
        order = np.lexsort((col, owner))
        indptr = np.r_[0, np.cumsum(np.bincount(owner, minlength=n))].astype(np.int64)
        return cls(indptr, col[order].astype(np.int64), value[order].astype(np.float32), n_cols)


Labels = np.ndarray | SparseLabels


def take_labels(labels: Labels, idx: np.ndarray) -> Labels:
    return labels.rows(idx) if isinstance(labels, SparseLabels) else labels[idx]


def dense_labels(labels: Labels, idx: np.ndarray | None = None) -> np.ndarray:
    if isinstance(labels, SparseLabels):
        return labels.dense(idx)
    return labels if idx is None else labels[idx]


def label_columns(labels: Labels, cols: np.ndarray) -> np.ndarray:
    """Dense [n, len(cols)] of the given label columns (without densifying the others)."""
    if not isinstance(labels, SparseLabels):
        return np.asarray(labels)[:, cols]
    lut = np.full(labels.n_cols, -1, np.int64)
    lut[np.asarray(cols, np.int64)] = np.arange(len(cols))
    owner = np.repeat(np.arange(len(labels)), np.diff(labels.indptr))
    j = lut[labels.indices]
    out = np.zeros((len(labels), len(cols)), np.float32)
    out[owner[j >= 0], j[j >= 0]] = labels.values[j >= 0]
    return out


@dataclass
class Examples:
    entity: np.ndarray  # int64 [n] entity index
    time: np.ndarray  # int64 [n] split time, epoch seconds
    labels: (
        Labels  # binary/regression [n]; multiclass [n] int class; multilabel [n, C]; recommendation sparse
    )

    def __len__(self) -> int:
        return len(self.entity)

    def subset(self, keep: np.ndarray) -> Examples:
        idx = np.flatnonzero(keep) if np.asarray(keep).dtype == bool else np.asarray(keep)
        return Examples(self.entity[idx], self.time[idx], take_labels(self.labels, idx))


def concat_examples(parts: list[Examples]) -> Examples:
    """The rows of several Examples, in order (dense or sparse labels alike)."""
    labels = [p.labels for p in parts]
    if isinstance(labels[0], SparseLabels):
        sizes = np.cumsum([0] + [lab.indptr[-1] for lab in labels[:-1]])
        indptr = np.concatenate(
            [[0]] + [lab.indptr[1:] + off for lab, off in zip(labels, sizes, strict=True)]
        )
        merged: Labels = SparseLabels(
            indptr.astype(np.int64),
            np.concatenate([lab.indices for lab in labels]),
            np.concatenate([lab.values for lab in labels]),
            labels[0].n_cols,
        )
    else:
        merged = np.concatenate([np.asarray(lab) for lab in labels])
    return Examples(
        np.concatenate([p.entity for p in parts]), np.concatenate([p.time for p in parts]), merged
    )


class TargetDetails(BaseModel):
    """What a task's head needs beyond its classes, stored with the target spec in model.json: one record per
    task type, declared beside the task (``Task.details`` in tasks/<task>.py; binary and multiclass need
    nothing and use this empty one). Fields are checked on construction and on assignment, so a misspelt or
    mistyped field is an error where it is written, not a ``KeyError`` where it is read."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def with_values(self, **values: Any) -> TargetDetails:
        """A copy with `values` set, checked like the record's constructor."""
        return type(self).model_validate({**self.model_dump(), **values})


@dataclass
class TargetSpec:
    """What a trained scenario needs to rebuild its labels and decode its outputs: stored in the checkpoint
    (``to_dict``: the task, the classes and the details' fields side by side)."""

    task: str
    classes: list[str]  # class names (multiclass/multilabel); [] otherwise
    class_codes: list[int]  # vocabulary codes of the classes in the target column ([] for python targets)
    details: TargetDetails = field(default_factory=TargetDetails)

    def to_dict(self) -> dict:
        details = self.details.model_dump(mode="json", exclude_none=True)
        return {"task": self.task, "classes": self.classes, "class_codes": self.class_codes, **details}

    @classmethod
    def from_dict(cls, d: dict, details: type[TargetDetails] = TargetDetails) -> TargetSpec:
        """The spec `to_dict` wrote; `details`: the task's record (tasks.spec_from_dict looks it up)."""
        rest = {k: v for k, v in d.items() if k not in ("task", "classes", "class_codes")}
        return cls(
            d["task"],
            list(d.get("classes", [])),
            list(d.get("class_codes", [])),
            details.model_validate(rest),
        )
