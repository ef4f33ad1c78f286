"""The disk's physical floor: a file read sequentially with O_DIRECT, timed. The benches report their reads
against it, the demo prints it, and the diskflow page draws a run's disk throughput against it."""
from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

__all__ = ["drop_page_cache", "read_span", "sequential_read_bw"]


def drop_page_cache(path: str | os.PathLike[str]) -> None:
    """Evict one file's pages from the page cache (so a read measures the disk)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_span(path: str | os.PathLike[str], start: int, stop: int, block: int = 4 << 20) -> tuple[int, float]:
    """Read bytes [start, stop) of `path` once, in `block`-byte sequential reads with O_DIRECT (`start` a
    multiple of 4 KiB); buffered reads after evicting the file from the page cache where the filesystem
    refuses O_DIRECT (tmpfs). Returns (bytes read, which the last read may carry past `stop`; seconds)."""
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT requires
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    except OSError:
        drop_page_cache(path)
        fd = os.open(path, os.O_RDONLY)
    try:
        pos = start
        t0 = time.perf_counter()
        while pos < stop:
            n = os.preadv(fd, [buf], pos)
            if n <= 0:
                break
            pos += n
        dt = time.perf_counter() - t0
    finally:
        os.close(fd)
        buf.close()
    return pos - start, dt


def sequential_read_bw(path: str | os.PathLike[str], block: int = 4 << 20, max_bytes: int | None = None) -> float:
    """Sequential read bandwidth (bytes/s) of the disk holding `path`, read with O_DIRECT (`read_span`).

    Falls back to buffered reads after evicting the file from the page cache where the
    filesystem refuses O_DIRECT (tmpfs).
    """
    size = Path(path).stat().st_size
    limit = size if max_bytes is None else min(size, max_bytes)
    done, dt = read_span(path, 0, limit, block)
    return done / dt if dt > 0 else float("nan")
