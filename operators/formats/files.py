"""On-disk discipline shared by every stage: temp name -> rename -> manifest last.

A directory is valid only when its `manifest.json` exists; everything else is written
under a temporary name first and renamed into place, so a crash never leaves a
half-written file that looks valid. Feature arrays are `.npy` files whose data starts
at a 4096-byte boundary (O_DIRECT-friendly, and still loadable with `np.load`).

A full disk (ENOSPC) met while writing through `atomic_path` or `staging_dir` leaves
nothing under the final name and is raised as `DiskFullError` naming that final name,
which the CLI prints as one line.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import mmap
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from ...native.constants import ALIGN  # array data is padded to the O_DIRECT granularity
from .errors import ConfigError, DiskFullError, InputError, is_disk_full
from .threadbuffers import thread_buffer

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

MANIFEST = "manifest.json"
_FINGERPRINT_EDGE = 1 << 20  # bytes hashed at each end of a file for its fingerprint


def fits_int32(arrays: Iterable[np.ndarray]) -> bool:
    """Every value of every (integer) array is within int32's range."""
    lo, hi = np.iinfo(np.int32).min, np.iinfo(np.int32).max
    return all(a.size == 0 or (int(a.min()) >= lo and int(a.max()) <= hi) for a in map(np.asarray, arrays))


def narrow_int(a: np.ndarray) -> np.ndarray:
    """`a` as int32 when every value fits (half the bytes of an int64 array written to a cache file), else
    as it is; readers widen what they load."""
    a = np.asarray(a)
    return a.astype(np.int32) if a.dtype.kind in "iu" and a.itemsize > 4 and fits_int32([a]) else a


def byte_offsets(rows: np.ndarray, row_bytes: int, base: int | np.ndarray = 0) -> np.ndarray:
    """int64 byte offsets ``base + rows * row_bytes`` of fixed-size rows in a file.

    Ids and addresses are stored as int32 where they fit, and NumPy keeps an int32 array's
    dtype when it is multiplied by a Python int: a row past 2 GiB / row_bytes would wrap to a
    negative offset. Every offset computed from a row, id, slot or address goes through here,
    promoted to int64 before the multiplication.
    """
    return np.asarray(rows).astype(np.int64, copy=False) * np.int64(row_bytes) + np.asarray(base, np.int64)


