"""Access counting: how often each node's feature row is read in a superbatch, and in the round.

Per-superbatch counts are sparse (ids, counts) pairs so that a tree of pairwise merges
reduces them to round totals without any single task holding all samples. Counting and merging
run natively (`diskflow.native.count_ids`, `merge_counts`): one pass over the accesses, one over
the sorted runs, the GIL released.
"""
from __future__ import annotations

import os

import numpy as np

from ...native import kernels
from ..formats.samples import read_n_ids


def count_accesses(n_ids: list[np.ndarray], num_nodes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(ids ascending, counts) of every node in a superbatch's `n_id` arrays.

    `num_nodes` bounds the ids (checked); without it, the largest id does.
    """
    if not n_ids:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cat = np.concatenate(n_ids).astype(np.int64, copy=False)
    if num_nodes is None:
        if cat.size and int(cat.min()) < 0:
            raise ValueError(f"count: negative node id {int(cat.min())}")
        num_nodes = int(cat.max()) + 1 if cat.size else 0
    return kernels.count_ids(cat, num_nodes)


def count_superbatch(sample_path: str | os.PathLike[str], num_nodes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(ids, counts) of every node accessed in one superbatch file, ids ascending."""
    return count_accesses(read_n_ids(sample_path), num_nodes)


def merge_counts(*parts: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Sum several sparse (ids ascending, counts) pairs into one.

    A pairwise tree of linear merges of two sorted runs (each level touches every id once; the
    graph's count-merge tasks call it with two parts).
    """
    runs = [tuple(np.ascontiguousarray(a, np.int64) for a in p) for p in parts if p[0].size]
    if not runs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    while len(runs) > 1:
        runs = [kernels.merge_counts(*runs[i], *runs[i + 1]) if i + 1 < len(runs) else runs[i]
                for i in range(0, len(runs), 2)]
    return runs[0][0], runs[0][1]


def dense_counts(part: tuple[np.ndarray, np.ndarray], num_nodes: int) -> np.ndarray:
    """Sparse counts as a dense int64 array of length `num_nodes`."""
    out = np.zeros(num_nodes, dtype=np.int64)
    out[part[0]] = part[1]
    return out
