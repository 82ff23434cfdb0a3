"""DLSH buckets (EMDE, arXiv 2006.01894): similar values share buckets, so a sketch of them generalises.

For each of P partitions, k = log2(W) random directions project every value's embedding; each projection is
cut at its data median (weighted by how often the value occurs), and the k bits name one of W buckets:

    bucket_p(v) = sum_j 2^j * [ <E_v, r_pj> > median_j ]

Values close in embedding space fall in the same bucket in most partitions; thresholds at data quantiles keep
buckets evenly filled. The result is a [P, vocab_size + 1] table; code 0 (missing) maps to bucket 0.
"""

from __future__ import annotations

import numpy as np


def is_power_of_two(n: int) -> bool:
    return n >= 2 and n & (n - 1) == 0


def dlsh_table(
    embeddings: np.ndarray, weights: np.ndarray, partitions: int, width: int, seed: int
) -> np.ndarray:
    """Bucket [P, V + 1] (0..width-1) of each value; embeddings [V + 1, d], weights [V + 1] (occurrences)."""
    if not is_power_of_two(width):
        raise ValueError(f"DLSH needs a power-of-two width, got {width}")
    bits = width.bit_length() - 1
    rng = np.random.default_rng([seed, 17])
    directions = rng.standard_normal((embeddings.shape[1], partitions * bits)).astype(np.float32)
    proj = embeddings @ directions  # [V + 1, P * bits]
    thresholds = weighted_median(proj[1:], np.asarray(weights[1:], np.float64))  # [P * bits]
    on = (proj > thresholds).reshape(len(proj), partitions, bits)
    table = (on * (1 << np.arange(bits))).sum(2).T.astype(np.int64)  # [P, V + 1]
    table[:, 0] = 0
    return table


def weighted_median(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per column of x [n, m]: the value where the cumulative weight (rows sorted by x) reaches half."""
    if len(x) == 0:
        return np.zeros(x.shape[1], x.dtype)
    w = w + 1e-9  # unseen values still count a little, so ties resolve deterministically
    order = np.argsort(x, axis=0, kind="stable")
    cum = np.cumsum(w[order], axis=0)
    k = (cum < cum[-1] / 2).sum(0)  # first row reaching half the weight
    return np.take_along_axis(x, order, 0)[np.minimum(k, len(x) - 1), np.arange(x.shape[1])]
