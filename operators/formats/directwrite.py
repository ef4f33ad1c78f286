"""Files written past the page cache (O_DIRECT) from a reused page-aligned buffer: Arrow IPC files
(`write_arrow_file`) and ``.npz`` archives (`write_npz`), each built in this thread's write buffer and
written atomically in whole pages, then cut to size; buffered where the file system refuses O_DIRECT.

A file written once and read back in part by few (a samples file, a plan) would otherwise copy every
byte into freshly allocated page-cache pages, at more CPU than the work that made it. `open_direct` and
`write_all` are the two steps for other writers; `arrow_file_bytes` gives the bytes of such an Arrow file
in memory. (Reading past the page cache is the native reader's; `diskread` times the disk's floor.)
"""
from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import InputError
from ...native.constants import ALIGN
from .atomic import atomic_path
from .threadbuffers import thread_buffer

__all__ = ["SCRATCH_KEEP", "arrow_file_bytes", "open_direct", "write_all", "write_arrow_file", "write_arrow_file_view",
           "write_npz"]


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
