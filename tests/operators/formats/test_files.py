"""`files.read_into`: a memory-mapped array copied by reading its file, without mapping its pages in."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from diskflow.operators.formats import threadbuffers
from diskflow.operators.formats.errors import InputError
from diskflow.operators.formats.files import read_into, save_aligned_npy


def _resident_file_pages(arr: np.memmap) -> int:
    """Bytes of `arr`'s file resident in this process's mappings (``Rss`` of its lines in smaps)."""
    total = 0
    name = str(Path(arr.filename).resolve())
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.endswith(name):
            for rest in lines[i + 1:]:
                if rest.startswith("Rss:"):
                    total += int(rest.split()[1]) * 1024
                    break
    return total


def test_a_memmap_is_read_not_mapped(tmp_path: Path) -> None:
    rows = np.random.default_rng(0).standard_normal((3000, 97)).astype(np.float32)
    save_aligned_npy(tmp_path / "a.npy", rows)
    src = np.load(tmp_path / "a.npy", mmap_mode="r")
    out = np.empty_like(rows)
    read_into(src, out, chunk=10_000)                        # many short preads, one ending mid-row
    assert np.array_equal(out, rows)
    assert _resident_file_pages(src) == 0                    # nothing of the file was faulted into this process
    plain = np.empty_like(rows)
    plain[...] = src
    assert _resident_file_pages(src) > 0                     # what copying through the map does


def test_anything_else_is_copied(tmp_path: Path) -> None:
    rows = np.arange(600, dtype=np.int64).reshape(200, 3)
    save_aligned_npy(tmp_path / "b.npy", rows)
    src = np.load(tmp_path / "b.npy", mmap_mode="r")
    for s in (rows, src[10:60], src[:, :2]):                # a plain array, slices of the map
        out = np.empty(s.shape, np.int64)
        read_into(s, out)
        assert np.array_equal(out, s)
    out = np.empty((200, 3), np.float64)                     # another dtype: numpy converts
    read_into(src, out)
    assert np.array_equal(out, rows)


def test_a_truncated_file_is_named(tmp_path: Path) -> None:
    save_aligned_npy(tmp_path / "c.npy", np.ones((100, 10), np.float32))
    src = np.load(tmp_path / "c.npy", mmap_mode="r")
    with open(tmp_path / "c.npy", "r+b") as f:
        f.truncate(4096 + 1000)
    with pytest.raises(InputError, match="c.npy: file ends at byte 5096"):
        read_into(src, np.empty((100, 10), np.float32))


def test_arrays_read_from_many_threads(tmp_path: Path) -> None:
    """`load_npy` and `NpzReader` (every .npy/.npz read of the package, numpy parsing each header with
    `ast.literal_eval`) give the arrays back when task threads read at once: CPython 3.11's AST
    constructor is not safe to run in two threads together (python/cpython#106905)."""
    from concurrent.futures import ThreadPoolExecutor

    from diskflow.operators.formats.files import NpzReader, load_npy

    a = np.arange(1000, dtype=np.int64)
    np.save(tmp_path / "a.npy", a)
    with open(tmp_path / "z.npz", "wb") as f:
        np.savez(f, **{f"m{i}": a + i for i in range(8)})

    def read(i: int) -> bool:
        z = NpzReader(tmp_path / "z.npz")
        try:
            ok = all(np.array_equal(z[f"m{j}"], a + j) for j in range(8))
        finally:
            z.close()
        return ok and np.array_equal(load_npy(tmp_path / "a.npy", "r" if i % 2 else None), a)

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(read, range(200)))


