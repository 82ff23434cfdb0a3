"""What a scenario's candidate models read about a set of (entity, time) rows, computed once and lazily.

``Rows`` is the one place that turns trunk-input features into what each candidate needs:

    logits()      the scenario network's raw outputs                       [n, out]
    embedding()   the trunk's residual stream (the exported embedding)      [n, hidden]
    tabular()     the automatic aggregates as plain numbers                 [n, A]

The aggregates come from the trunk input's last block (features/sketch.py appends them, log-squashed). They
are rounded to float16 first, as the per-entity state (inference/state.py) stores its rows, so a tree split
learned in training sees exactly the numbers it will see when ``predict`` reads the state. An encoder
without aggregates has them computed from the cache instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from basemodel_pipeline import runtime
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.features.sketch import FeatureEncoder


class RowView:
    """Rows ``rows`` of a 2-D array without copying it: ``view[idx]`` is ``X[rows[idx]]``."""

    def __init__(self, X: np.ndarray, rows: np.ndarray | None = None) -> None:
        self.X, self.rows = X, rows

    def __len__(self) -> int:
        return len(self.X) if self.rows is None else len(self.rows)

    def __getitem__(self, idx: Any) -> np.ndarray:
        return self.X[idx] if self.rows is None else self.X[self.rows[idx]]

    def columns(self, start: int, stop: int | None = None) -> np.ndarray:
        block = self.X[:, start:stop]
        return np.asarray(block if self.rows is None else block[self.rows])


class _Embed(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net.embed(x)


def tabular_from_features(enc: FeatureEncoder, X: RowView) -> np.ndarray:
    """The aggregate block of trunk-input rows as plain numbers (float16-rounded, then un-squashed:
    sign(a) x expm1(|a|)), computed in one float32 array."""
    block = X.columns(enc.aggregate_offset).astype(np.float16, copy=False)
    A = runtime.host_array(block.shape, np.float32)
    A[...] = block
    negative = A < 0
    np.abs(A, out=A)
    np.expm1(A, out=A)
    return np.negative(A, out=A, where=negative)


@dataclass
class Rows:
    """(entity, time) rows of one split or one scoring chunk, with the features the network reads."""

    cache: EventCache
    enc: FeatureEncoder
    entity: np.ndarray  # int64 [n] entity index
    time: np.ndarray  # int64 [n] split time, epoch seconds
    X: RowView  # trunk input features [n, D]
    labels: Any = None  # Labels of the rows, when they are training or validation examples
    net: nn.Module | None = None  # the scenario network (TrunkWithHead)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    amp: Any = "cuda-bf16"
    memo: dict[str, np.ndarray] = field(default_factory=dict)
    # memo entries taken on first use from arrays of every distinct example, given the rows' positions in
    # them (X.rows): fine-tuning's frozen trunk outputs, embeddings and aggregates (scenarios/shared.py)
    deferred: dict[str, Callable[[np.ndarray], np.ndarray]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.entity)

    def subset(self, idx: np.ndarray) -> Rows:
        """Rows `idx` (memoised arrays sliced, labels taken, features still not copied)."""
        from basemodel_pipeline.targets.labels import take_labels

        idx = np.asarray(idx, np.int64)
        view = RowView(self.X.X, idx if self.X.rows is None else self.X.rows[idx])
        labels = None if self.labels is None else take_labels(self.labels, idx)
        memo = {k: v[idx] for k, v in self.memo.items()}
        return Rows(
            self.cache,
            self.enc,
            self.entity[idx],
            self.time[idx],
            view,
            labels,
            self.net,
            self.device,
            self.amp,
            memo,
            self.deferred,
        )

    def _take_deferred(self, key: str) -> bool:
        if key not in self.memo and key in self.deferred and self.X.rows is not None:
            self.memo[key] = self.deferred[key](self.X.rows)
        return key in self.memo

    def _forward(self, key: str, module: nn.Module) -> np.ndarray:
        if not self._take_deferred(key):
            if len(self) == 0:
                probe = runtime.predict(module, RowView(np.zeros((1, self.enc.dim), np.float32)), self.device)
                self.memo[key] = np.zeros((0, probe.shape[1]), np.float32)
            else:
                self.memo[key] = runtime.predict(module, self.X, self.device, amp=self.amp)
        return self.memo[key]

    def logits(self) -> np.ndarray:
        assert self.net is not None, "Rows.logits needs the scenario network"
        return self._forward("logits", self.net)

    def embedding(self) -> np.ndarray:
        if self._take_deferred("embedding"):  # a frozen trunk's: no network needed
            return self.memo["embedding"]
        assert self.net is not None, "Rows.embedding needs the scenario network"
        return self._forward("embedding", _Embed(self.net))

    def tabular(self) -> np.ndarray:
        if not self._take_deferred("tabular"):
            if self.enc.aggregate_dim:
                self.memo["tabular"] = tabular_from_features(self.enc, self.X)
            else:
                from basemodel_pipeline.features.aggregates import aggregate_features

                self.memo["tabular"] = aggregate_features(self.cache, self.entity, self.time)[0]
        return self.memo["tabular"]
