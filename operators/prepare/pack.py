"""Batched feature packing (DiskGNN §5.2): one task per feature shard, each raw byte read once.

`pack_shard` reads shard p of the store with large sequential reads, then, for every batch
of the round in order, gathers that batch's packed rows living in shard p (numpy fancy
indexing into a large write buffer) and appends them to ``part-p.bin`` as one 4096-aligned
segment; the file is written sequentially under a temporary name and renamed when complete,
so a killed task never leaves a part file that looks finished. The same task writes the
rows of the disk caches, the GPU tier and the CPU tier's initial state that live in its
shard, into files preallocated before packing (`prepare_targets`); rows of one such file
come from every shard, so they are scattered through a shared memory map, never one write
per row.

`pack_naive` is the benchmark's baseline, DiskGNN's "individual packing": batch by batch,
every needed row is fetched with its own random read (page cache dropped first), so rows
shared by several batches are read several times. Both produce byte-identical part files.
"""
from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import mmap
import os
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...native import kernels
from ..formats.checksum import crc32
from ..formats.errors import InputError
from ..formats.files import (
    ALIGN,
    atomic_path,
    create_aligned_npy,
    load_npy,
    open_direct,
    save_npy,
    thread_buffer,
)
from ..formats.files import write_all as _write_all  # a module name of its own: tests patch it here
from ..formats.packed import ROUND_DIR, create_row_file, dcache_ids_name, dcache_name, padded, part_name
from ..formats.store import FeatureShard, Store, map_shard
from .route import RouteFile

READ_CHUNK = 64 << 20     # bytes per sequential read of a shard
WRITE_BUFFER = 32 << 20   # bytes gathered before one write to a part file
WRITES_IN_FLIGHT = 2      # a part file's writes under way at once


@dataclass(frozen=True)
class RowTarget:
    """A preallocated rows file that takes row ``k`` = features[ids[k]] at ``offset + k * row_bytes``.

    ``ids`` is an int array or the path of an ``.npy`` holding it; ids < 0 are empty rows
    (left zero).
    """

    path: str | os.PathLike[str]
    ids: np.ndarray | str | os.PathLike[str]
    offset: int = 0

    def load_ids(self) -> np.ndarray:
        if isinstance(self.ids, np.ndarray):
            return self.ids.astype(np.int64, copy=False)
        try:
            return np.asarray(load_npy(self.ids, "r"), dtype=np.int64)
        except (OSError, ValueError) as e:
            raise InputError(self.ids, f"unreadable ids array ({e})") from e


def prepare_targets(packed_dir: str | os.PathLike[str], gpu_ids: np.ndarray, cpu_ids: np.ndarray,
                    cache_nodes: Sequence[np.ndarray], dtype: np.dtype | str, dim: int
                    ) -> tuple[list[RowTarget], list[RowTarget]]:
    """Write the tier and disk-cache id files and preallocate their rows files, before packing.

    Creates ``gpu_ids.npy``/``gpu_cache.npy``, ``cpu_ids.npy``/``cpu_init.npy`` (aligned .npy,
    rows at byte 4096) and per segment g ``round-0/dcache-g.ids.npy``/``dcache-g.bin``.

    Returns:
        (tier_targets, dcache_targets) to pass to every `pack_shard` task.
    """
    root = Path(packed_dir)
    dt = np.dtype(dtype)
    tiers = []
    for name, ids in (("gpu", gpu_ids), ("cpu", cpu_ids)):
        ids = np.asarray(ids, dtype=np.int64)
        ids_path, rows_path = root / f"{name}_ids.npy", root / ("gpu_cache.npy" if name == "gpu" else "cpu_init.npy")
        save_npy(ids_path, ids)
        with atomic_path(rows_path) as tmp:
            mm = create_aligned_npy(tmp, dt, (ids.shape[0], dim))
            del mm
        tiers.append(RowTarget(rows_path, ids_path, ALIGN))
    caches = []
    rnd = root / ROUND_DIR
    for g, nodes in enumerate(cache_nodes):
        ids_path, rows_path = rnd / dcache_ids_name(g), rnd / dcache_name(g)
        save_npy(ids_path, np.asarray(nodes, dtype=np.int64))
        create_row_file(rows_path, len(nodes), dim * dt.itemsize)
        caches.append(RowTarget(rows_path, ids_path, 0))
    return tiers, caches


# ---------------------------------------------------------------------------- helpers

def _shard_buffer(nbytes: int) -> np.ndarray:
    """A page-aligned byte buffer of `nbytes` reused by this thread's pack tasks.

    A fresh 64 MiB array per shard costs the kernel zeroing every page of it again; the
    buffer is only ever live inside one task, and a thread runs one task at a time. Page
    alignment lets the shard be read with O_DIRECT straight into it.
    """
    return thread_buffer("shard", nbytes)[:nbytes]


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


