"""The writers of packing's output files: `SegmentWriter` appends a part file's 4096-aligned segments through
large page-aligned buffers written by background threads (O_DIRECT where the filesystem takes it), and
`write_rows_at` writes a tier's rows at their offset of a preallocated file. `gather_segment` is the one
gather of a segment's rows (and their crc32) both packers use.
"""
from __future__ import annotations

import collections
import errno
import fcntl
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from pathlib import Path

import numpy as np

from ...errors import InputError
from ...native import kernels
from ...native.constants import ALIGN
from ..formats.directwrite import open_direct
from ..formats.directwrite import write_all as _write_all  # a module name of its own: tests patch it here
from ..formats.threadbuffers import thread_buffer

__all__ = ["WRITES_IN_FLIGHT", "WRITE_BUFFER", "SegmentWriter", "gather_segment", "open_new", "write_rows_at"]

WRITE_BUFFER = 32 << 20   # bytes gathered before one write to a part file
WRITES_IN_FLIGHT = 2      # a part file's writes under way at once


def open_new(path: Path) -> tuple[int, bool]:
    """Create `path` for large aligned appends: with O_DIRECT where the filesystem takes it, else buffered.

    Part files are written once and not read back by the packing machine, so O_DIRECT skips
    the page-cache copy and the dirty-page writeback throttling (buffered writes of a round's
    packed bytes ran 5-9x slower than O_DIRECT on the benchmark VM) and keeps them out of memory.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = open_direct(path, flags)
    return (fd, True) if fd is not None else (os.open(path, flags, 0o644), False)


def _clear_direct(fd: int) -> None:
    """Turn O_DIRECT off on `fd` (for a last write that is not whole pages)."""
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~getattr(os, "O_DIRECT", 0))


_WRITERS = threading.local()     # each thread's background writers (`SegmentWriter._thread_writer`), by tag


class SegmentWriter:
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
        """The file offset the next appended byte will have."""
        return self.written + self.fill

    def _wait(self, keep: int = 0) -> None:
        """Wait for the oldest writes until at most `keep` are in flight."""
        while len(self._pending) > keep:
            self._pending.popleft().result()                    # re-raises the writer's InputError

    def flush(self) -> None:
        """Hand the filled buffer to a background write (whole pages only when direct) and go on in the next."""
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
        """Append `n` zero bytes (a segment's padding)."""
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


def write_rows_at(path: Path, feats: np.ndarray, rows: np.ndarray, offset: int) -> None:
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
