"""What the page cache holds of a file, asked without reading it: `mincore` over a map of the range, through
libc (ctypes). Packing reads a chunk the page cache mostly holds through it (a copy) and any other with
O_DIRECT; a read-ahead shard still cached is mapped instead of read.
"""
from __future__ import annotations

import mmap
from typing import Any

import numpy as np

__all__ = ["cached_share"]


def _libc() -> Any:
    """libc through ctypes, with the signatures `cached_share` calls (None where it cannot be loaded)."""
    lib = getattr(_libc, "lib", False)
    if lib is False:
        import ctypes

        try:
            lib = ctypes.CDLL(None, use_errno=True)
            lib.mmap.restype = ctypes.c_void_p
            lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                 ctypes.c_long]
            lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        except (OSError, AttributeError):
            lib = None
        _libc.lib = lib  # type: ignore[attr-defined]
    return lib


def cached_share(fd: int, offset: int, nbytes: int) -> float:
    """The share of the pages of file bytes [offset, offset + nbytes) that the page cache holds (mincore on
    a map of the range, which reads nothing); 1.0 where that cannot be asked, so callers read buffered."""
    import ctypes

    lib = _libc()
    if lib is None or nbytes <= 0:
        return 1.0
    lo = offset - offset % mmap.PAGESIZE
    length = offset + nbytes - lo
    addr = lib.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, lo)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        return 1.0
    try:
        vec = np.zeros(-(-length // mmap.PAGESIZE), dtype=np.uint8)
        if lib.mincore(addr, length, vec.ctypes.data) != 0:
            return 1.0
    finally:
        lib.munmap(addr, length)
    return float(np.count_nonzero(vec & 1)) / vec.shape[0]
