"""NumPy arrays on disk: ``.npy`` and ``.npz`` files read safely beside other threads, and ``.npy`` files
written atomically, plain or aligned.

An aligned ``.npy`` (`create_aligned_npy`, `save_aligned_npy`) has its data at byte 4096 (``ALIGN``), so it
can be read with O_DIRECT and is still loadable with `np.load`; feature arrays are stored so. `read_into`
copies a memory-mapped array by reading its file, without mapping its pages into the process.
"""
from __future__ import annotations

import io
import mmap
import os
import threading
from pathlib import Path
from typing import Literal

import numpy as np

from ...errors import InputError
from ...native.constants import ALIGN  # array data is padded to the O_DIRECT granularity
from .atomic import atomic_path, preallocate

__all__ = ["NpzReader", "aligned_npy_bytes", "aligned_npy_header", "create_aligned_npy", "load_npy", "load_npz",
           "npy_bytes", "npy_header", "read_into", "save_aligned_npy", "save_npy"]

# CPython 3.11 keeps one AST recursion counter per interpreter: two threads building ASTs at once can
# fail with "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905). numpy
# parses every .npy header with ast.literal_eval, and Dask's threaded scheduler runs tasks in threads,
# so every .npy/.npz read of the package goes through this lock (`load_npy`, `NpzReader`).
_NPY_LOCK = threading.Lock()


def load_npy(path: str | os.PathLike[str], mmap_mode: Literal["r+", "r", "w+", "c"] | None = None) -> np.ndarray:
    """``np.load`` of one ``.npy`` file (no pickles), safe beside other threads that read arrays."""
    with _NPY_LOCK:
        return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)


class NpzReader:
    """An ``.npz`` file whose members are read one at a time under the package's array lock (see `load_npy`)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        with _NPY_LOCK:
            self._z = np.load(path, allow_pickle=False)
        self.files = list(self._z.files)

    def __getitem__(self, name: str) -> np.ndarray:
        with _NPY_LOCK:
            return self._z[name]

    def close(self) -> None:
        self._z.close()


def load_npz(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every member of an ``.npz`` file, read under the package's array lock (see `load_npy`)."""
    z = NpzReader(path)
    try:
        return {name: z[name] for name in z.files}
    finally:
        z.close()


def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """A version-1.0 .npy header padded so the array data starts at ALIGN bytes."""
    d = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": tuple(shape)}
    text = repr(d).encode("latin1")
    prefix = b"\x93NUMPY\x01\x00"
    body_len = ALIGN - len(prefix) - 2
    if len(text) + 1 > body_len:
        raise ValueError("npy header too long")
    text = text + b" " * (body_len - len(text) - 1) + b"\n"
    return prefix + body_len.to_bytes(2, "little") + text


def aligned_npy_header(dtype: np.dtype | str, shape: tuple[int, ...]) -> bytes:
    """The first 4096 bytes of an aligned .npy of `dtype` and `shape` (its header, padded)."""
    return _npy_header(np.dtype(dtype), tuple(int(n) for n in shape))


def create_aligned_npy(path: str | os.PathLike[str], dtype: np.dtype | str, shape: tuple[int, ...], *,
                       reserve: bool = True) -> np.memmap:
    """Create (zero-filled, its blocks reserved: see `preallocate`) an .npy file with data at offset 4096;
    return a writable memmap.

    ``reserve=False`` leaves the file sparse (holes read as zeros, blocks taken as rows are written):
    for a file of which only some rows will ever be written, at the price of a SIGBUS instead of
    an error should the disk fill while writing through the map.
    """
    dt = np.dtype(dtype)
    header = _npy_header(dt, shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    try:
        with open(path, "wb") as f:
            f.write(header)
            f.flush()
            if reserve:
                preallocate(f.fileno(), ALIGN + nbytes)
            else:
                f.truncate(ALIGN + nbytes)
    except OSError:
        Path(path).unlink(missing_ok=True)      # no half-reserved file is left on a full disk
        raise
    if nbytes == 0:
        return np.zeros(shape, dtype=dt)  # type: ignore[return-value]
    return np.memmap(path, dtype=dt, mode="r+", offset=ALIGN, shape=shape)


def read_into(src: np.ndarray, out: np.ndarray, chunk: int = 64 << 20) -> None:
    """``out[...] = src``; when `src` is a whole memory-mapped array (``np.load(..., mmap_mode="r")``),
    its bytes are read from the file (pread, `chunk` at a time) instead of faulted in through the map,
    and each chunk's pages are then dropped from the page cache (``posix_fadvise(DONTNEED)``).

    Copying through the map leaves every page of `src` mapped into this process: its RSS then
    counts a second copy of what it loaded (page cache, reclaimable, but resident and counted until
    the kernel needs it back). Read with pread, those pages are page cache only, and a memory cgroup
    still counts them until dropped: a trainer that loads a 358 MiB CPU tier under a cgroup limit would
    otherwise reclaim them batch by batch, in its allocating threads. Anything else (a
    plain array, a slice of a map, another dtype or shape) is copied as usual.

    Raises:
        InputError: the file is shorter than the map says (naming the file and offset).
    """
    contiguous = out.flags.c_contiguous and src.flags.c_contiguous
    if not (isinstance(src, np.memmap) and isinstance(src.base, mmap.mmap) and src.filename and contiguous
            and src.dtype == out.dtype and src.shape == out.shape):
        out[...] = src
        return
    view = memoryview(out.reshape(-1).view(np.uint8))
    fd = os.open(src.filename, os.O_RDONLY)
    try:
        done = 0
        while done < view.nbytes:
            n = os.preadv(fd, [view[done:done + chunk]], src.offset + done)
            if n <= 0:
                raise InputError(src.filename, f"file ends at byte {src.offset + done}, expected "
                                               f"{src.offset + view.nbytes} (truncated?)")
            if hasattr(os, "posix_fadvise"):    # read once into `out`: no second copy kept in the page cache
                os.posix_fadvise(fd, src.offset + done, n, os.POSIX_FADV_DONTNEED)
            done += n
    finally:
        os.close(fd)


def save_aligned_npy(path: str | os.PathLike[str], array: np.ndarray) -> None:
    """Atomically write `array` as an .npy whose data starts at offset 4096."""
    arr = np.ascontiguousarray(array)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(_npy_header(arr.dtype, arr.shape))
        f.write(arr.reshape(-1).view(np.uint8).data if arr.size else b"")


def aligned_npy_bytes(array: np.ndarray) -> np.ndarray:
    """The bytes `save_aligned_npy` would write, in memory (data at offset 4096)."""
    arr = np.ascontiguousarray(array)
    out = np.empty(ALIGN + arr.nbytes, np.uint8)
    out[:ALIGN] = np.frombuffer(_npy_header(arr.dtype, arr.shape), np.uint8)
    out[ALIGN:] = arr.reshape(-1).view(np.uint8)
    return out


def npy_header(dtype: np.dtype | str, shape: tuple[int, ...]) -> bytes:
    """The header `np.save` (and ``np.lib.format.open_memmap``) writes for a C-order array of `dtype` and
    `shape`: version 1.0, padded to a multiple of 64 bytes; the data follows it."""
    d = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
         "shape": tuple(int(n) for n in shape)}
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, d)
    return buf.getvalue()


def npy_bytes(array: np.ndarray) -> np.ndarray:
    """The bytes `save_npy` would write, in memory."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array))
    return np.frombuffer(buf.getbuffer(), np.uint8)


def save_npy(path: str | os.PathLike[str], array: np.ndarray) -> None:
    """Atomically write a plain .npy file."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, np.ascontiguousarray(array))
