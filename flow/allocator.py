"""Undo Dask's allocator setting in a training worker, so that freed memory is reused instead of unmapped.

Dask's nanny starts every worker with ``MALLOC_TRIM_THRESHOLD_=65536`` (so that a worker's
memory returns to the system quickly). Setting that variable also fixes glibc's mmap threshold
at its 128 KiB default: every allocation above it is mapped, and unmapped again when freed.
A trainer on the CPU device allocates and frees tensors of megabytes per batch, so each batch
then faults in fresh zeroed pages: measured in `diskflow bench stream`, CPU training took about
twice as long. A GPU worker's host-side buffers (staging, pinned copies) behave the same way on
a smaller scale. `keep_freed_memory` raises both thresholds at runtime (glibc's ``mallopt``),
so allocations below `mmap_threshold` come from the heap and at most `trim_threshold` of free
heap is kept before it is given back.
"""
from __future__ import annotations

import ctypes

MMAP_THRESHOLD = 32 << 20       # glibc's largest: allocations below it come from the heap and are reused
TRIM_THRESHOLD = 256 << 20      # free memory the heap keeps before giving it back
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Let this process's allocator reuse freed memory; False where the C library is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):     # not glibc: nothing to undo
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold))) and bool(mallopt(_M_TRIM_THRESHOLD, int(trim_threshold)))


def describe(applied: bool) -> str:
    """How the allocator is set, in words (for reports)."""
    if applied:
        return f"reuse freed memory (mmap threshold {MMAP_THRESHOLD >> 20} MiB, trim {TRIM_THRESHOLD >> 20} MiB)"
    return "the worker's default (Dask: MALLOC_TRIM_THRESHOLD_=65536)"
