"""Access counting: how often each node's feature row is read in a superbatch, and in the round.

Per-superbatch counts are sparse (ids, counts) pairs so that a tree of pairwise merges
reduces them to round totals without any single task holding all samples.
"""
from __future__ import annotations

import os

import numpy as np

from .samples import read_n_ids


def count_superbatch(sample_path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """(ids, counts) of every node accessed in one superbatch file, ids ascending."""
    n_ids = read_n_ids(sample_path)
    if not n_ids:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ids, counts = np.unique(np.concatenate(n_ids), return_counts=True)
    return ids.astype(np.int64), counts.astype(np.int64)


def merge_counts(*parts: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Sum several sparse (ids, counts) pairs into one."""
    parts = tuple(p for p in parts if p[0].size)
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ids = np.concatenate([p[0] for p in parts])
    counts = np.concatenate([p[1] for p in parts])
    uniq, inv = np.unique(ids, return_inverse=True)
    return uniq, np.bincount(inv, weights=counts, minlength=uniq.shape[0]).astype(np.int64)


def dense_counts(part: tuple[np.ndarray, np.ndarray], num_nodes: int) -> np.ndarray:
    """Sparse counts as a dense int64 array of length `num_nodes`."""
    out = np.zeros(num_nodes, dtype=np.int64)
    out[part[0]] = part[1]
    return out