def _read_span(fd: int, direct_fd: int | None, buf: np.ndarray, start: int, pos: int, end: int, chunk: int,
               path: Path) -> int:
    """Fill ``buf[pos - start:end - start]`` with file bytes [pos, end) (`start`: the file offset of buf[0],
    a multiple of ALIGN, as is buf's address); return how far it got (< end: the file ended). A failed read
    is an InputError naming `path` and the byte.

    A chunk the page cache mostly holds (the read-ahead's shards) is copied from it; any other is read
    with O_DIRECT where `direct_fd` is given: straight from the disk into `buf`, with no copy through the
    page cache and none of its bookkeeping, the cost that dominated the kernel's share of packing.
    """
    view = buf.data
    while pos < end:
        stop = min(end, pos + chunk)
        try:
            if direct_fd is not None and cached_share(fd, pos, stop - pos) < 0.5:
                lo = pos - (pos - start) % ALIGN                  # aligned in the file and in buf alike
                hi = min(start + buf.shape[0], -(-stop // ALIGN) * ALIGN)
                try:
                    n = os.preadv(direct_fd, [view[lo - start:hi - start]], lo)
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                    direct_fd = None                              # e.g. a device whose blocks are larger
                    continue
                if n <= pos - lo:
                    return pos                                    # end of file
                pos = min(end, lo + n)
            else:
                n = os.preadv(fd, [view[pos - start:stop - start]], pos)
                if n <= 0:
                    return pos
                pos += n
        except OSError as e:
            raise InputError(path, f"read failed at byte {pos} ({e.strerror or e})") from e
    return pos


def _read_shard(shard: FeatureShard, dtype: np.dtype, dim: int, chunk: int) -> tuple[np.ndarray, int]:
    """Shard rows [rows, dim] in RAM, read with large sequential reads (O_DIRECT where the page cache does
    not already hold them); also the bytes read."""
    nbytes = shard.rows * dim * dtype.itemsize
    start = shard.offset - shard.offset % ALIGN
    head = shard.offset - start
    buf = _shard_buffer(-(-(head + nbytes) // ALIGN) * ALIGN)
    try:
        fd = os.open(shard.path, os.O_RDONLY)
    except OSError as e:
        raise InputError(shard.path, f"cannot open feature shard ({e.strerror or e})") from e
    direct_fd = open_direct(shard.path, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError, AttributeError):     # with O_DIRECT at hand, the buffered reads
            os.posix_fadvise(fd, shard.offset, nbytes,           # copy cached chunks and read no further
                             os.POSIX_FADV_SEQUENTIAL if direct_fd is None else os.POSIX_FADV_RANDOM)
        pos = _read_span(fd, direct_fd, buf, start, shard.offset, shard.offset + nbytes, chunk, shard.path)
    finally:
        os.close(fd)
        if direct_fd is not None:
            os.close(direct_fd)
    if pos < shard.offset + nbytes:
        raise InputError(shard.path, f"truncated feature shard: {nbytes} bytes expected from byte "
                                     f"{shard.offset}, file ends after {pos - shard.offset}")
    return buf[head:head + nbytes].view(dtype).reshape(shard.rows, dim), nbytes


RESIDENT = 0.99   # share of a read-ahead shard's pages that must still be cached for it to be mapped, not read


def _shard_cached_share(shard: FeatureShard, nbytes: int) -> float:
    """`cached_share` of a shard's `nbytes` bytes of features."""
    try:
        fd = os.open(shard.path, os.O_RDONLY)
    except OSError as e:
        raise InputError(shard.path, f"cannot open feature shard ({e.strerror or e})") from e
    try:
        return cached_share(fd, shard.offset, nbytes)
    finally:
        os.close(fd)


def _shard_rows(shard: FeatureShard, dtype: np.dtype, dim: int, chunk: int, resident: bool) -> tuple[np.ndarray, int]:
    """A pack task's one take of a shard's rows, and its bytes: mapped from the page cache when `resident`
    (a read-ahead shard, still cached: no copy), else read into memory (`_read_shard`)."""
    nbytes = shard.rows * dim * dtype.itemsize
    if resident and _shard_cached_share(shard, nbytes) >= RESIDENT:
        return map_shard(shard, dtype, dim, populate=True), nbytes
    return _read_shard(shard, dtype, dim, chunk)


class _LazyShard:
    """A shard's rows, read (once, sequentially) on first use.

    A shard that no batch misses and no tier or disk cache holds is never read: on a graph
    whose hot rows sit in a few shards, the packing pass reads only those. `resident`: the
    shard was read ahead, so its rows are mapped from the page cache if all still there.
    """

    def __init__(self, shard: FeatureShard, dtype: np.dtype, dim: int, chunk: int, resident: bool = False) -> None:
        self.shard, self.dtype, self.dim, self.chunk, self.resident = shard, dtype, dim, chunk, resident
        self.bytes_read = 0
        self._rows: np.ndarray | None = None

    def rows(self) -> np.ndarray:
        if self._rows is None:
            self._rows, self.bytes_read = _shard_rows(self.shard, self.dtype, self.dim, self.chunk, self.resident)
        return self._rows


def warm_shard_ids(store: Store, budget_bytes: int) -> list[int]:
    """The shards `warm_shards` reads ahead with `budget_bytes`: the store's first whole shards within it."""
    sizes = np.array([sh.rows for sh in store.shards], dtype=np.int64) * store.row_bytes
    return list(range(int(np.searchsorted(np.cumsum(sizes), budget_bytes, side="right"))))


def warm_shards(store_path: str | os.PathLike[str], budget_bytes: int, stop: threading.Event | None = None,
                chunk: int = 8 << 20) -> int:
    """Read the store's first shards into the page cache, up to `budget_bytes`; return the bytes read.

    Meant for a background thread while preparation is busy with sampling and planning and the
    disk is otherwise idle: the pack tasks of those shards then find their bytes cached, so
    part of the one pass over the features overlaps the CPU-bound phases. Every byte is still
    read from the disk once. The kernel reads each chunk into the page cache itself
    (POSIX_FADV_WILLNEED) and the thread only waits for its last page, so the warm-up copies
    nothing and takes almost no CPU from the phases it overlaps. Whole shards only (stops before
    one that would pass the budget); returns early when `stop` is set; I/O errors end the
    warm-up quietly (packing reports them).
    """
    store = Store(store_path)
    probe = np.empty(1, dtype=np.uint8)
    done = 0
    for p in warm_shard_ids(store, budget_bytes):
        shard = store.shards[p]
        nbytes = shard.rows * store.row_bytes
        if stop is not None and stop.is_set():
            break
        try:
            fd = os.open(shard.path, os.O_RDONLY)
        except OSError:
            break
        try:
            off = 0
            while off < nbytes and not (stop is not None and stop.is_set()):
                n = min(chunk, nbytes - off)
                with contextlib.suppress(AttributeError):
                    os.posix_fadvise(fd, shard.offset + off, n, os.POSIX_FADV_WILLNEED)
                if os.preadv(fd, [probe.data], shard.offset + off + n - 1) <= 0:     # waits for the chunk's end
                    break
                off += n
            done += off
        except OSError:
            break
        finally:
            os.close(fd)
    return done


def _open_new(path: Path) -> tuple[int, bool]:
    """Create `path` for large aligned appends: with O_DIRECT where the filesystem takes it, else buffered.

    Part files are written once and not read back by the packing machine, so O_DIRECT skips
    the page-cache copy and the dirty-page writeback throttling (buffered writes of a round's
    packed bytes ran 5-9x slower than O_DIRECT on the benchmark VM) and keeps them out of memory.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = open_direct(path, flags)
    return (fd, True) if fd is not None else (os.open(path, flags, 0o644), False)


def _clear_direct(fd: int) -> None:
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~getattr(os, "O_DIRECT", 0))


_WRITERS = threading.local()     # each thread's background writers (`_SegmentWriter._thread_writer`), by tag


class _SegmentWriter:
    """Appends segments to a part file through large page-aligned buffers (large writes, each at its offset).

    While earlier buffers are written by background threads, the task gathers rows into the next,
    so gathering and checksumming overlap the disk instead of alternating with it. Up to
    `WRITES_IN_FLIGHT` writes are under way at once, each a ``pwrite`` at its own offset: with two
    rather than one, this machine's disk took direct writes of 32 MiB about 12% faster (the gap
    between one write's end and the next one's start left it idle). With ``direct`` (an O_DIRECT
    descriptor) only whole pages are written: a flush writes the buffer up to the last multiple of ALIGN and
    carries the rest (< ALIGN bytes) to the front of the next buffer. Segments are padded to
    ALIGN, so the last flush of a part file is whole pages too. `close` must follow, also on error.
    ``start``: where in the file the first buffer goes (appending to a part file begun earlier);
    ``tag``: names this thread's buffers and writer threads (see `_thread_buffers`).
    """

    def __init__(self, fd: int, path: Path, size: int, row_bytes: int, direct: bool = False, start: int = 0,
                 tag: str = "segments") -> None:
        self.fd, self.path, self.row_bytes, self.direct = fd, path, row_bytes, direct
        n = -(-max(size, row_bytes + ALIGN) // ALIGN) * ALIGN   # room for a row after a carried tail
        self._bufs = self._thread_buffers(n, tag)
        self._cur = 0
        self.buf = self._bufs[0]
        self.fill = 0
        self.written = start   # file bytes before the buffer (where it will be written), padding included
        self._pool = self._thread_writer(tag)
        self._pending: collections.deque[Future[None]] = collections.deque()

    @staticmethod
    def _thread_buffers(n: int, tag: str) -> list[np.ndarray]:
        """This thread's write buffers of `n` bytes (one per write in flight, and the one being filled),
        kept from its previous pack task: fresh ones per shard cost the kernel zeroing them again every
        time. A thread runs one pack task at a time and `close` waits for every write from them, so reuse
        is safe; two writers of one thread alive at once take different `tag`s."""
        # Reserved at the full write size whatever `n` (pages are mapped only as written): an early-packing
        # task's buffers are sized to its superbatch's part files, which grow and shrink from one to the next.
        return [thread_buffer(f"{tag}-{i}", max(n, WRITE_BUFFER))[:n] for i in range(WRITES_IN_FLIGHT + 1)]

    @staticmethod
    def _thread_writer(tag: str) -> ThreadPoolExecutor:
        """This thread's background writers for `tag` (`WRITES_IN_FLIGHT` threads), kept like its buffers:
        starting and joining a thread per part file cost an early-packing task (16 part files a
        superbatch) over a tenth of its time. `close` waits for every write, so the next writer of this
        thread and tag finds them idle."""
        pool: ThreadPoolExecutor | None = getattr(_WRITERS, tag, None)
        if pool is None:
            pool = ThreadPoolExecutor(WRITES_IN_FLIGHT, thread_name_prefix=f"pack-write-{tag}")
            setattr(_WRITERS, tag, pool)
        return pool

    @property
    def position(self) -> int:
        return self.written + self.fill

    def _wait(self, keep: int = 0) -> None:
        """Wait for the oldest writes until at most `keep` are in flight."""
        while len(self._pending) > keep:
            self._pending.popleft().result()                    # re-raises the writer's InputError

    def flush(self) -> None:
        n = self.fill - self.fill % ALIGN if self.direct else self.fill
        if not n:
            return
        tail = self.fill - n
        k = len(self._bufs)
        nxt = self._bufs[(self._cur + 1) % k]
        self._wait(k - 2)                                       # nxt's previous write (the oldest) is done
        nxt[:tail] = self.buf[n:self.fill]
        self._pending.append(self._pool.submit(_write_all, self.fd, self.buf[:n], self.path, self.written))
        self.written += n
        self.buf, self._cur, self.fill = nxt, (self._cur + 1) % k, tail

    def finish(self) -> None:
        """Write everything buffered (the last segment is padded, so whole pages when direct)."""
        self.flush()
        self._wait()
        if self.fill:   # not page-aligned: finish with a buffered write
            _clear_direct(self.fd)
            self.direct = False
            _write_all(self.fd, self.buf[:self.fill], self.path, self.written)
            self.written += self.fill
            self.fill = 0

    def close(self) -> None:
        """Wait for every write in flight (errors of an abandoned file are dropped); the thread's writers stay.

        All of them: the caller closes the descriptor next, and a write still under way would then write
        to whatever file reuses its number."""
        pending, self._pending = self._pending, collections.deque()
        futures_wait(pending)

    def rows(self, feats: np.ndarray, local: np.ndarray) -> int:
        """Append feats[local] (rows already range-checked); return the crc32 of their bytes."""
        crc, t, rb = 0, 0, self.row_bytes
        while t < local.shape[0]:
            if self.buf.shape[0] - self.fill < rb:
                self.flush()
            k = min(local.shape[0] - t, (self.buf.shape[0] - self.fill) // rb)
            crc = gather_segment(self.buf[self.fill:self.fill + k * rb], feats, local[t:t + k], crc)
            self.fill += k * rb
            t += k
        return crc

    def zeros(self, n: int) -> None:
        while n:
            if self.fill == self.buf.shape[0]:
                self.flush()
            k = min(n, self.buf.shape[0] - self.fill)
            self.buf[self.fill:self.fill + k] = 0
            self.fill += k
            n -= k


def gather_segment(dst: np.ndarray, feats: np.ndarray, rows: np.ndarray, crc: int = 0) -> int:
    """Gather ``feats[rows]`` into the byte buffer `dst` (exactly their bytes) in one native pass; return
    the running crc32 of the segment (`crc`: the value so far).

    The one packing step: `pack_shard` (a shard read into memory) and the streamed packer
    (`operators.stream.pack`, a shard's memory map) both gather every segment with it.
    """
    return kernels.gather_rows_crc(dst.view(feats.dtype).reshape(rows.shape[0], feats.shape[1]), feats,
                                   np.ascontiguousarray(rows, dtype=np.int64), crc)


def _routes(route_paths: Sequence[str | os.PathLike[str]], num_batches: int) -> Iterator[RouteFile]:
    """The routing files in order, checked to cover batches 0..num_batches-1 exactly once."""
    nxt = 0
    for rp in route_paths:
        route = RouteFile(rp)
        try:
            if route.first_batch != nxt:
                raise InputError(route.path, f"starts at batch {route.first_batch}, expected {nxt} "
                                             "(routing files must be passed in round order)")
            nxt += route.num_batches
            if nxt > num_batches:
                raise InputError(route.path, f"routes batches up to {nxt - 1}, the offsets cover {num_batches}")
            yield route
        finally:
            route.close()
    if nxt != num_batches:
        raise ValueError(f"routing files cover {nxt} batches, the segment offsets {num_batches}")


def _local_rows(route: RouteFile, p: int, shard: FeatureShard) -> np.ndarray:
    ids = route.shard_ids(p)
    local = ids - shard.row_start
    if local.size and (local.min() < 0 or local.max() >= shard.rows):
        raise InputError(route.path, f"shard {p}: packed node id outside rows [{shard.row_start}, {shard.row_stop})")
    return local


def _write_rows_at(path: Path, feats: np.ndarray, rows: np.ndarray, offset: int) -> None:
    """Write ``feats[rows]`` at byte `offset` of the existing file `path`, durably (fdatasync).

    The range's whole pages go with O_DIRECT where the file system takes it: a tier's rows are hundreds
    of MB that the packing machine never reads back, and a buffered write copies each byte into fresh
    page-cache pages first. The partial pages at the two ends are written buffered: the tasks of the
    neighbouring shards write the rest of those pages (buffered too, so the page cache merges them).
    """
    nbytes = rows.shape[0] * feats.shape[1] * feats.dtype.itemsize
    head = offset % ALIGN
    buf = thread_buffer("rows", head + nbytes)
    kernels.gather_rows(buf[head:head + nbytes].view(feats.dtype).reshape(rows.shape[0], feats.shape[1]), feats, rows)
    base = offset - head                                  # the file offset of buf[0]
    first, end = -(-offset // ALIGN) * ALIGN, (offset + nbytes) // ALIGN * ALIGN    # the whole pages
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as e:
        raise InputError(path, f"cannot open target rows file ({e.strerror or e})") from e
    try:
        if end > first:
            direct_fd = open_direct(path, os.O_WRONLY)
            try:
                _write_all(fd if direct_fd is None else direct_fd, buf[first - base:end - base], path, first)
            except InputError as e:                      # a file system that opens O_DIRECT but refuses the write
                cause = e.__cause__
                if direct_fd is None or not isinstance(cause, OSError) or cause.errno != errno.EINVAL:
                    raise
                _write_all(fd, buf[first - base:end - base], path, first)
            finally:
                if direct_fd is not None:
                    os.close(direct_fd)
            if first > offset:
                _write_all(fd, buf[head:first - base], path, offset)
            if offset + nbytes > end:
                _write_all(fd, buf[end - base:head + nbytes], path, end)
        else:
            _write_all(fd, buf[head:head + nbytes], path, offset)
        try:
            os.fdatasync(fd)
        except OSError as e:
            raise InputError(path, f"flushing its rows to disk failed: {e.strerror or e}") from e
    finally:
        os.close(fd)


def _write_targets(targets: Sequence[RowTarget], shard_rows: _LazyShard, shard: FeatureShard, row_bytes: int) -> int:
    """Write the shard's rows of every target file; return the row bytes written.

    Where a target's ids ascend (the tiers: `policies.choose_cpu_tier` lays the CPU tier out in
    node order, the GPU tier is sorted), the shard's rows are one contiguous range of the file:
    gathered and written with one `pwrite`, then `fdatasync`. Elsewhere (a disk-cache segment, a
    resumed stream's tier) they are scattered into a shared memory map, then `msync`. Either way a
    finished task's rows are on disk, as its part file is.
    """
    written = 0
    for t in targets:
        ids = t.load_ids()
        filled = ids[:int(np.count_nonzero(ids >= 0))]     # ascending layouts put the empty slots last
        ascending = bool((filled >= 0).all() and (filled[1:] > filled[:-1]).all())
        if ascending:
            lo, hi = (int(x) for x in np.searchsorted(filled, [shard.row_start, shard.row_stop]))
            sel = None
            if lo == hi:
                continue
        else:
            sel = np.flatnonzero((ids >= shard.row_start) & (ids < shard.row_stop))
            if not sel.size:
                continue
        feats = shard_rows.rows()
        need = t.offset + ids.shape[0] * row_bytes
        try:
            size = os.stat(t.path).st_size
        except OSError as e:
            raise InputError(t.path, f"target rows file missing ({e.strerror or e}); preallocate it before packing") from e
        if size < need:
            raise InputError(t.path, f"target rows file has {size} bytes, {ids.shape[0]} rows need {need}")
        if sel is None:
            _write_rows_at(Path(t.path), feats, (filled[lo:hi] - shard.row_start).astype(np.int64, copy=False),
                           t.offset + lo * row_bytes)
            written += (hi - lo) * row_bytes
            continue
        mm = np.memmap(t.path, dtype=feats.dtype, mode="r+", offset=t.offset, shape=(ids.shape[0], feats.shape[1]))
        try:    # one pass, no gathered temporary (numpy's mm[sel] = feats[rows] makes one), GIL released
            kernels.copy_rows(mm, sel.astype(np.int64, copy=False), feats,
                              (ids[sel] - shard.row_start).astype(np.int64, copy=False))
            mm.flush()
        finally:
            del mm
        written += sel.size * row_bytes
    return written


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


# ---------------------------------------------------------------------------- batched packing

@dataclass(frozen=True)
class EarlyPart:
    """Shard p's part file begun while the round was still being planned (`pack_early`).

    Batches ``[0, batches)`` are written, ``position`` bytes of the file; ``crc`` (int64
    [batches]) are their segments' crc32s and ``rows`` their packed rows. `pack_shard` appends
    the rest of the round to ``path`` and moves it into place.
    """

    path: str
    batches: int
    position: int
    rows: int
    crc: np.ndarray


def _open_part(path: Path, position: int) -> tuple[int, bool]:
    """An existing part file opened for appending at `position` (O_DIRECT where the file system takes it)."""
    fd = open_direct(path, os.O_WRONLY)
    direct = fd is not None
    if fd is None:
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError as e:
            raise InputError(path, f"cannot reopen the part file begun while planning ({e.strerror or e})") from e
    try:
        size = os.fstat(fd).st_size
        if size < position:
            raise InputError(path, f"part file begun while planning has {size} bytes, its record says {position}")
        os.lseek(fd, position, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd, direct


def _append_segments(w: _SegmentWriter, route: RouteFile, p: int, shard: FeatureShard, feats: Any, col: np.ndarray,
                     crc: np.ndarray) -> int:
    """Append every batch of `route` for shard p (each segment padded to ALIGN), checking each lands at its
    offset in `col`; their crcs go to `crc`; return the rows written. `feats()` gives the shard's rows."""
    local = _local_rows(route, p, shard)
    counts = route.seg_rows[:, p]
    bounds = np.r_[0, np.cumsum(counts)]
    rb = w.row_bytes
    for j in range(route.num_batches):
        i = route.first_batch + j
        if w.position != col[i]:
            raise ValueError(f"batch {i}, shard {p}: segment offset {col[i]} does not follow the "
                             f"previous segment (at {w.position}); offsets and routes disagree")
        seg = local[bounds[j]:bounds[j + 1]]
        if seg.size:
            crc[i] = w.rows(feats(), seg)
        nbytes = seg.shape[0] * rb
        w.zeros(int(padded(nbytes)) - nbytes)
    return int(local.shape[0])


def pack_shard(store_path: str | os.PathLike[str], p: int, route_paths: Sequence[str | os.PathLike[str]],
               seg_offsets: np.ndarray, part_path: str | os.PathLike[str], *,
               dcache_targets: Sequence[RowTarget] | None = None, tier_targets: Sequence[RowTarget] | None = None,
               row_bytes: int | None = None, read_chunk: int = READ_CHUNK, write_buffer: int = WRITE_BUFFER,
               early: EarlyPart | None = None) -> dict[str, Any]:
    """The batched packing task of shard p: read the shard once, write part-p.bin and its target rows.

    Args:
        store_path: the ingested store.
        p: the shard index.
        route_paths: the round's routing files, in round order.
        seg_offsets: int64 [n, P] (or shard p's column [n]) from `route.segment_offsets`.
        part_path: where part-p.bin goes (written under a temporary name, renamed at the end).
        dcache_targets: disk-cache rows files (from `prepare_targets`); rows of shard p are written.
        tier_targets: GPU-tier and CPU-init rows files (from `prepare_targets`).
        row_bytes: expected row size (checked against the store), optional.
        read_chunk: bytes per sequential read of the shard.
        write_buffer: bytes gathered before each write to the part file.
        early: the part file's first batches, written by `pack_early` while planning: the rest is
            appended to that file, which is then moved to `part_path` (same file system).

    Returns:
        ``{"shard", "crc" (int64 [n], crc32 per segment), "rows", "bytes_read" (raw shard bytes),
        "bytes_written" (packed row bytes), "file_bytes" (part file size, padding included),
        "target_bytes_written", "seconds"}``.
    """
    t0 = time.perf_counter()
    store = Store(store_path)
    if not 0 <= p < len(store.shards):
        raise ValueError(f"shard {p} out of range: the store has {len(store.shards)} shards")
    rb = store.row_bytes
    if row_bytes is not None and row_bytes != rb:
        raise ValueError(f"row_bytes {row_bytes} does not match the store's {rb}")
    offsets = np.asarray(seg_offsets, dtype=np.int64)
    col = offsets[:, p] if offsets.ndim == 2 else offsets
    n = col.shape[0]
    shard = store.shards[p]
    if early is not None:
        release_early_maps(Path(early.path).parent, p)     # this process's map of it from `pack_early`
    feats = _LazyShard(shard, store.feature_dtype, store.feature_dim, read_chunk, resident=early is not None)

    crc = np.zeros(n, dtype=np.int64)
    part = Path(part_path)
    if early is None:
        rows_total = 0
        with atomic_path(part) as tmp:
            fd, direct = _open_new(tmp)
            w = _SegmentWriter(fd, part, write_buffer, rb, direct)
            try:
                for route in _routes(route_paths, n):
                    rows_total += _append_segments(w, route, p, shard, feats.rows, col, crc)
                w.finish()
            finally:
                w.close()
                os.close(fd)
    else:
        if not 0 <= early.batches <= n or early.crc.shape != (early.batches,):
            raise ValueError(f"shard {p}: early part covers {early.batches} batches with {early.crc.shape} crcs, "
                             f"the round has {n}")
        crc[:early.batches] = early.crc
        rows_total = early.rows
        src = Path(early.path)
        fd, direct = _open_part(src, early.position)
        w = _SegmentWriter(fd, part, write_buffer, rb, direct, start=early.position)
        try:
            for route in _routes(route_paths, n):
                if route.first_batch + route.num_batches <= early.batches:
                    continue
                if route.first_batch < early.batches:
                    raise ValueError(f"shard {p}: the early part ends at batch {early.batches}, inside "
                                     f"{route.path} (batches {route.first_batch}..)")
                rows_total += _append_segments(w, route, p, shard, feats.rows, col, crc)
            w.finish()
            os.ftruncate(fd, w.written)
            os.fsync(fd)
        finally:
            w.close()
            os.close(fd)
        part.parent.mkdir(parents=True, exist_ok=True)      # as `atomic_path` does for a fresh part file
        try:
            os.replace(src, part)
        except OSError as e:            # another file system: copy it under a temporary name instead
            if e.errno != errno.EXDEV:
                raise InputError(part, f"cannot move the part file begun while planning into place ({e})") from e
            with atomic_path(part) as tmp:
                shutil.copyfile(src, tmp)
            src.unlink()
    target_bytes = _write_targets(list(tier_targets or []) + list(dcache_targets or []), feats, shard, rb)
    return {"shard": p, "crc": crc, "rows": rows_total, "bytes_read": feats.bytes_read, "bytes_written": rows_total * rb,
            "file_bytes": w.written, "target_bytes_written": target_bytes, "seconds": time.perf_counter() - t0}


# (early_dir, shard) -> (the shard file's identity, its memory map)
_EARLY_MAPS: dict[tuple[str, int], tuple[tuple[Any, ...], np.ndarray]] = {}
_EARLY_MAPS_LOCK = threading.Lock()


def _early_map(early_dir: str, p: int, shard: FeatureShard, store: Store) -> np.ndarray:
    """Shard `p` mapped for `pack_early`, kept between its tasks of one run: mapping and unmapping the
    read-ahead shards afresh for every superbatch took a fifth of each task. Maps kept for another
    run's directory (a run that failed, or whose last early task ran in another process) are dropped;
    a map is reused only for the same file, unchanged (path, place, inode, size, mtime)."""
    try:
        st = os.stat(shard.path)
    except OSError as e:
        raise InputError(shard.path, f"cannot open feature shard ({e.strerror or e})") from e
    ident = (str(shard.path), shard.offset, shard.rows, st.st_ino, st.st_size, st.st_mtime_ns)
    key = (early_dir, p)
    with _EARLY_MAPS_LOCK:
        for k in [k for k in _EARLY_MAPS if k[0] != early_dir]:
            del _EARLY_MAPS[k]
        kept = _EARLY_MAPS.get(key)
    if kept is not None and kept[0] == ident:
        return kept[1]
    mapped = map_shard(shard, store.feature_dtype, store.feature_dim, populate=True)
    with _EARLY_MAPS_LOCK:
        _EARLY_MAPS[key] = (ident, mapped)
    return mapped


def release_early_maps(early_dir: str | os.PathLike[str] | None = None, shard: int | None = None) -> None:
    """Unmap what `pack_early` kept in this process: for `early_dir` (None: every run), shard `shard` (None:
    all). Mapped pages are not dropped from the page cache (``POSIX_FADV_DONTNEED``), so every run ends with
    this: its last early task, each shard's pack task and a failed run's clean-up call it."""
    with _EARLY_MAPS_LOCK:
        for k in [k for k in _EARLY_MAPS
                  if (early_dir is None or k[0] == str(early_dir)) and (shard is None or k[1] == shard)]:
            del _EARLY_MAPS[k]


def pack_early(store_path: str | os.PathLike[str], shards: Sequence[int], route: dict[str, Any],
               early_dir: str | os.PathLike[str], previous: dict[int, EarlyPart] | None = None, *,
               final: bool = False, min_cached: float = RESIDENT, write_buffer: int = WRITE_BUFFER
               ) -> dict[int, EarlyPart]:
    """Begin the part files of read-ahead shards while later superbatches are still being planned.

    Batched packing must wait for the last route before it reads a shard, since a shard is read
    once for the whole round; the disk meanwhile sits idle while the plan chain runs. A shard the
    read-ahead (`warm_shards`) already holds in the page cache costs no disk read, so its segments
    for a superbatch can be written as soon as that superbatch is routed. This task appends the
    segments of `route` (one superbatch's routing result) to ``early_dir/part-p.bin`` for every
    shard in `shards` that is still resident and whose part file ends where this superbatch
    begins, gathering rows from a memory map of the shard (no copy, no read). The writes overlap
    the chain instead of the pack phase; `pack_shard` appends the rest of the round (`EarlyPart`).

    A shard mostly evicted (less than `min_cached` of its pages in the page cache) is left where
    it stands: it would cost random reads here, and the pack phase reads it whole. The shards' maps
    are kept for the run's next early task (`release_early_maps`); `final`: the run's last early task,
    which lets them go (so does any task that fails). Returns the shards' states (`previous` updated;
    shards never begun are absent).
    """
    store = Store(store_path)
    states = dict(previous or {})
    first, rb = int(route["first_batch"]), store.row_bytes
    out = Path(early_dir)
    out.mkdir(parents=True, exist_ok=True)
    rf = RouteFile(route["path"])
    # Shard by shard, each shard's writes left in flight while the next shard is gathered: the task
    # then takes about as long as its writes, not their sum with the gathering. Two writers at most
    # are alive, each on its own set of this thread's buffers (`_SegmentWriter._thread_buffers`).
    open_: tuple[_SegmentWriter, int, int, EarlyPart | None, np.ndarray, int] | None = None

    def close_previous(ok: bool) -> None:
        nonlocal open_
        if open_ is None:
            return
        w, fd, p, prev, crc, rows = open_
        open_ = None
        try:
            if ok:
                w.finish()
        finally:
            w.close()
            os.close(fd)
        states[p] = EarlyPart(str(out / part_name(p)), first + rf.num_batches, w.written,
                              (prev.rows if prev else 0) + rows,
                              np.concatenate([prev.crc if prev else np.zeros(0, np.int64), crc[first:]]))

    ok = False
    try:
        if rf.first_batch != first:
            raise InputError(rf.path, f"starts at batch {rf.first_batch}, the route task said {first}")
        nb = rf.num_batches
        sizes = np.asarray(padded(rf.seg_rows.astype(np.int64) * rb), dtype=np.int64)    # [nb, P]
        buf = int(min(write_buffer, max(int(sizes[:, list(shards)].sum(axis=0).max()) if len(shards) else 0, ALIGN)))
        opened = 0
        for p in shards:
            prev = states.get(p)
            if (prev.batches if prev is not None else 0) != first:
                continue                                   # fell behind: the pack phase carries on from prev
            shard = store.shards[p]
            if _shard_cached_share(shard, shard.rows * rb) < min_cached:
                continue
            path = out / part_name(p)
            fd, direct = _open_new(path) if prev is None else _open_part(path, prev.position)
            position = 0 if prev is None else prev.position
            col = np.zeros(first + nb, dtype=np.int64)
            col[first:] = position + np.r_[0, np.cumsum(sizes[:, p])[:-1]]
            crc = np.zeros(first + nb, dtype=np.int64)
            try:
                w = _SegmentWriter(fd, path, buf, rb, direct, start=position, tag=("segments", "early")[opened % 2])
                opened += 1
            except BaseException:
                os.close(fd)
                raise
            try:
                mapped = _early_map(str(early_dir), p, shard, store)
                rows = _append_segments(w, rf, p, shard, lambda m=mapped: m, col, crc)
                del mapped
                w.flush()                                  # whole pages (segments are padded): all in flight
            except BaseException:
                w.close()
                os.close(fd)
                raise
            close_previous(True)
            open_ = (w, fd, p, prev, crc, rows)
        ok = True
    finally:
        close_previous(ok)
        rf.close()
        if final or not ok:
            release_early_maps(early_dir)
    return states


def write_tier_rows(store_path: str | os.PathLike[str], p: int, targets: Sequence[RowTarget],
                    read_chunk: int = READ_CHUNK) -> dict[str, Any]:
    """Fill the tier/disk-cache rows that live in shard p, with no packed segments (the Ginex layout).

    Reads shard p once, sequentially, like `pack_shard`.
    """
    store = Store(store_path)
    shard = store.shards[p]
    feats = _LazyShard(shard, store.feature_dtype, store.feature_dim, read_chunk)
    written = _write_targets(list(targets), feats, shard, store.row_bytes)
    return {"shard": p, "bytes_read": feats.bytes_read, "target_bytes_written": written}


# ---------------------------------------------------------------------------- naive baseline

def _drop_cache(path: Path) -> None:
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
                for route in _routes(route_paths, n):
                    local = [_local_rows(route, p, store.shards[p]) for p in range(P)]
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


# ---------------------------------------------------------------------------- a whole round, serially
