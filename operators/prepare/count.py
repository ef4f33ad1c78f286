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

    Pairwise, each a linear merge of two sorted runs (a tree of merges calls it with two).
    """
    parts = tuple(p for p in parts if p[0].size)
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ids, counts = (np.ascontiguousarray(a, np.int64) for a in parts[0])
    if len(parts) == 1:
        return ids, counts
    for other in parts[1:]:
        ids, counts = kernels.merge_counts(ids, counts, *(np.ascontiguousarray(a, np.int64) for a in other))
    return ids, counts


def dense_counts(part: tuple[np.ndarray, np.ndarray], num_nodes: int) -> np.ndarray:
    """Sparse counts as a dense int64 array of length `num_nodes`."""
    out = np.zeros(num_nodes, dtype=np.int64)
    out[part[0]] = part[1]
    return out
