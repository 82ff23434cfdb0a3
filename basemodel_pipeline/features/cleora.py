"""Cleora embeddings of a categorical column's values (arXiv 2102.02302), from the event cache, without SGD.

Hypergraph: every basket (an entity's events of one UTC day) and every entity's whole history is a hyperedge
over the values (e.g. products) it contains. From a deterministic random start, each iteration averages the
value vectors within each hyperedge, then averages those hyperedge vectors back onto each value, and
L2-normalises the rows:

    T <- rownorm_L2( Dv^-1 B^T De^-1 B T )        B: [hyperedges, values] incidence (0/1)

Values that co-occur end up close. The graph is built from a bounded sample of entities
(``max_events``), the propagation runs over column blocks of T, so memory stays bounded whatever the data size.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from basemodel_pipeline.cache.store import EventSource, expand_ranges
from basemodel_pipeline.dates import DAY

COLUMN_BLOCK = 32  # embedding columns propagated at a time


def sample_rows(src: EventSource, max_events: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(entity position in the sample, event row) for a random sample of whole entities of ~max_events events."""
    lengths = np.diff(np.asarray(src.offsets, np.int64))
    ents = np.arange(len(lengths))
    if lengths.sum() > max_events:
        perm = np.random.default_rng([seed, 11]).permutation(len(lengths))
        ents = np.sort(perm[: max(1, int(np.searchsorted(np.cumsum(lengths[perm]), max_events)))])
    return expand_ranges(src.offsets[ents], src.offsets[ents + 1])


def incidence(src: EventSource, column: str, max_events: int, seed: int) -> sp.csr_matrix:
    """0/1 matrix [baskets + entities, vocab_size + 1] of which values each hyperedge contains."""
    owner, rows = sample_rows(src, max_events, seed)
    codes = np.asarray(src.columns[column][rows], np.int64)
    day = np.asarray(src.ts[rows], np.int64) // DAY
    known = codes > 0  # code 0 = missing value: no vertex
    owner, codes, day = owner[known], codes[known], day[known]
    _, basket = np.unique(owner * (day.max(initial=0) + 1) + day, return_inverse=True)
    n_baskets = int(basket.max(initial=-1)) + 1
    edge = np.concatenate([basket, n_baskets + owner])
    vertex = np.concatenate([codes, codes])
    n_edges = n_baskets + int(owner.max(initial=-1)) + 1
    B = sp.csr_matrix(
        (np.ones(len(edge), np.float32), (edge, vertex)), shape=(n_edges, src.info[column].vocab_size + 1)
    )
    B.data[:] = 1.0  # a value bought twice in a basket is still one member
    return B


def cleora(B: sp.csr_matrix, dim: int, iterations: int, seed: int) -> np.ndarray:
    """Embeddings [vocab_size + 1, dim] float32, rows L2-normalised (row 0, the missing value, stays random)."""
    rng = np.random.default_rng([seed, 13])
    T = _rownorm(rng.uniform(-1.0, 1.0, size=(B.shape[1], dim)).astype(np.float32))
    edge_size = np.asarray(B.sum(1)).ravel()
    degree = np.asarray(B.sum(0)).ravel()
    inv_e = (1.0 / np.maximum(edge_size, 1.0)).astype(np.float32)
    inv_v = (1.0 / np.maximum(degree, 1.0)).astype(np.float32)
    seen = degree > 0
    Bt = B.T.tocsr()
    for _ in range(iterations):
        new = T.copy()  # values never seen keep their start vector
        for a in range(0, dim, COLUMN_BLOCK):
            H = (B @ T[:, a : a + COLUMN_BLOCK]) * inv_e[:, None]  # [edges, block]: mean per hyperedge
            new[seen, a : a + COLUMN_BLOCK] = ((Bt @ H) * inv_v[:, None])[seen]
        T = _rownorm(new)
    return T


def _rownorm(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
