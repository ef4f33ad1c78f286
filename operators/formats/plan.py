"""The plan format: where every row of a batch comes from (GPU tier, CPU tier, disk), and its file.

A superbatch's plan is held as `SuperbatchPlan` (one `BatchPlan` per batch) and stored as one .npz
of the per-batch arrays concatenated, with offsets. The planners that make plans live in
`operators.prepare.plan`; the loader and `verify` only read them.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import numpy as np

from ...errors import InputError
from .directwrite import write_npz
from .intwidth import fits_int32
from .npyio import load_npz

__all__ = ["SRC_CPU", "SRC_GPU", "SRC_MISS", "BatchPlan", "SuperbatchPlan", "load_plan", "save_plan"]

SRC_GPU, SRC_CPU, SRC_MISS = 0, 1, 2


@dataclass
class BatchPlan:
    """Where each row of one batch comes from, and the CPU-cache inserts applied after it.

    Attributes:
        src: uint8 [n]: `SRC_GPU`, `SRC_CPU` or `SRC_MISS` per position of `n_id`.
        idx: int64 [n]: the GPU slot, the CPU slot, or for a miss its rank among the batch's
            misses (0..misses-1 in `n_id` order, i.e. its row in the batch's packed chunk).
        insert_pos: int64 [m]: positions in `n_id` whose (missed) rows are inserted after the batch.
        insert_slot: int64 [m]: the CPU slot each of them goes to (distinct).
    """

    src: np.ndarray
    idx: np.ndarray
    insert_pos: np.ndarray
    insert_slot: np.ndarray

    @property
    def misses(self) -> int:
        """Rows of this batch read from disk."""
        return int(np.count_nonzero(self.src == SRC_MISS))

    def __sizeof__(self) -> int:
        """Bytes held, arrays included: what Dask's memory accounting (`dask.sizeof`) counts for it."""
        return object.__sizeof__(self) + sum(a.nbytes for a in (self.src, self.idx, self.insert_pos, self.insert_slot))


@dataclass
class SuperbatchPlan:
    """The plans of consecutive batches, with the CPU cache they leave behind.

    Attributes:
        batches: one `BatchPlan` per batch.
        final_cache: int64 [C]: node per CPU slot after the last batch (-1 = empty); the next
            superbatch's plan starts from it.
        hits, misses, gpu_hits: access counts over all batches (CPU hits, disk reads, GPU hits).
    """

    batches: list[BatchPlan]
    final_cache: np.ndarray
    hits: int
    misses: int
    gpu_hits: int

    @property
    def inserts(self) -> int:
        """Rows copied into the CPU cache over the superbatch."""
        return int(sum(b.insert_pos.shape[0] for b in self.batches))

    def __sizeof__(self) -> int:
        """Bytes held, the batches' plans included (`dask.sizeof`)."""
        return object.__sizeof__(self) + self.final_cache.nbytes + sum(sys.getsizeof(b) for b in self.batches)


def save_plan(path: str | os.PathLike[str], plan: SuperbatchPlan, parents: bool = True) -> None:
    """Write a `SuperbatchPlan` atomically, past the page cache (`directwrite.write_npz`; `parents=False`: into an
    existing directory only, see `atomic.atomic_path`)."""
    b = plan.batches
    offsets = np.r_[0, np.cumsum([p.src.shape[0] for p in b])].astype(np.int64)
    ins_offsets = np.r_[0, np.cumsum([p.insert_pos.shape[0] for p in b])].astype(np.int64)
    idx_dt = _narrow([p.idx for p in b] + [p.insert_pos for p in b] + [p.insert_slot for p in b])
    write_npz(path, {"offsets": offsets, "ins_offsets": ins_offsets,
                     "src": _cat([p.src for p in b], np.dtype(np.uint8)), "idx": _cat([p.idx for p in b], idx_dt),
                     "insert_pos": _cat([p.insert_pos for p in b], idx_dt),
                     "insert_slot": _cat([p.insert_slot for p in b], idx_dt),
                     "final_cache": np.asarray(plan.final_cache, np.int64),
                     "counts": np.array([plan.hits, plan.misses, plan.gpu_hits], np.int64)}, parents=parents)


def _narrow(arrays: list[np.ndarray]) -> np.dtype:
    """int32 when every value fits (slots and ranks always do in practice: half the plan file's bytes), else int64."""
    return np.dtype(np.int32) if fits_int32(arrays) else np.dtype(np.int64)


def _cat(arrays: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """The arrays end to end as `dtype`, converted in the one copy the concatenation makes."""
    if not arrays:
        return np.zeros(0, dtype)
    return np.concatenate(arrays, dtype=dtype, casting="unsafe")     # `_narrow` checked the range


def load_plan(path: str | os.PathLike[str]) -> SuperbatchPlan:
    """Read a plan written by `save_plan`."""
    try:
        d = load_npz(path)
    except (OSError, ValueError, KeyError) as e:
        raise InputError(path, f"unreadable plan file ({e})") from e
    cuts, icuts = d["offsets"][1:-1], d["ins_offsets"][1:-1]
    wide = (lambda name: np.asarray(d[name], dtype=np.int64))      # saved as int32 where the values fit
    batches = [BatchPlan(s, i, p, q) for s, i, p, q in zip(
        np.split(d["src"], cuts), np.split(wide("idx"), cuts),
        np.split(wide("insert_pos"), icuts), np.split(wide("insert_slot"), icuts))]
    hits, misses, gpu_hits = (int(x) for x in d["counts"])
    return SuperbatchPlan(batches, d["final_cache"], hits, misses, gpu_hits)
