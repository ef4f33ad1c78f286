"""Ingest of the edge list into CSC by destination, out of core.

Two steps, so that a graph whose edges do not fit in memory still ingests:

1. `scan_edges`, once per edge file: reads bounded chunks of (src, dst), validates
   the ids, optionally adds the reversed edges, and appends each chunk to one spill
   file, grouped by destination bucket (buckets are equal ranges of destination ids);
   the returned offsets say where every (chunk, bucket) run lies in the file.
2. `csc_group`, once per run of buckets: reads its runs from every spill file, sorts
   them by (dst, src), and writes its slice of ``indptr`` and ``indices`` into the
   preallocated arrays at offsets known from the scans' counts.

While N < 2**32 an edge is spilled as one uint64 key ``dst << 32 | src``: sorting the
keys sorts by destination then source, and both ids come back with a shift and a
mask (8 bytes per edge on disk and in memory). Larger graphs spill (dst, src) int64
pairs and sort them with `np.lexsort`.

With ``dedupe`` (used by to_undirected, which coalesces like PyG's ``to_undirected``)
a group may keep fewer edges than it read, so its output goes first to a scratch array
at the scan offsets and `compact_group` then moves it to its final place.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import InputError
from ...native.constants import ALIGN
from ..formats.npyio import create_aligned_npy
from .raw import check_id_range, int_column, iter_file_batches, require_columns, table_schema

__all__ = ["EDGE_COLUMNS", "INDEX32_LIMIT", "PACKED_LIMIT", "EdgeSpill", "allocate_npy", "compact_group",
           "csc_group", "indices_dtype", "is_packed", "scan_edges"]

EDGE_COLUMNS = ("src", "dst")
PACKED_LIMIT = 1 << 32   # below this node count an edge packs into one uint64 key
INDEX32_LIMIT = 1 << 31  # below this node count indices are int32
_LOW32 = np.uint64(0xFFFFFFFF)
_IO_BLOCK = 64 << 20     # bytes per read/write call when copying arrays


def is_packed(num_nodes: int) -> bool:
    """Whether edges spill as one uint64 key (True) or as an int64 (dst, src) pair."""
    return num_nodes < PACKED_LIMIT


def indices_dtype(num_nodes: int) -> np.dtype:
    """dtype of the CSC ``indices`` array: int32 while N < 2**31, else int64."""
    return np.dtype(np.int32 if num_nodes < INDEX32_LIMIT else np.int64)


def _record_bytes(packed: bool) -> int:
    return 8 if packed else 16


@dataclass(frozen=True)
class EdgeSpill:
    """What one edge scan wrote: its spill file and where each (chunk, bucket) run lies in it.

    Attributes:
        source: the input edge file.
        path: the spill file.
        offsets: int64 [chunks, buckets + 1]; chunk c's records of buckets [a, b) are
            records offsets[c, a]..offsets[c, b] of the file.
        edges: records written (input edges, doubled by to_undirected).
    """

    source: str
    path: str
    offsets: np.ndarray
    edges: int

    def bucket_counts(self) -> np.ndarray:
        """Records per bucket, summed over chunks."""
        return np.diff(self.offsets, axis=1).sum(axis=0) if len(self.offsets) else np.zeros(0, np.int64)


def _edge_chunks(path: Path, num_nodes: int, chunk_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Validated (src, dst) int64 arrays of about `chunk_rows` edges (small record batches are merged)."""
    require_columns(table_schema(path), EDGE_COLUMNS, path)
    srcs: list[np.ndarray] = []
    dsts: list[np.ndarray] = []
    held = 0
    for row0, batch in iter_file_batches(path, EDGE_COLUMNS, chunk_rows):
        src = int_column(batch, "src", path, row0)
        dst = int_column(batch, "dst", path, row0)
        check_id_range(src, num_nodes, path, row0, "edge src")
        check_id_range(dst, num_nodes, path, row0, "edge dst")
        srcs.append(src)
        dsts.append(dst)
        held += len(src)
        if held >= chunk_rows:
            yield np.concatenate(srcs), np.concatenate(dsts)
            srcs, dsts, held = [], [], 0
    if held:
        yield np.concatenate(srcs), np.concatenate(dsts)


