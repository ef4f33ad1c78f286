"""DiskGNN's "individual packing", the baseline `diskflow bench prepare` measures batched packing against
(`operators.prepare.pack.pack_shard`): batch by batch, every needed row is fetched with its own random read
(page cache dropped first), so rows shared by several batches are read several times. Both produce
byte-identical part files.
"""
from __future__ import annotations

import contextlib
import mmap
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..operators.formats.atomic import atomic_path
from ..operators.formats.checksum import crc32
from ..operators.formats.packed import padded, part_name
from ..operators.formats.store import FeatureShard, Store
from ..operators.prepare.pack import local_rows, read_routes

__all__ = ["pack_naive"]


def _proc_read_bytes() -> int:
    """This process's `read_bytes` from /proc/self/io (bytes that really came from the block device)."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def _drop_cache(path: Path) -> None:
    """Evict the file `path` from the page cache (POSIX_FADV_DONTNEED)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _evict(maps: Sequence[mmap.mmap], shards: Sequence[FeatureShard]) -> None:
    """Evict the shards from the page cache, including the pages our own maps hold."""
    for m in maps:
        m.madvise(mmap.MADV_DONTNEED)   # unmap our pages first: the page cache cannot drop mapped pages
    for s in shards:
        _drop_cache(s.path)


def pack_naive(store_path: str | os.PathLike[str], route_paths: Sequence[str | os.PathLike[str]],
               seg_offsets: np.ndarray, part_dir: str | os.PathLike[str], *, drop_cache: bool = True,
               drop_every_batch: bool = False) -> dict[str, Any]:
    """Individual packing (the benchmark's baseline): batch by batch, one random read per row.

    Each shard is mapped with ``MADV_RANDOM`` (no readahead), so gathering a batch's rows
    faults in exactly the pages holding them: one small random read per row, vectorised
    (no Python loop per row). Rows needed by several batches are read again unless the page
    cache still holds them; `drop_every_batch` evicts it before every batch (the worst case).

    Args:
        store_path: the ingested store.
        route_paths: the round's routing files, in round order.
        seg_offsets: int64 [n, P] from `route.segment_offsets`.
        part_dir: directory receiving part-PPPPP.bin for every shard (temp names, renamed at the end).
        drop_cache: evict the shards from the page cache before starting.
        drop_every_batch: evict them before every batch.

    Returns:
        ``{"crc" (int64 [n, P]), "rows", "bytes_read" (rows x row_bytes fetched),
        "disk_read_bytes" (/proc/self/io delta), "bytes_written", "seconds"}``.
    """
    t0 = time.perf_counter()
    io0 = _proc_read_bytes()
    store = Store(store_path)
    rb, P = store.row_bytes, len(store.shards)
    offsets = np.asarray(seg_offsets, dtype=np.int64)
    n = offsets.shape[0]
    if offsets.ndim != 2 or offsets.shape[1] != P:
        raise ValueError(f"seg_offsets must be [batches, {P}], got {offsets.shape}")
    if drop_cache:
        for s in store.shards:
            _drop_cache(s.path)
    crc = np.zeros((n, P), dtype=np.int64)
    end = np.zeros(P, dtype=np.int64)   # end of the last segment written to each part file
    rows_total = 0
    maps: list[mmap.mmap] = []
    shards: list[np.ndarray] = []
    try:
        for s in store.shards:
            if s.rows == 0:
                shards.append(np.zeros((0, store.feature_dim), store.feature_dtype))
                continue
            with open(s.path, "rb") as f:
                maps.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
            maps[-1].madvise(mmap.MADV_RANDOM)
            shards.append(np.frombuffer(maps[-1], dtype=store.feature_dtype, count=s.rows * store.feature_dim,
                                        offset=s.offset).reshape(s.rows, store.feature_dim))
        with contextlib.ExitStack() as stack:
            tmps = [stack.enter_context(atomic_path(Path(part_dir) / part_name(p))) for p in range(P)]
            fds = [os.open(t, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) for t in tmps]
            try:
                for route in read_routes(route_paths, n):
                    local = [local_rows(route, p, store.shards[p]) for p in range(P)]
                    bounds = np.vstack([np.zeros((1, P), np.int64), np.cumsum(route.seg_rows, axis=0)])
                    for j in range(route.num_batches):
                        i = route.first_batch + j
                        if drop_every_batch:
                            _evict(maps, store.shards)
                        for p in range(P):
                            rows = local[p][bounds[j, p]:bounds[j + 1, p]]
                            end[p] = offsets[i, p] + padded(rows.size * rb)
                            if not rows.size:
                                continue
                            seg = np.ascontiguousarray(shards[p][rows])   # one page fault (random read) per row
                            data = seg.reshape(-1).view(np.uint8).data
                            crc[i, p] = crc32(data)
                            os.pwritev(fds[p], [data, bytes(int(padded(data.nbytes)) - data.nbytes)], int(offsets[i, p]))
                            rows_total += rows.size
                for p in range(P):
                    os.ftruncate(fds[p], int(end[p]))
            finally:
                for fd in fds:
                    os.close(fd)
    finally:
        shards.clear()   # release the buffer exports before closing the maps
        for m in maps:
            m.close()
    io1 = _proc_read_bytes()
    return {"crc": crc, "rows": rows_total, "bytes_read": rows_total * rb,
            "disk_read_bytes": (io1 - io0) if io0 >= 0 and io1 >= 0 else -1,
            "bytes_written": rows_total * rb, "seconds": time.perf_counter() - t0}

