"""The floor the page draws disk throughput against: the GPU worker's scratch disk, read sequentially.

Measured once as a run starts (the driver's probe of each GPU worker): a probe file written with
O_DIRECT and synced, then read back sequentially with O_DIRECT, the way the trainer reads packed
segments (the benches' floor, `operators.formats.diskread`), and removed. Where the file system
refuses O_DIRECT (tmpfs), it is read through the page cache, and the figure is the memory's, which
is that disk's floor too.
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path

from ...operators.formats.diskread import sequential_read_bw

__all__ = ["BLOCK", "PROBE_BYTES", "read_floor"]

PROBE_BYTES = 32 << 20      # enough for a steady figure, about 30 ms on a 1 GB/s disk
BLOCK = 4 << 20


def read_floor(directory: str | os.PathLike[str], nbytes: int = PROBE_BYTES) -> float:
    """Bytes per second of a sequential direct read in `directory` (created when missing); nan on failure."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f".diskflow-floor-{os.getpid()}"
    buf = mmap.mmap(-1, BLOCK)          # page-aligned, as O_DIRECT wants
    buf.write(os.urandom(4096) * (BLOCK // 4096))
    direct = getattr(os, "O_DIRECT", 0)
    try:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | direct, 0o600)
        except OSError:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for off in range(0, nbytes, BLOCK):
                os.pwritev(fd, [buf], off)
            os.fsync(fd)
        finally:
            os.close(fd)
        bw = sequential_read_bw(path, BLOCK)
        return bw if bw > 0 else float("nan")
    except OSError:
        return float("nan")
    finally:
        buf.close()
        path.unlink(missing_ok=True)
