"""Drift of a model's input features between the population it was first scored on and today's.

The figure is the population stability index (PSI) per feature, averaged over features: each feature is cut
into the reference's deciles, and PSI = sum over bins of (p_now - p_ref) * ln(p_now / p_ref). Rules of thumb:
below 0.1 stable, 0.1-0.25 moderate, above 0.25 a shifted population. A scenario with `retrain: {when:
drift}` is retrained when the figure passes its `drift_threshold` (docs/orchestration.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

BINS = 10
EPS = 1e-4  # floor of a bin's share: an empty bin must not make PSI infinite
MAX_ROWS = 20_000


class RowSample:
    """Up to MAX_ROWS rows of the feature matrices streamed through scoring: every k-th row (k from the total)."""

    def __init__(self, total_rows: int, max_rows: int = MAX_ROWS) -> None:
        self.stride = max(1, -(-total_rows // max_rows))
        self.parts: list[np.ndarray] = []
        self.seen = 0

    def add(self, X: np.ndarray) -> None:
        first = (-self.seen) % self.stride
        # a copy: a view would keep every scored chunk alive (the whole population's features in memory)
        self.parts.append(np.array(X[first :: self.stride], dtype=np.float32))
        self.seen += len(X)

    def rows(self) -> np.ndarray:
        return np.concatenate(self.parts) if self.parts else np.zeros((0, 0), np.float32)


def reference(X: np.ndarray) -> dict[str, Any]:
    """Inner decile edges of each feature and the reference's share in each bin (JSON-ready)."""
    X = np.nan_to_num(np.asarray(X, np.float64))
    # (features, BINS - 1), rounded as stored, so that the reference scores exactly 0 against itself
    edges = np.quantile(X, np.linspace(0, 1, BINS + 1)[1:-1], axis=0).T.round(6)
    shares = np.stack([_shares(X[:, j], edges[j]) for j in range(X.shape[1])]) if X.shape[1] else edges
    return {"rows": int(len(X)), "edges": edges.tolist(), "shares": shares.tolist()}


def psi(ref: dict[str, Any], X: np.ndarray) -> float:
    """Mean PSI over features of `X` against a `reference` (0 for identical distributions)."""
    X = np.nan_to_num(np.asarray(X, np.float64))
    edges, base = np.asarray(ref["edges"]), np.asarray(ref["shares"])
    if X.shape[1] != len(edges) or len(X) == 0:
        raise ValueError(f"{X.shape[1]} features vs {len(edges)} in the reference, or no rows")
    values = []
    for j in range(X.shape[1]):
        now, before = np.maximum(_shares(X[:, j], edges[j]), EPS), np.maximum(base[j], EPS)
        values.append(float(np.sum((now - before) * np.log(now / before))))
    return float(np.mean(values)) if values else 0.0


def _shares(column: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Share of the rows in each of the bins cut at `edges` (ties go right, so a constant feature is stable)."""
    counts = np.bincount(np.searchsorted(edges, column, side="right"), minlength=len(edges) + 1)
    return counts / max(len(column), 1)
