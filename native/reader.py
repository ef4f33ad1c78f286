"""Direct-I/O reader: the thin Python wrapper of `reader.cpp` (bound in `bindings.cpp`).

Reads lists of (file, offset, length) requests straight from disk into caller-provided buffers,
with many requests in flight and the GIL released, so a loader thread can stream packed segments
and disk-cache pages into pinned host memory while Python keeps training (docs/design.md,
"Direct I/O" and "The pipelined trainer").

* Files are opened with ``O_DIRECT`` (the page cache is bypassed: no double buffering, no memory
  contention with the sampler, true disk traffic). Where the file system refuses it (tmpfs) the
  file is opened buffered and a ``RuntimeWarning`` names it.
* In direct mode every offset, length and buffer address must be a multiple of ``ALIGN`` (4096);
  a misaligned request raises ``ValueError`` before anything is read. Allocate buffers with
  :func:`aligned_empty` (or use pinned torch tensors via ``.numpy()``, which are page-aligned).
* Backends: ``"uring"`` (io_uring through its system calls, in every build; used when the kernel
  allows it at run time, see :func:`uring_unavailable`) keeps ``queue_depth`` requests in flight
  from one thread; ``"pread"`` runs ``threads`` blocking ``pread`` threads. ``"auto"`` takes
  io_uring when it can, else pread with a ``RuntimeWarning`` saying why. ``DISKFLOW_NO_URING=1`` in the
  environment refuses io_uring as a kernel that forbids it would (``"auto"`` reads with pread and warns,
  ``"uring"`` raises ``OSError``): the fallback can be had and tested anywhere.
* :meth:`DirectReader.read_rows` reads fixed-size rows at arbitrary byte offsets by reading each
  distinct unit once (a 4 KiB page; with ``unit_bytes=SECTOR`` a 512-byte sector where the device's
  direct-I/O alignment allows it; adjacent units merged into one request) and copying the rows out.
* Errors are Python exceptions naming the file and the offset: ``OSError`` (``FileNotFoundError``
  etc.), :class:`ShortReadError` (an ``OSError``: the file ended before the requested bytes) and
  ``ValueError`` (misaligned or out-of-bounds request, bad handle).

Example::

    with DirectReader(queue_depth=64) as r:
        h = r.open("part-00000.bin")
        buf = aligned_empty(8 << 20)
        r.read(np.array([h, h]), np.array([0, 4 << 20]), np.array([4 << 20] * 2), buf,
               np.array([0, 4 << 20]))
"""
from __future__ import annotations

import errno
import os
import warnings
import weakref
from typing import Any

import numpy as np

from . import _native
from .closing import Closing
from .constants import (
    ALIGN,
    DEFAULT_BOUNCE_BYTES,
    DEFAULT_MERGE_BYTES,
    DEFAULT_QUEUE_DEPTH,
    DEFAULT_THREADS,
)
from .forward import NativeInt

ShortReadError: type[OSError] = _native.ShortReadError
BACKENDS = ("auto", "uring", "pread")
NO_URING = "DISKFLOW_NO_URING"   # set (to anything but "" or "0"): io_uring is refused, as by the kernel

_LIVE: weakref.WeakSet[DirectReader] = weakref.WeakSet()     # every reader of this process
_INHERITED: list[Any] = []      # a forked child's copies of its parent's readers: never destroyed there


def _keep_inherited_readers() -> None:
    """In a forked child: the parent's readers came along, but not their pread threads or ring thread.
    Their native halves are kept for good, so no destructor joins a thread that is not there (a crash);
    the child opens readers of its own (e.g. `diskflow.pyg`'s loader workers)."""
    _INHERITED.extend(r._impl for r in list(_LIVE))
    _LIVE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_keep_inherited_readers)


def _refused_by_environment() -> str:
    value = os.environ.get(NO_URING, "")
    return "" if value in ("", "0") else f"{NO_URING}={value} is set"