def tmp_name(path: str | os.PathLike[str]) -> Path:
    """A unique temporary sibling of `path` (same filesystem, so rename is atomic)."""
    p = Path(path)
    return p.with_name(f".{p.name}.tmp-{uuid.uuid4().hex[:12]}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], durable: bool = True, parents: bool = True) -> Iterator[Path]:
    """Yield a temporary path to write; on success it is fsynced and renamed onto `path`.

    `durable=False` skips the fsync, for scratch files that live and die within one run (the
    rename still keeps a half-written file from ever carrying the final name).
    `parents=False` does not create the parent directory: a Dask task that outlives its failed
    run then fails instead of resurrecting the directory the run has just cleaned up.
    """
    final = Path(path)
    if parents:
        final.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(final)
    try:
        yield tmp
        if durable and tmp.is_file():
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            if tmp.is_dir():
                shutil.rmtree(tmp)
            else:
                tmp.unlink()
        raise_if_disk_full(e, final)
        raise


def write_json(path: str | os.PathLike[str], obj: Any, durable: bool = True) -> None:
    """Write JSON atomically (sorted keys, so identical content gives identical bytes); `durable`: see `atomic_path`."""
    with atomic_path(path, durable) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def write_bytes(path: str | os.PathLike[str], data: Any, durable: bool = True, parents: bool = True) -> None:
    """Write a buffer (bytes, a uint8 array, an Arrow buffer) to `path` atomically; `durable`, `parents`: see
    `atomic_path`."""
    with atomic_path(path, durable, parents) as tmp, open(tmp, "wb") as f:
        f.write(memoryview(data))


def _ipc_writer(schema: pa.Schema, batches: Sequence[pa.RecordBatch], metadata: dict[str, Any] | None
                ) -> Callable[[Any], None]:
    """A function writing an Arrow IPC file of `batches` (schema with `metadata`, values as strings) to the
    sink it is given; it may be called more than once (a dry run to size the file, then the real one)."""
    schema = schema.with_metadata({k: str(v) for k, v in (metadata or {}).items()})

    def write(sink: Any) -> None:
        with pa.ipc.new_file(sink, schema) as writer:
            for rb in batches:
                writer.write_batch(rb)

    return write


SCRATCH_KEEP = 256 << 20        # a thread keeps its direct-write buffer up to this size for its next file


def _write_scratch(nbytes: int, keep: np.ndarray | None = None) -> np.ndarray:
    """This thread's direct-write buffer (`thread_buffer` "write", kept up to `SCRATCH_KEEP`)."""
    return thread_buffer("write", nbytes, keep, SCRATCH_KEEP)


def write_all(fd: int, view: np.ndarray, path: str | os.PathLike[str], offset: int | None = None) -> None:
    """Write every byte of `view`: at the file position, or at `offset` (`pwrite`), whatever each call takes;
    errors name the file (and the offset)."""
    data = view.reshape(-1).view(np.uint8).data
    done = 0
    while done < data.nbytes:
        at = "" if offset is None else f" at byte {offset + done}"
        try:
            n = os.write(fd, data[done:]) if offset is None else os.pwrite(fd, data[done:], offset + done)
        except OSError as e:
            raise InputError(path, f"write{at} failed ({e.strerror or e})") from e
        if n <= 0:
            raise InputError(path, f"short write{at}")
        done += n


def open_direct(path: str | os.PathLike[str], flags: int, mode: int = 0o644) -> int | None:
    """A descriptor of `path` opened with `flags` | O_DIRECT, or None where the file system (tmpfs) or the
    platform refuses O_DIRECT."""
    direct = getattr(os, "O_DIRECT", 0)
    if not direct:
        return None
    try:
        return os.open(path, flags | direct, mode)
    except OSError:
        return None


def write_arrow_file(path: str | os.PathLike[str], schema: pa.Schema, batches: Iterable[pa.RecordBatch],
                     metadata: dict[str, Any] | None = None, durable: bool = True, parents: bool = True,
                     warm: Sequence[str] = ()) -> int:
    """Write an Arrow IPC file of `batches` past the page cache; its size (see `write_arrow_file_view`)."""
    return int(write_arrow_file_view(path, schema, batches, metadata, durable, parents, warm).size)


def write_arrow_file_view(path: str | os.PathLike[str], schema: pa.Schema, batches: Iterable[pa.RecordBatch],
                          metadata: dict[str, Any] | None = None, durable: bool = True, parents: bool = True,
                          warm: Sequence[str] = ()) -> pa.Buffer:
    """Write an Arrow IPC file of `batches` (schema with `metadata`) to `path` atomically, past the page
    cache where the file system allows (O_DIRECT); return the file's bytes as a view of this thread's write
    buffer, valid only until the thread's next direct write (inspect them at once). `durable`, `parents`:
    see `atomic_path`.

    A samples file is tens of MB written once and read back in part (its node ids) by few: a buffered
    write copies every byte into freshly allocated page-cache pages, which cost preparation more CPU than
    the sampling itself. The file is serialised into a reused page-aligned buffer sized up front (a dry
    run through `pa.MockOutputStream` measures it) and written in whole pages; the file is then cut to
    its size. The bytes are the same as `arrow_file_bytes` gives.

    `warm`: list columns whose values the next tasks read back (a samples file's ``n_id``): once the file
    is in place, the kernel reads just those bytes back into the page cache in the background
    (POSIX_FADV_WILLNEED), so its readers neither wait for the disk nor fault its pages in one by one.
    """
    batches = list(batches)
    write = _ipc_writer(schema, batches, metadata)

    mock = pa.MockOutputStream()
    write(mock)
    size = int(mock.size())
    buf = _write_scratch(-(-size // ALIGN) * ALIGN)
    fixed = pa.FixedSizeBufferWriter(pa.py_buffer(buf))
    write(fixed)
    if fixed.tell() != size:
        raise AssertionError(f"{path}: the Arrow file took {fixed.tell()} bytes, its dry run {size}")
    final = Path(path)
    _write_direct(final, buf, size, durable, parents)
    if warm:
        _warm_columns(final, buf[:size], warm)
    return pa.py_buffer(buf[:size])


def _write_direct(final: Path, buf: np.ndarray, size: int, durable: bool, parents: bool) -> None:
    """Write ``buf[:size]`` (`buf` page-aligned, whole pages long) to `final` atomically: whole pages with
    O_DIRECT, then cut to `size`; buffered where the file system refuses O_DIRECT."""
    whole = -(-size // ALIGN) * ALIGN
    buf[size:whole] = 0
    with atomic_path(final, durable, parents) as tmp:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        fd = open_direct(tmp, flags)
        try:
            if fd is not None:
                write_all(fd, buf[:whole], final)
                os.ftruncate(fd, size)
            else:
                fd = os.open(tmp, flags, 0o644)
                write_all(fd, buf[:size], final)
        finally:
            if fd is not None:
                os.close(fd)


class _ScratchStream(io.RawIOBase):
    """A seekable, write-only stream into this thread's page-aligned write buffer, grown (and its bytes
    kept) where a write passes its end: what `np.savez`'s zip writer writes into, for `write_npz`."""

    def __init__(self, expect: int) -> None:
        super().__init__()
        self.buf = _write_scratch(-(-max(expect, 1) // ALIGN) * ALIGN)
        self.pos = self.end = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else (self.pos + offset if whence == 1 else self.end + offset)
        return self.pos

    def write(self, b: Any) -> int:
        view = np.frombuffer(memoryview(b).cast("B"), np.uint8)
        need = self.pos + view.shape[0]
        if need > self.buf.shape[0]:
            grown = _write_scratch(-(-(2 * need) // ALIGN) * ALIGN, keep=self.buf[:self.end])
            self.buf = grown
        self.buf[self.pos:need] = view
        self.pos = need
        self.end = max(self.end, need)
        return view.shape[0]


def write_npz(path: str | os.PathLike[str], arrays: dict[str, np.ndarray], durable: bool = True,
              parents: bool = True) -> None:
    """`np.savez` of `arrays` to `path` atomically, past the page cache (as `write_arrow_file`): the zip is
    built in this thread's reused page-aligned buffer and written in whole pages. The same bytes as
    `np.savez` writes to a file."""
    stream = _ScratchStream(sum(int(np.asarray(a).nbytes) for a in arrays.values()) + 1024 * (len(arrays) + 4))
    np.savez(stream, **arrays)  # type: ignore[arg-type]
    _write_direct(Path(path), stream.buf, stream.end, durable, parents)


def _warm_columns(path: Path, data: np.ndarray, columns: Sequence[str]) -> None:
    """Ask the kernel to read the values of list `columns` of the Arrow file `path` (whose bytes are `data`)
    into the page cache (best effort: nothing is raised)."""
    try:
        base = pa.py_buffer(data)
        reader = pa.ipc.open_file(pa.BufferReader(base))
        ranges = []
        for i in range(reader.num_record_batches):
            rb = reader.get_batch(i)
            for name in columns:
                values = rb.column(name).values.buffers()[-1]
                if values is not None and values.size:
                    ranges.append((values.address - base.address, values.size))
        fd = os.open(path, os.O_RDONLY)
    except (OSError, KeyError, pa.ArrowException):
        return
    try:
        for offset, length in ranges:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
    except (OSError, AttributeError):
        pass
    finally:
        os.close(fd)


def arrow_file_bytes(schema: pa.Schema, batches: Iterable[pa.RecordBatch], metadata: dict[str, Any] | None = None
                     ) -> pa.Buffer:
    """The bytes of an Arrow IPC file of `batches` (schema with `metadata`, values as strings), built in memory.

    Written into one buffer sized up front from the batches (a growing output stream reallocates and
    copies its tens of MB several times over, each time into freshly faulted pages: it cost more than
    sampling the batches); an estimate that falls short falls back to the growing stream.
    """
    batches = list(batches)
    write = _ipc_writer(schema, batches, metadata)

    buffers = sum(len(col.buffers()) for rb in batches for col in rb.columns)
    estimate = (sum(rb.nbytes for rb in batches) + 64 * buffers + 1024 * (len(batches) + 2)
                + 2 * len(schema.serialize()) + 2 * len(json.dumps(metadata or {}, default=str)) + 4096)
    try:
        out = pa.allocate_buffer(estimate)
        fixed = pa.FixedSizeBufferWriter(out)
        write(fixed)
        return out.slice(0, fixed.tell())
    except (pa.ArrowException, OSError):      # the estimate fell short
        pass
    stream = pa.BufferOutputStream()
    write(stream)
    return stream.getvalue()


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The directory's manifest, or None when it has none (i.e. it is not a finished output)."""
    p = Path(directory) / MANIFEST
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(p, f"unreadable manifest ({e})") from e


def write_manifest(directory: str | os.PathLike[str], manifest: dict[str, Any], durable: bool = True) -> None:
    """Write `manifest.json` last: from this moment the directory is a valid output.

    `durable=False` skips the fsync, for scratch outputs that never outlive the process using them.
    """
    write_json(Path(directory) / MANIFEST, manifest, durable)


@contextlib.contextmanager
def staging_dir(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Build a whole output directory under a temporary sibling, then swap it into place.

    The caller writes everything (manifest last) into the yielded directory. On success
    the old `final` (if any) is moved aside and removed; on failure the staging
    directory is deleted and `final` is left untouched. Whether `final` may be replaced
    at all is the caller's question (`outputs.check_replaceable`), asked before this.
    """
    final_p = Path(final)
    try:
        final_p.parent.mkdir(parents=True, exist_ok=True)
        stage = tmp_name(final_p)
        stage.mkdir()
    except OSError as e:
        raise_if_disk_full(e, final_p)
        raise InputError(final_p.parent, f"cannot create the output here ({e.strerror or e})") from e
    try:
        yield stage
    except BaseException as e:
        shutil.rmtree(stage, ignore_errors=True)
        raise_if_disk_full(e, final_p)
        raise
    trash = None
    if final_p.exists() or final_p.is_symlink():
        trash = tmp_name(final_p)
        os.replace(final_p, trash)
    os.replace(stage, final_p)
    if trash is not None:
        remove_path(trash)


def remove_path(path: str | os.PathLike[str]) -> None:
    """Remove a file, a symlink or a directory tree, whichever `path` is (missing is fine)."""
    p = Path(path)
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def raise_if_disk_full(exc: BaseException, path: str | os.PathLike[str]) -> None:
    """If `exc` means a full disk, raise it again as one `DiskFullError` naming `path`; else return.

    Each layer that writes names its own path, so the outermost one the user knows wins:
    `atomic_path` names the file, `staging_dir` the output directory (the temporary names
    inside are gone by then). A free-space check's error (bytes needed and free known) is
    left as it is.
    """
    if isinstance(exc, DiskFullError) and exc.needed is not None:
        return
    if is_disk_full(exc):
        raise DiskFullError(path, "no space left on device; nothing was published there (free some space, "
                                  "or choose another filesystem)") from exc


def preallocate(fd: int, nbytes: int) -> None:
    """Reserve `nbytes` of disk for the open file `fd` (zero-filled), so a full disk fails here.

    A sparse file that is later filled through a memory map gets SIGBUS, not ENOSPC, when the
    disk runs out (the worker process dies without a word); reserving the blocks up front turns
    that into an `OSError` at allocation time. Filesystems that cannot reserve fall back to a
    sparse size (as before).
    """
    if nbytes <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, nbytes)
    except AttributeError:      # no posix_fallocate on this platform
        os.ftruncate(fd, nbytes)


def fingerprint(path: str | os.PathLike[str]) -> str:
    """A cheap content fingerprint: size, mtime and a hash of the first and last MiB.

    Hashing hundreds of GB on every re-run would cost as much as the work it saves;
    size + mtime + both ends catches rewrites, truncation and appends.
    """
    p = Path(path)
    try:
        st = p.stat()
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
        with open(p, "rb") as f:
            h.update(f.read(_FINGERPRINT_EDGE))
            if st.st_size > 2 * _FINGERPRINT_EDGE:
                f.seek(-_FINGERPRINT_EDGE, os.SEEK_END)
                h.update(f.read(_FINGERPRINT_EDGE))
    except OSError as e:
        raise InputError(p, f"unreadable file ({e.strerror or e})") from e
    return h.hexdigest()


def config_hash(config: dict[str, Any]) -> str:
    """Stable hash of a JSON-able config dict."""
    blob = json.dumps(config, sort_keys=True, default=_json_default).encode()
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


# ---------------------------------------------------------------------------- aligned .npy

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
    its bytes are read from the file (pread, `chunk` at a time) instead of faulted in through the map.

    Copying through the map leaves every page of `src` mapped into this process: its RSS then
    counts a second copy of what it loaded (page cache, reclaimable, but resident and counted until
    the kernel needs it back). Read with pread, those pages are page cache only. Anything else (a
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


def npy_bytes(array: np.ndarray) -> np.ndarray:
    """The bytes `save_npy` would write, in memory."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array))
    return np.frombuffer(buf.getbuffer(), np.uint8)


def save_npy(path: str | os.PathLike[str], array: np.ndarray) -> None:
    """Atomically write a plain .npy file."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, np.ascontiguousarray(array))


# ---------------------------------------------------------------------------- byte sizes

def parse_bytes(value: str | float, option: str = "size") -> int:
    """A byte size such as `512MiB`, `2GiB`, `1.5GB` or `4096` (Dask's own parser); errors name the option."""
    from dask.utils import parse_bytes as dask_parse_bytes

    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(option, f"not a byte size: {value!r} (use e.g. 512MiB, 2GiB, 1.5GB)")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ConfigError(option, f"must be >= 0, got {value}")
        return int(value)
    try:
        if not value.strip() or not value.strip()[0].isdigit() and value.strip()[0] not in ".-":
            raise ValueError(value)         # Dask reads a bare unit ("MiB") as one of it
        n = dask_parse_bytes(value.strip())
    except (ValueError, TypeError):
        raise ConfigError(option, f"not a byte size: {value!r} (use e.g. 512MiB, 2GiB, 1.5GB)") from None
    if n < 0:
        raise ConfigError(option, f"must be >= 0, got {value}")
    return int(n)


def format_bytes(n: float) -> str:
    """Human-readable binary size."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"
