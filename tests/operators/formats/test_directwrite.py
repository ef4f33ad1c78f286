"""`directwrite`: Arrow IPC files and ``.npz`` archives written past the page cache hold the bytes pyarrow's and
NumPy's own writers give, on disk and where O_DIRECT is refused (tmpfs)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from diskflow.native.constants import ALIGN
from diskflow.operators.formats import threadbuffers
from diskflow.operators.formats.npyio import load_npz


def test_arrow_file_bytes_equal_a_growing_stream_and_fall_back_when_the_estimate_is_short(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Built in one buffer sized up front, the IPC bytes are those of pyarrow's growing output stream, for
    list columns of several widths; a buffer that turns out too small falls back to the stream."""
    import pyarrow as pa
    from diskflow.operators.formats import directwrite

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
    assert directwrite.arrow_file_bytes(batches[0].schema, iter(batches), {"key": "e0-s00001"}).equals(expected)
    monkeypatch.setattr(pa, "allocate_buffer", lambda n: pa.py_buffer(bytearray(64)))   # an estimate far too small
    assert directwrite.arrow_file_bytes(batches[0].schema, batches, {"key": "e0-s00001"}).equals(expected)


@pytest.mark.parametrize("where", ["disk", "shm"])
def test_write_arrow_file_writes_the_same_bytes_past_the_page_cache(tmp_path: Path, where: str) -> None:
    """`write_arrow_file` (whole pages with O_DIRECT, then cut to size; buffered where the file system refuses
    O_DIRECT, as tmpfs does) writes exactly `arrow_file_bytes`' bytes, for sizes on and off a page boundary,
    reusing its buffer between files; the temporary name never outlives the call."""
    import pyarrow as pa
    from diskflow.operators.formats import directwrite

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
            size = directwrite.write_arrow_file(out, batches[0].schema, batches, {"n": n})
            data = out.read_bytes()
            assert size == len(data)
            assert directwrite.arrow_file_bytes(batches[0].schema, batches, {"n": n}).equals(pa.py_buffer(data))
            assert [p.name for p in base.glob(f".{out.name}*")] == []
        finally:
            out.unlink(missing_ok=True)


def test_write_arrow_file_reads_the_warm_columns_back_into_the_page_cache(tmp_path: Path) -> None:
    """Written past the page cache, a file's `warm` list columns are read back into it (in the background):
    their pages end up cached, and the bytes are unchanged."""
    import os
    import time

    import pyarrow as pa
    from diskflow.operators.formats import directwrite
    from diskflow.operators.prepare.pack import cached_share

    rng = np.random.default_rng(2)
    batches = [pa.RecordBatch.from_arrays(
        [pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), pa.array(rng.integers(0, 1 << 30, n).astype(np.int32)))
         for n in (50_000, 400_000)], names=["ids", "edges"]) for _ in range(3)]
    expected = directwrite.arrow_file_bytes(batches[0].schema, batches)
    reader = pa.ipc.open_file(pa.BufferReader(expected))
    spans = [(b.address - expected.address, b.size) for b in
             (reader.get_batch(i).column("ids").values.buffers()[-1] for i in range(reader.num_record_batches))]
    out = tmp_path / "s.arrow"
    directwrite.write_arrow_file(out, batches[0].schema, batches, warm=("ids",))
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

    from diskflow.operators.formats import directwrite

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
                monkeypatch.setattr(directwrite._ScratchStream, "__init__", _small_stream_init)
            directwrite.write_npz(out, arrays)
            with zipfile.ZipFile(out) as z:
                assert z.testzip() is None
                assert {n: z.read(n) for n in z.namelist()} == members
            assert out.stat().st_size == len(want.getvalue())
            got = load_npz(out)
            assert set(got) == set(arrays) and all(np.array_equal(got[k], arrays[k]) for k in arrays)
    finally:
        out.unlink(missing_ok=True)


def _small_stream_init(self: object, expect: int) -> None:
    """`_ScratchStream.__init__` with a one-page buffer, so writes must grow it."""
    import io

    from diskflow.operators.formats import directwrite

    io.RawIOBase.__init__(self)  # type: ignore[arg-type]
    self.buf = directwrite._write_scratch(ALIGN)
    self.pos = self.end = 0  # type: ignore[attr-defined]