def uring_unavailable() -> str:
    """``""`` when io_uring is usable in this process, else why not (e.g. ``"io_uring_setup failed:
    Operation not permitted"`` under a seccomp filter, or ``"DISKFLOW_NO_URING=1 is set"``). The kernel
    is probed once per process: a small ring reads one byte from a pipe."""
    return _refused_by_environment() or str(_native.uring_unavailable())


def aligned_empty(nbytes: int) -> np.ndarray:
    """A 1-D uint8 array of `nbytes` whose data address is a multiple of 4096 (zero-filled).

    It is an anonymous memory mapping owned by the array (unmapped when the array is freed), so
    it can be the destination of O_DIRECT reads.
    """
    return _native.aligned_empty(int(nbytes))


def _as_int64(values: Any, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype.kind not in "iu" and arr.size:
        raise ValueError(f"{name}: expected integers, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr.reshape(-1), dtype=np.int64)


def _as_out(out: Any) -> Any:
    """numpy arrays pass through; torch tensors (e.g. pinned host buffers) as their numpy view."""
    if not isinstance(out, np.ndarray) and hasattr(out, "numpy"):
        return out.numpy()
    return out


class DirectReader(Closing):
    """Reads many requests in flight from files opened with O_DIRECT (see the module docstring).

    The defaults are the engine's (`diskflow.native.constants`, defined in `native/constants.h`).

    Args:
        queue_depth: requests in flight with io_uring (the ring size).
        threads: pread threads (requests in flight with the pread backend).
        backend: "auto" (io_uring when usable, else pread), "uring" (io_uring or an error), "pread".
        direct: open files with O_DIRECT (False: buffered, no alignment rules).
        merge_bytes: read_rows merges adjacent pages into requests of at most this many bytes.
        bounce_bytes: read_rows' staging buffer; larger page sets are read in several rounds.
        gap_bytes: read_rows reads through at most this many untouched bytes between two touched
            pages (a multiple of 4096; 0: only adjacent pages merge): fewer, larger requests for
            more bytes, for a device whose request rate is the limit.
        unit_bytes: read_rows' unit, a power of two in [SECTOR, ALIGN] (default ALIGN: whole pages).
            A direct file is read in units of at least its own direct-I/O alignment (statx reports
            it; ALIGN where the kernel does not), so a smaller unit takes effect only where the
            device allows it: fewer bytes per row of a sparse read (GNNDrive's sector requests).

    Attributes:
        backend: the backend in use, "uring" or "pread".

    One reader serialises its own calls (a lock); use one reader per loader thread for parallel
    streams. Usable as a context manager (closes its files).
    """

    def __init__(self, queue_depth: int = DEFAULT_QUEUE_DEPTH, threads: int = DEFAULT_THREADS, backend: str = "auto",
                 direct: bool = True, *, merge_bytes: int = DEFAULT_MERGE_BYTES,
                 bounce_bytes: int = DEFAULT_BOUNCE_BYTES, gap_bytes: int = 0, unit_bytes: int = ALIGN) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        refused = _refused_by_environment() if backend != "pread" else ""
        if refused and backend == "uring":
            raise OSError(errno.EPERM, f"backend 'uring' unavailable: {refused}")
        self._impl = _native.DirectReader(int(queue_depth), int(threads), "pread" if refused else backend,
                                          bool(direct), int(merge_bytes), int(bounce_bytes))
        _LIVE.add(self)
        self.backend: str = self._impl.backend
        if gap_bytes:
            self._impl.set_gap_bytes(int(gap_bytes))
        if unit_bytes != ALIGN:
            self._impl.set_unit_bytes(int(unit_bytes))
        why = refused or self._impl.fallback_reason
        if why:
            warnings.warn(f"io_uring unavailable ({why}); reading with {threads} pread threads instead",
                          RuntimeWarning, stacklevel=2)

    queue_depth = NativeInt("Requests in flight with io_uring.")
    threads = NativeInt("pread threads (requests in flight with the pread backend).")
    merge_bytes = NativeInt("read_rows' longest request of merged adjacent pages.")
    gap_bytes = NativeInt("read_rows' longest run of untouched bytes read through between two touched pages.")
    unit_bytes = NativeInt("read_rows' unit as set (a file may need more: `unit_of`).")

    def unit_of(self, handle: int) -> int:
        """The unit read_rows reads the file of `handle` in: `unit_bytes`, or the file's direct-I/O
        alignment where that is larger."""
        return int(self._impl.unit_of(int(handle)))

    bounce_bytes = NativeInt("read_rows' staging buffer (rounded up to ALIGN).")

    def open(self, path: str | os.PathLike[str]) -> int:
        """Open a file for reading; returns its handle.

        Raises:
            FileNotFoundError (or another OSError) naming the path.
        Warns:
            RuntimeWarning naming the file when its file system refuses O_DIRECT (it is then read
            through the page cache, and alignment is not required).
        """
        p = os.fspath(path)
        handle, _, refused = self._impl.open(p)
        if refused:
            warnings.warn(f"{p}: {refused}; reading it through the page cache", RuntimeWarning, stacklevel=2)
        return int(handle)

    def is_direct(self, handle: int) -> bool:
        """Whether the file of `handle` is read with O_DIRECT."""
        return bool(self._impl.is_direct(int(handle)))

    def path(self, handle: int) -> str:
        """The path the file of `handle` was opened with."""
        return str(self._impl.path_of(int(handle)))

    def close_file(self, handle: int) -> None:
        """Close one file (its handle becomes invalid)."""
        self._impl.close_file(int(handle))

    def read(self, handles: np.ndarray | int, offsets: np.ndarray, lengths: np.ndarray, out: np.ndarray,
             out_offsets: np.ndarray) -> None:
        """Read request i: bytes [offsets[i], offsets[i] + lengths[i]) of file handles[i] into
        out[out_offsets[i] : out_offsets[i] + lengths[i]].

        Args:
            handles: file handle per request (or one handle for all).
            offsets, lengths, out_offsets: int arrays, one entry per request.
            out: writable C-contiguous uint8 buffer (numpy array, or a torch tensor's ``.numpy()``).

        Raises:
            ValueError: misaligned request in direct mode, request outside `out`, bad handle.
            ShortReadError: a file ended before a request's last byte (names file and offset).
            OSError: any other I/O error (names file and offset). Requests in flight are drained
                before it is raised.
        """
        offs = _as_int64(offsets, "offsets")
        hs = _as_int64(np.broadcast_to(np.asarray(handles), offs.shape) if np.ndim(handles) == 0 else handles,
                       "handles")
        self._impl.read(hs, offs, _as_int64(lengths, "lengths"), _as_out(out), _as_int64(out_offsets, "out_offsets"))

    def read_rows(self, handle: int, row_offsets: np.ndarray, row_bytes: int, out: np.ndarray) -> None:
        """Read rows of `row_bytes` bytes at byte offsets `row_offsets` into out [n, row_bytes] (uint8).

        Each distinct unit (`unit_of` the file: a 4 KiB page unless `unit_bytes` is smaller) the
        rows touch is read once (rows may straddle units or repeat; adjacent units are merged into
        one request), so the counters show bytes_read = distinct units x unit and bytes_requested =
        n x row_bytes. No alignment is required of the rows or of `out`. A row's last unit may
        extend past the end of the file.
        """
        self._impl.read_rows(int(handle), _as_int64(row_offsets, "row_offsets"), int(row_bytes), _as_out(out))

    def counters(self) -> dict[str, float]:
        """bytes_requested, bytes_read (from disk), requests (issued to the kernel, after
        splitting at 4 MiB and merging pages), seconds (time spent in read calls)."""
        return dict(self._impl.counters())

    def reset_counters(self) -> None:
        """Zero the counters."""
        self._impl.reset_counters()

    def close(self) -> None:
        """Close every file and free the reader's buffers; the reader cannot be used afterwards."""
        self._impl.close()

    def __repr__(self) -> str:
        return f"DirectReader(backend={self.backend!r}, queue_depth={self.queue_depth})"


__all__ = ["ALIGN", "BACKENDS", "DirectReader", "ShortReadError", "aligned_empty", "uring_unavailable"]