def test_arrow_file_bytes_equal_a_growing_stream_and_fall_back_when_the_estimate_is_short(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Built in one buffer sized up front, the IPC bytes are those of pyarrow's growing output stream, for
    list columns of several widths; a buffer that turns out too small falls back to the stream."""
    import pyarrow as pa
    from diskflow.operators.formats import files

    rng = np.random.default_rng(0)
    batches = [pa.RecordBatch.from_arrays(
        [pa.array([i], pa.int64()),
         pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), pa.array(rng.integers(0, 9, n).astype(np.int32))),
         pa.ListArray.from_arrays(pa.array([0, 3], pa.int32()), pa.array(np.arange(3, dtype=np.uint8)))],
        names=["batch", "ids", "small"]) for i, n in enumerate((0, 1, 7, 100_003))]

    def streamed() -> pa.Buffer:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, batches[0].schema.with_metadata({"key": "e0-s00001"})) as w:
            for rb in batches:
                w.write_batch(rb)
        return sink.getvalue()

    expected = streamed()
    assert files.arrow_file_bytes(batches[0].schema, iter(batches), {"key": "e0-s00001"}).equals(expected)
    monkeypatch.setattr(pa, "allocate_buffer", lambda n: pa.py_buffer(bytearray(64)))   # an estimate far too small
    assert files.arrow_file_bytes(batches[0].schema, batches, {"key": "e0-s00001"}).equals(expected)


@pytest.mark.parametrize("where", ["disk", "shm"])
def test_write_arrow_file_writes_the_same_bytes_past_the_page_cache(tmp_path: Path, where: str) -> None:
    """`write_arrow_file` (whole pages with O_DIRECT, then cut to size; buffered where the file system refuses
    O_DIRECT, as tmpfs does) writes exactly `arrow_file_bytes`' bytes, for sizes on and off a page boundary,
    reusing its buffer between files; the temporary name never outlives the call."""
    import pyarrow as pa
    from diskflow.operators.formats import files

    base = tmp_path if where == "disk" else Path("/dev/shm")
    if not base.is_dir():
        pytest.skip("no /dev/shm")
    rng = np.random.default_rng(1)
    for n in (0, 5, 1021, 300_001):
        batches = [pa.RecordBatch.from_arrays(
            [pa.array([i], pa.int64()),
             pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), pa.array(rng.integers(0, 1 << 30, n).astype(np.int32)))],
            names=["batch", "ids"]) for i in range(3)]
        out = base / f"diskflow-test-{where}-{n}.arrow"
        try:
            size = files.write_arrow_file(out, batches[0].schema, batches, {"n": n})
            data = out.read_bytes()
            assert size == len(data)
            assert files.arrow_file_bytes(batches[0].schema, batches, {"n": n}).equals(pa.py_buffer(data))
            assert [p.name for p in base.glob(f".{out.name}*")] == []
        finally:
            out.unlink(missing_ok=True)


def test_write_arrow_file_reads_the_warm_columns_back_into_the_page_cache(tmp_path: Path) -> None:
    """Written past the page cache, a file's `warm` list columns are read back into it (in the background):
    their pages end up cached, and the bytes are unchanged."""
    import os
    import time

    import pyarrow as pa
    from diskflow.operators.formats import files
    from diskflow.operators.prepare.pack import cached_share

    rng = np.random.default_rng(2)
    batches = [pa.RecordBatch.from_arrays(
        [pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), pa.array(rng.integers(0, 1 << 30, n).astype(np.int32)))
         for n in (50_000, 400_000)], names=["ids", "edges"]) for _ in range(3)]
    expected = files.arrow_file_bytes(batches[0].schema, batches)
    reader = pa.ipc.open_file(pa.BufferReader(expected))
    spans = [(b.address - expected.address, b.size) for b in
             (reader.get_batch(i).column("ids").values.buffers()[-1] for i in range(reader.num_record_batches))]
    out = tmp_path / "s.arrow"
    files.write_arrow_file(out, batches[0].schema, batches, warm=("ids",))
    fd = os.open(out, os.O_RDONLY)
    try:
        deadline = time.monotonic() + 10
        while min(cached_share(fd, o, n) for o, n in spans) < 1.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert min(cached_share(fd, o, n) for o, n in spans) == 1.0
    finally:
        os.close(fd)
    assert expected.equals(pa.py_buffer(out.read_bytes()))


@pytest.mark.parametrize("where", ["disk", "shm"])
def test_write_npz_writes_what_np_savez_writes(tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`write_npz` (the zip built in the thread's write buffer, written past the page cache) writes a valid
    zip of the same members and bytes as `np.savez`, also when its buffer must grow mid-write and where
    O_DIRECT is refused (tmpfs)."""
    import io
    import zipfile

    from diskflow.operators.formats import files

    base = tmp_path if where == "disk" else Path("/dev/shm")
    if not base.is_dir():
        pytest.skip("no /dev/shm")
    rng = np.random.default_rng(4)
    arrays = {"a": rng.integers(0, 9, 100_003).astype(np.int32), "b": np.zeros(0, np.int64),
              "c": rng.random((7, 5)), "s": np.array("e0-s00001")}
    want = io.BytesIO()
    np.savez(want, **arrays)
    with zipfile.ZipFile(want) as z:
        members = {n: z.read(n) for n in z.namelist()}
    out = base / f"diskflow-test-npz-{where}.npz"
    try:
        for small in (False, True):
            if small:       # a fresh one-page buffer: every large write grows it
                threadbuffers.drop_thread_buffers()
                monkeypatch.setattr(files._ScratchStream, "__init__", _small_stream_init)
            files.write_npz(out, arrays)
            with zipfile.ZipFile(out) as z:
                assert z.testzip() is None
                assert {n: z.read(n) for n in z.namelist()} == members
            assert out.stat().st_size == len(want.getvalue())
            got = files.load_npz(out)
            assert set(got) == set(arrays) and all(np.array_equal(got[k], arrays[k]) for k in arrays)
    finally:
        out.unlink(missing_ok=True)


def _small_stream_init(self: object, expect: int) -> None:
    """`_ScratchStream.__init__` with a one-page buffer, so writes must grow it."""
    import io

    from diskflow.operators.formats import files

    io.RawIOBase.__init__(self)  # type: ignore[arg-type]
    self.buf = files._write_scratch(files.ALIGN)  # type: ignore[attr-defined]
    self.pos = self.end = 0  # type: ignore[attr-defined]


def test_thread_buffers_are_kept_per_thread_until_dropped() -> None:
    """`thread_buffer` hands a thread back its own buffer (grown when asked for more), never another
    thread's; `drop_thread_buffers`, called from any thread, lets every thread's go (their bytes), and a
    buffer still held stays intact while the thread's next call makes a new one."""
    import threading


    threadbuffers.drop_thread_buffers()
    mine = threadbuffers.thread_buffer("test-a", 10_000)
    assert mine.ctypes.data % 4096 == 0 and mine.shape[0] >= 10_000
    assert threadbuffers.thread_buffer("test-a", 5_000).ctypes.data == mine.ctypes.data       # the same, kept
    grown = threadbuffers.thread_buffer("test-a", 3 << 20)
    assert grown.ctypes.data != mine.ctypes.data and threadbuffers.thread_buffer("test-a", 8).ctypes.data == grown.ctypes.data
    big = [threadbuffers.thread_buffer("test-big", 1 << 20, limit=4096) for _ in range(2)]
    assert big[0].ctypes.data != big[1].ctypes.data                                # over its limit: not kept
    theirs: list[np.ndarray] = []
    go = threading.Event()

    def other() -> None:
        theirs.append(threadbuffers.thread_buffer("test-a", 10_000))
        go.wait()

    t = threading.Thread(target=other)
    t.start()
    while not theirs:
        go.wait(0.001)
    assert theirs[0].ctypes.data != grown.ctypes.data
    held = threadbuffers.thread_buffer("test-a", 8)
    held[:4] = [1, 2, 3, 4]
    assert threadbuffers.kept_thread_buffer_bytes() == grown.nbytes + theirs[0].nbytes
    assert threadbuffers.drop_thread_buffers() == grown.nbytes + theirs[0].nbytes        # this thread's and the other's
    assert threadbuffers.kept_thread_buffer_bytes() == 0
    assert list(held[:4]) == [1, 2, 3, 4]                                          # still the holder's
    assert threadbuffers.thread_buffer("test-a", 8).ctypes.data != held.ctypes.data
    go.set()
    t.join()
    threadbuffers.drop_thread_buffers()
