"""The width of stored integers: ids and addresses are written as int32 where every value fits (half
the bytes of int64), so arithmetic on what is read back must widen first (`byte_offsets`)."""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

__all__ = ["byte_offsets", "fits_int32", "narrow_int"]


def fits_int32(arrays: Iterable[np.ndarray]) -> bool:
    """Every value of every (integer) array is within int32's range."""
    lo, hi = np.iinfo(np.int32).min, np.iinfo(np.int32).max
    return all(a.size == 0 or (int(a.min()) >= lo and int(a.max()) <= hi) for a in map(np.asarray, arrays))


def narrow_int(a: np.ndarray) -> np.ndarray:
    """`a` as int32 when every value fits (half the bytes of an int64 array written to a cache file), else
    as it is; readers widen what they load."""
    a = np.asarray(a)
    return a.astype(np.int32) if a.dtype.kind in "iu" and a.itemsize > 4 and fits_int32([a]) else a


def byte_offsets(rows: np.ndarray, row_bytes: int, base: int | np.ndarray = 0) -> np.ndarray:
    """int64 byte offsets ``base + rows * row_bytes`` of fixed-size rows in a file.

    Ids and addresses are stored as int32 where they fit, and NumPy keeps an int32 array's
    dtype when it is multiplied by a Python int: a row past 2 GiB / row_bytes would wrap to a
    negative offset. Every offset computed from a row, id, slot or address goes through here,
    promoted to int64 before the multiplication.
    """
    return np.asarray(rows).astype(np.int64, copy=False) * np.int64(row_bytes) + np.asarray(base, np.int64)
