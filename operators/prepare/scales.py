"""Per-column statistics of a store's feature rows, for the int8 row codec's "column" scales.

An int8 "column" codec (`formats.rowcodec`) needs each column's absolute maximum over every row it will
encode. The store's feature shards are read one at a time, so the statistics are a reduction: `shard_stats`
gives one shard's partial (its columns' absolute maxima), `combine_stats` merges partials (an elementwise
maximum: associative and commutative, so any tree of merges gives the same bits), and `flow.prepare.scales`
runs them as a Dask graph, one task per shard.

A NaN or infinite value has no absolute maximum worth the name: it is refused where it is found, naming the
shard file and the row (within the shard, and as the node it is).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ...errors import InputError
from ..formats.store import Store

__all__ = ["CHUNK_BYTES", "ColumnStats", "array_absmax", "combine_stats", "shard_stats"]

CHUNK_BYTES = 16 << 20      # rows are reduced this many bytes at a time: |x| of a chunk is the one temporary


@dataclass(frozen=True)
class ColumnStats:
    """The columns' absolute maxima over some rows of a store.

    Attributes:
        absmax: float32 [dim]: max |x| of each column (0 for a column of zeros, or no rows).
        rows: the rows they cover.
        bytes_read: the feature bytes read to compute them.
    """

    absmax: np.ndarray
    rows: int
    bytes_read: int = 0

    def __sizeof__(self) -> int:      # `dask.sizeof`: the maxima
        return object.__sizeof__(self) + self.absmax.nbytes


def array_absmax(rows: np.ndarray, where: str | os.PathLike[str] = "rows", first_node: int = 0,
                 chunk_bytes: int = CHUNK_BYTES) -> np.ndarray:
    """max |x| of each column of `rows` [n, dim] as float32 [dim], a chunk of about `chunk_bytes` at a time.

    Raises:
        InputError: a NaN or infinite value: `where` (the shard file) and the first such value's row (within
            `rows` and as node ``first_node + row``) and column.
    """
    n, dim = rows.shape
    out = np.zeros(dim, dtype=np.float32)
    step = max(1, chunk_bytes // max(1, dim * rows.dtype.itemsize))
    for lo in range(0, n, step):
        np.maximum(out, np.abs(rows[lo:lo + step]).max(axis=0), out=out)     # NaN and infinity carry through
    if np.isfinite(out).all():
        return out
    for lo in range(0, n, step):
        bad = np.argwhere(~np.isfinite(rows[lo:lo + step]))
        if bad.size:
            r, c = lo + int(bad[0, 0]), int(bad[0, 1])
            raise InputError(where, f"non-finite feature value {float(rows[r, c])!r} at row {r} (node {first_node + r}), "
                                    f"column {c}: int8 scales need finite features")
    raise AssertionError("unreachable: a non-finite maximum without a non-finite value")


def shard_stats(store_path: str | os.PathLike[str], p: int) -> ColumnStats:
    """The absolute maxima of feature shard `p`'s columns, the shard read through its memory map (its
    checksums checked from the bytes read, where the store has them).

    Raises:
        InputError: a NaN or infinite value (naming the shard file and row), or a checksum mismatch.
    """
    store = Store(store_path)
    shard = store.shards[p]
    rows = store.shard_array(p)
    if rows.size and store.checks.active:
        store.checks.check_view(shard.path, shard.offset, rows, "computing int8 scales")
    return ColumnStats(array_absmax(rows, shard.path, shard.row_start), shard.rows, int(rows.nbytes))


def combine_stats(*parts: ColumnStats) -> ColumnStats:
    """Several partials' statistics merged: the elementwise maximum, the rows and bytes summed.

    Raises:
        ValueError: no partial, or partials of different widths.
    """
    if not parts:
        raise ValueError("combine_stats: no statistics to combine")
    widths = {p.absmax.shape for p in parts}
    if len(widths) > 1:
        raise ValueError(f"combine_stats: statistics of different widths {sorted(widths)}")
    absmax = np.maximum.reduce([p.absmax for p in parts]) if len(parts) > 1 else parts[0].absmax.copy()
    return ColumnStats(absmax.astype(np.float32, copy=False), sum(p.rows for p in parts),
                       sum(p.bytes_read for p in parts))
