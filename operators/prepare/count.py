"""Access counting: how often each node's feature row is read in a superbatch, and in the round.

Per-superbatch counts are sparse (ids, counts) pairs so that a tree of pairwise merges
reduces them to round totals without any single task holding all samples. Counting and merging
run natively (`diskflow.native.count_ids`, `merge_counts`): one pass over the accesses, one over
the sorted runs, the GIL released.

Where a superbatch reads a large share of the graph (its accesses at least a quarter of the
nodes), the preparation graph counts it densely instead (`superbatch_counts`: an array of N in the
narrowest type its batches allow, uint8 below 256 batches, counted natively from the samples' own
id arrays: no concatenation, no widening, no fresh int64 temporaries, whose first-touch page
zeroing cost more than the counting): merges that are one vector addition beat building,
returning and merging sorted runs of millions of ids. `add_counts` merges either kind, widening
as sums require (uint8 to uint16 to int32, int64 only where an int32 sum could overflow);
`as_sparse` and `dense_counts` convert.
"""
from __future__ import annotations

import os

import numpy as np

from ...errors import InputError
from ...native import kernels
from ..formats.directwrite import write_npz
from ..formats.intwidth import narrow_int
from ..formats.npyio import load_npz
from ..formats.samples import read_n_ids

__all__ = ["DENSE_SHARE", "Counts", "add_counts", "as_sparse", "count_accesses", "count_superbatch",
           "dense_counts", "load_counts", "merge_counts", "save_counts", "superbatch_counts"]


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


Counts = tuple[np.ndarray, np.ndarray] | np.ndarray     # sparse (ids ascending, counts) or dense [N] (any integer type)

DENSE_SHARE = 4     # count densely when the nodes are at most 4 x the accesses
_INT32_MAX = np.iinfo(np.int32).max


def superbatch_counts(n_ids: list[np.ndarray], num_nodes: int) -> Counts:
    """A superbatch's access counts: dense ([num_nodes], `kernels.count_dense`, uint8 for fewer than 256
    batches: a node is counted at most once per batch) when its accesses are at least a quarter of the
    nodes, else sparse (`count_accesses`).

    Raises:
        ValueError: a node id outside [0, num_nodes).
    """
    bad = next((a.dtype for a in n_ids if a.dtype.kind not in "iu"), None)
    if bad is not None:
        raise ValueError(f"nodes: expected integer node ids, got dtype {bad}")
    accesses = sum(int(a.shape[0]) for a in n_ids)
    if not n_ids or num_nodes > DENSE_SHARE * accesses:
        return count_accesses(n_ids, num_nodes)
    if accesses > _INT32_MAX:       # a count could pass int32: numpy's int64 bincount, its ids checked first
        cat = np.concatenate(n_ids).astype(np.int64, copy=False)
        if cat.size and (int(cat.min()) < 0 or int(cat.max()) >= num_nodes):
            out_of_range = int(cat.min()) if int(cat.min()) < 0 else int(cat.max())
            raise ValueError(f"nodes: node id {out_of_range} is outside [0, {num_nodes})")
        return np.bincount(cat, minlength=num_nodes)
    ids = [a if a.dtype in (np.int32, np.int64) and a.flags.c_contiguous else np.ascontiguousarray(a, np.int64)
           for a in n_ids]
    out = np.zeros(num_nodes, dtype=_narrow_count_type(len(ids)))
    if out.dtype != np.int32:
        try:
            kernels.count_dense(ids, out)
            return out
        except OverflowError:    # ids repeated within a batch: count again in int32, which cannot overflow here
            out = np.zeros(num_nodes, dtype=np.int32)
    kernels.count_dense(ids, out)
    return out


def _narrow_count_type(batches: int) -> type[np.integer]:
    """The narrowest count type for `batches` arrays of unique ids (each node counted at most once per
    array): uint8 below 256 batches, uint16 below 65536, else int32."""
    return np.uint8 if batches < 256 else np.uint16 if batches < 65536 else np.int32


