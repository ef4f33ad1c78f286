"""Access counting: how often each node's feature row is read in a superbatch, and in the round.

Per-superbatch counts are sparse (ids, counts) pairs so that a tree of pairwise merges
reduces them to round totals without any single task holding all samples.
"""
from __future__ import annotations

import os

import numpy as np

from ..formats.samples import read_n_ids


def count_superbatch(sample_path: str | os.PathLike[str], num_nodes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(ids, counts) of every node accessed in one superbatch file, ids ascending.

    With `num_nodes`, counts with one dense `bincount` (linear time) instead of sorting.
    """
    n_ids = read_n_ids(sample_path)
    if not n_ids:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cat = np.concatenate(n_ids)
    if num_nodes is None:
        ids, counts = np.unique(cat, return_counts=True)
        return ids.astype(np.int64), counts.astype(np.int64)
    dense = np.bincount(cat, minlength=num_nodes)
    ids = np.flatnonzero(dense)
    return ids.astype(np.int64), dense[ids].astype(np.int64)


def merge_counts(*parts: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Sum several sparse (ids ascending, counts) pairs into one.

    Ids are node ids, so the sum is scattered into a dense array over [0, largest id] (linear
    time: one scatter-add per part, ids are unique within a part) and read back sparse; this
    beats merging the sorted runs several times over at the sizes a round produces.
    """
    parts = tuple(p for p in parts if p[0].size)
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if len(parts) == 1:
        return parts[0]
    if min(int(p[0][0]) for p in parts) < 0:
        raise ValueError("merge_counts: negative node id")
    dense = np.zeros(max(int(p[0][-1]) for p in parts) + 1, dtype=np.int64)
    for ids, counts in parts:
        dense[ids] += counts
    ids = np.flatnonzero(dense)
    return ids.astype(np.int64, copy=False), dense[ids]


def dense_counts(part: tuple[np.ndarray, np.ndarray], num_nodes: int) -> np.ndarray:
    """Sparse counts as a dense int64 array of length `num_nodes`."""
    out = np.zeros(num_nodes, dtype=np.int64)
    out[part[0]] = part[1]
    return out