def scan_edges(path: str | os.PathLike[str], spill_path: str | os.PathLike[str], *, num_nodes: int,
               bucket_width: int, num_buckets: int, chunk_rows: int, to_undirected: bool = False,
               packed: bool | None = None) -> EdgeSpill:
    """Validate one edge file and spill its edges grouped by destination bucket.

    Args:
        path: the input edge file (``src``, ``dst`` int64).
        spill_path: the spill file to create.
        num_nodes: N; ids must lie in 0..N-1.
        bucket_width: destination ids per bucket (bucket of v = v // bucket_width; a power of
            two makes that a shift).
        num_buckets: ceil(N / bucket_width).
        chunk_rows: edges read, bucket-sorted and written at a time (bounds memory).
        to_undirected: also spill every edge reversed.
        packed: spill uint64 keys (default: when N < 2**32) or int64 pairs.

    Raises:
        InputError: naming the file, row and id, for an id out of range, a null, a missing
        or non-integer column, or an unreadable file.
    """
    source = Path(path)
    packed = is_packed(num_nodes) if packed is None else packed
    bucket_type = np.uint16 if num_buckets <= 1 << 16 else np.uint32
    shift = bucket_width.bit_length() - 1 if bucket_width & (bucket_width - 1) == 0 else -1
    offsets: list[np.ndarray] = []
    written = 0
    with open(spill_path, "wb") as out:
        for src, dst in _edge_chunks(source, num_nodes, chunk_rows):
            if to_undirected:
                src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
            bucket = ((dst >> shift) if shift >= 0 else (dst // bucket_width)).astype(bucket_type)
            order = np.argsort(bucket, kind="stable")  # a radix sort for 16-bit buckets
            if packed:
                key = dst.view(np.uint64) << np.uint64(32)
                key |= src.view(np.uint64)
                records = key[order]
            else:
                records = np.stack([dst[order], src[order]], axis=1)
            out.write(_bytes(records))
            counts = np.bincount(bucket, minlength=num_buckets)
            offsets.append(written + np.concatenate([[0], np.cumsum(counts)]))
            written += len(order)
    table = np.stack(offsets).astype(np.int64) if offsets else np.zeros((0, num_buckets + 1), np.int64)
    return EdgeSpill(str(source), str(spill_path), table, written)


def _bytes(a: np.ndarray) -> memoryview:
    """A flat byte view of a contiguous array (writable when the array is)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8).data


def _pread_into(fd: int, buf: memoryview, offset: int, path: str) -> None:
    done = 0
    while done < len(buf):
        n = os.preadv(fd, [buf[done:done + _IO_BLOCK]], offset + done)
        if n <= 0:
            raise InputError(path, f"spill file ended early at byte {offset + done}")
        done += n


def _pwrite_all(fd: int, data: np.ndarray, offset: int) -> None:
    view = _bytes(data)
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:done + _IO_BLOCK], offset + done)


def allocate_npy(path: str | os.PathLike[str], dtype: np.dtype | str, length: int) -> str:
    """Create a zero-filled 1-D aligned .npy of `length` elements (sparse) for tasks to fill in place."""
    create_aligned_npy(path, dtype, (int(length),))
    return str(path)


def _sources(records: np.ndarray, packed: bool) -> np.ndarray:
    """The source ids of sorted records: a key's low 32 bits (a strided view on little-endian
    machines), or a pair's second column."""
    if not packed:
        return records[:, 1]
    if sys.byteorder == "little":
        return records.view(np.uint32)[0::2]
    return records & _LOW32


def csc_group(runs: Sequence[tuple[str, np.ndarray, np.ndarray]], *, lo: int, hi: int, base: int,
              indptr_path: str | os.PathLike[str], indices_path: str | os.PathLike[str],
              index_dtype: np.dtype | str, packed: bool = True, dedupe: bool = False) -> int:
    """Build the CSC columns of destinations [lo, hi) from the spilled runs and write them in place.

    Args:
        runs: per spill file, (path, starts, stops): record ranges of this group, one per chunk.
        lo, hi: the destination range (buckets' union).
        base: position in ``indices`` of this group's first edge.
        indptr_path, indices_path: the preallocated aligned .npy arrays; this task writes
            ``indptr[lo+1 : hi+1]`` and ``indices[base : base + kept]``.
        index_dtype: dtype of ``indices``.
        packed: records are uint64 keys (else int64 (dst, src) pairs).
        dedupe: drop repeated (dst, src) pairs.

    Returns:
        The number of edges written (kept).
    """
    total = int(sum(int((np.asarray(stops) - np.asarray(starts)).sum()) for _, starts, stops in runs))
    rec = _record_bytes(packed)
    buf = np.empty(total, np.uint64) if packed else np.empty((total, 2), np.int64)
    pos = 0
    for path, starts, stops in runs:
        fd = os.open(path, os.O_RDONLY)
        try:
            for a, b in zip(np.asarray(starts).tolist(), np.asarray(stops).tolist()):  # per chunk
                if b > a:
                    _pread_into(fd, _bytes(buf[pos:pos + b - a]), a * rec, path)
                    pos += b - a
        finally:
            os.close(fd)

    targets = np.arange(lo, hi + 1, dtype=np.int64)
    if packed:
        buf.sort()
        if dedupe and total:
            keep = np.empty(total, bool)
            keep[0] = True
            np.not_equal(buf[1:], buf[:-1], out=keep[1:])
            buf = buf[keep]
        bounds = np.searchsorted(buf, targets.astype(np.uint64) << np.uint64(32))
    else:
        buf = buf[np.lexsort((buf[:, 1], buf[:, 0]))]
        if dedupe and total:
            keep = np.ones(total, bool)
            keep[1:] = (buf[1:] != buf[:-1]).any(axis=1)
            buf = buf[keep]
        bounds = np.searchsorted(buf[:, 0], targets)
    kept = len(buf)

    dt = np.dtype(index_dtype)
    fd = os.open(indptr_path, os.O_WRONLY)
    try:
        _pwrite_all(fd, (base + bounds[1:]).astype(np.int64), ALIGN + (lo + 1) * 8)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    fd = os.open(indices_path, os.O_WRONLY)
    try:
        step = _IO_BLOCK // 8
        for a in range(0, kept, step):  # per block: bounded temporaries
            _pwrite_all(fd, _sources(buf[a:a + step], packed).astype(dt), ALIGN + (base + a) * dt.itemsize)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    return kept


def compact_group(*, scratch_path: str | os.PathLike[str], scratch_base: int, kept: int,
                  indices_path: str | os.PathLike[str], final_base: int,
                  indptr_path: str | os.PathLike[str], lo: int, hi: int, index_dtype: np.dtype | str) -> None:
    """Move a deduplicated group's indices from the scratch array to their final place and
    shift its ``indptr[lo+1 : hi+1]`` by the same distance."""
    dt = np.dtype(index_dtype)
    shift = scratch_base - final_base
    src_fd = os.open(scratch_path, os.O_RDONLY)
    dst_fd = os.open(indices_path, os.O_WRONLY)
    try:
        step = _IO_BLOCK // dt.itemsize
        for a in range(0, kept, step):  # per block
            block = np.empty(min(step, kept - a), dt)
            _pread_into(src_fd, _bytes(block), ALIGN + (scratch_base + a) * dt.itemsize,
                        str(scratch_path))
            _pwrite_all(dst_fd, block, ALIGN + (final_base + a) * dt.itemsize)
        os.fdatasync(dst_fd)
    finally:
        os.close(src_fd)
        os.close(dst_fd)
    if shift:
        fd = os.open(indptr_path, os.O_RDWR)
        try:
            ptr = np.empty(hi - lo, np.int64)
            _pread_into(fd, _bytes(ptr), ALIGN + (lo + 1) * 8, str(indptr_path))
            _pwrite_all(fd, ptr - shift, ALIGN + (lo + 1) * 8)
            os.fdatasync(fd)
        finally:
            os.close(fd)