def _dense_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b of two dense counts in a type no sum can pass: uint8 + uint8 in uint16 and sums of 16-bit
    counts in int32 (no check needed), else int32 when the two maxima allow it, else int64."""
    if a.itemsize <= 2 and b.itemsize <= 2:
        return np.add(a, b, dtype=np.uint16 if a.itemsize == b.itemsize == 1 else np.int32)
    narrow = a.itemsize <= 4 and b.itemsize <= 4 and int(a.max(initial=0)) + int(b.max(initial=0)) <= _INT32_MAX
    return np.add(a, b, dtype=np.int32 if narrow else np.int64)


def add_counts(a: Counts, b: Counts) -> Counts:
    """The sum of two counts of either kind (dense if either is); the inputs are left as they were."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return _dense_sum(a, b)
    if isinstance(b, np.ndarray):
        a, b = b, a
    if isinstance(a, np.ndarray):
        # in int32 where the sum must fit (a 16-bit dense count needs no scan), so the merges above this
        # one stay in int32 too: an int64 total doubles every later merge's bytes
        ids, cnt = np.asarray(b[0], np.int64), np.asarray(b[1])
        top = int(np.iinfo(a.dtype).max) if a.itemsize <= 2 else int(a.max(initial=0))
        wide = a.itemsize > 4 or top + int(cnt.max(initial=0)) > _INT32_MAX
        out = a.astype(np.int64 if wide else np.int32)
        out[ids] += cnt.astype(out.dtype, copy=False)     # ids are unique: no lost updates
        return out
    assert not isinstance(b, np.ndarray)    # both sparse here
    return merge_counts(a, b)


def as_sparse(c: Counts) -> tuple[np.ndarray, np.ndarray]:
    """Counts as (ids ascending, counts) of the nodes read at least once."""
    if isinstance(c, np.ndarray):
        ids = np.flatnonzero(c).astype(np.int64)
        return ids, c[ids].astype(np.int64, copy=False)
    return c


def dense_counts(part: Counts, num_nodes: int) -> np.ndarray:
    """Counts as a dense array of length `num_nodes`: int32 where they already are (a round's merged counts,
    which the planner reads as they are: an int64 copy is 8 bytes a node of fresh memory on the serial path
    before the first plan), else int64."""
    if isinstance(part, np.ndarray):
        if part.shape[0] != num_nodes:
            raise ValueError(f"dense counts of {part.shape[0]} nodes, expected {num_nodes}")
        return part if part.dtype == np.int32 else part.astype(np.int64, copy=False)
    out = np.zeros(num_nodes, dtype=np.int64)
    out[part[0]] = part[1]
    return out


def save_counts(path: str | os.PathLike[str], counts: Counts, parents: bool = True) -> None:
    """Write round counts to an ``.npz`` atomically: dense counts as they are (member ``dense``, at most int32 where
    they fit), sparse ones as (``ids``, ``counts``). Dense counts are written whole: picking out the nodes
    read at least once cost more than writing the zeros."""
    arrays = {"dense": narrow_int(counts)} if isinstance(counts, np.ndarray) else \
        {"ids": narrow_int(counts[0]), "counts": narrow_int(counts[1])}
    write_npz(path, arrays, parents=parents)


def load_counts(path: str | os.PathLike[str]) -> Counts:
    """Counts written by `save_counts` (dense, or sparse pairs).

    Raises:
        InputError: the file lacks both forms.
    """
    saved = load_npz(path)
    if "dense" in saved:
        return saved["dense"]
    if "ids" in saved and "counts" in saved:
        return saved["ids"].astype(np.int64, copy=False), saved["counts"].astype(np.int64, copy=False)
    raise InputError(path, f"access counts file holds {sorted(saved)}, expected 'dense' or 'ids' and 'counts'")
