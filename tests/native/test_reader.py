"""The native direct-I/O reader: byte-exact reads per backend, O_DIRECT fallback, page-merged row
reads and their counters, errors (named file and offset, no crash), true disk traffic, GIL release.

Data files live on the repository's disk (never tmpfs) so O_DIRECT really bypasses the page cache.
Both backends run everywhere io_uring is allowed (every build has it); the pread fallback when it
is refused is exercised by a queue depth the kernel refuses and by a seccomp filter in a subprocess.
"""
from __future__ import annotations

import errno
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from diskflow.native.constants import SECTOR
from diskflow.native.reader import ALIGN, DirectReader, ShortReadError, aligned_empty, uring_unavailable

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
WAIT_S = 60.0       # a guard against a hang: what a test reads on for comes within a second
FILE_BYTES = 8 * MiB + 5 * ALIGN  # not a power of two; a multiple of 4096 (padded like packed files)


BACKENDS = [
    "pread",
    # io_uring is in every build; only a kernel that refuses it at run time skips these.
    pytest.param("uring", marks=pytest.mark.skipif(bool(uring_unavailable()),
                                                   reason=f"io_uring refused here: {uring_unavailable()}")),
]


def _fs_type(path: Path) -> str:
    """File system type of the mount holding `path` (longest mount point prefix in mountinfo)."""
    best, fstype = "", "?"
    real = str(path.resolve())
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            mount, kind = fields[4], fields[fields.index("-") + 1]
            if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                best, fstype = mount, kind
    return fstype


@pytest.fixture(scope="module")
def disk_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory on a real disk: pytest's tmp dir unless that is tmpfs, else one in the repo."""
    base = tmp_path_factory.mktemp("reader")
    if _fs_type(base) not in ("tmpfs", "ramfs"):
        yield base
        return
    with tempfile.TemporaryDirectory(dir=REPO, prefix=".test-reader-") as d:
        assert _fs_type(Path(d)) not in ("tmpfs", "ramfs")
        yield Path(d)


def _write(path: Path, data: np.ndarray) -> Path:
    data.tofile(path)
    return path


@pytest.fixture(scope="module")
def data(disk_dir: Path) -> tuple[Path, np.ndarray]:
    """A file of random bytes on disk, and its content as Python reads it."""
    rng = np.random.default_rng(11)
    path = _write(disk_dir / "data.bin", rng.integers(0, 256, FILE_BYTES, dtype=np.uint8))
    return path, np.fromfile(path, dtype=np.uint8)


def _random_requests(rng: np.random.Generator, n: int, file_bytes: int, align: int) -> tuple[np.ndarray, ...]:
    """n requests of 1..8 units of `align` bytes (one of 5 MiB + a page, to be split), placed in
    shuffled order in the output buffer, and one empty request."""
    lengths = rng.integers(1, 9, n) * align
    lengths[n // 2] = 5 * MiB + ALIGN
    lengths[n // 3] = 0
    offsets = rng.integers(0, (file_bytes - lengths) // align + 1) * align
    slot = np.zeros(n, dtype=np.int64)
    order = rng.permutation(n)
    slot[order] = np.concatenate([[0], np.cumsum(lengths[order])[:-1]])
    return offsets, lengths, slot


def _expected(content: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, slots: np.ndarray,
              size: int) -> np.ndarray:
    want = np.zeros(size, dtype=np.uint8)
    for o, n, s in zip(offsets, lengths, slots):  # per request: the test's reference, not a hot path
        want[s:s + n] = content[o:o + n]
    return want


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_is_byte_exact(backend: str, data: tuple[Path, np.ndarray]) -> None:
    path, content = data
    rng = np.random.default_rng(1)
    offsets, lengths, slots = _random_requests(rng, 300, content.size, ALIGN)
    with DirectReader(queue_depth=16, threads=3, backend=backend) as r:
        assert r.backend == backend
        h = r.open(path)
        assert r.is_direct(h)
        out = aligned_empty(int(lengths.sum()))
        r.read(np.full(offsets.size, h), offsets, lengths, out, slots)
        np.testing.assert_array_equal(out, _expected(content, offsets, lengths, slots, out.size))
        c = r.counters()
        assert c["bytes_requested"] == c["bytes_read"] == lengths.sum()
        # Each request is one kernel request except the 5 MiB one, split at 4 MiB (and the empty one).
        assert c["requests"] == offsets.size - 1 + 1
        assert c["seconds"] > 0
        r.reset_counters()
        assert r.counters() == {"bytes_requested": 0, "bytes_read": 0, "requests": 0, "seconds": 0}


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_files_one_call_and_torch_buffer(backend: str, data: tuple[Path, np.ndarray], disk_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    path, content = data
    other = np.arange(64 * ALIGN, dtype=np.uint32).view(np.uint8)[: 64 * ALIGN]
    path2 = _write(disk_dir / f"other-{backend}.bin", other)
    with DirectReader(queue_depth=4, backend=backend) as r:
        h1, h2 = r.open(path), r.open(path2)
        pinned = torch.cuda.is_available()
        t = torch.empty(3 * ALIGN, dtype=torch.uint8, pin_memory=pinned) if pinned else torch.from_numpy(
            aligned_empty(3 * ALIGN))
        r.read(np.array([h2, h1, h2]), np.array([ALIGN, 0, 63 * ALIGN]), np.full(3, ALIGN), t,
               np.array([0, ALIGN, 2 * ALIGN]))
        got = t.numpy()
        np.testing.assert_array_equal(got[:ALIGN], other[ALIGN:2 * ALIGN])
        np.testing.assert_array_equal(got[ALIGN:2 * ALIGN], content[:ALIGN])
        np.testing.assert_array_equal(got[2 * ALIGN:], other[63 * ALIGN:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_buffered_mode_needs_no_alignment(backend: str, data: tuple[Path, np.ndarray]) -> None:
    path, content = data
    rng = np.random.default_rng(2)
    offsets, lengths, slots = _random_requests(rng, 100, content.size, 1)
    offsets += rng.integers(0, 3, offsets.size) * (offsets + lengths + 3 <= content.size)
    with DirectReader(backend=backend, direct=False) as r:
        h = r.open(path)
        assert not r.is_direct(h)
        out = np.empty(int(lengths.sum()) + 1, dtype=np.uint8)[1:]  # deliberately misaligned
        r.read(h, offsets, lengths, out, slots)
        np.testing.assert_array_equal(out, _expected(content, offsets, lengths, slots, out.size))


def test_fallback_when_the_file_system_refuses_o_direct() -> None:
    # procfs refuses O_DIRECT (EINVAL at open) on every kernel; so did tmpfs before Linux 6.6.
    path = "/proc/self/cmdline"
    want = np.frombuffer(Path(path).read_bytes(), dtype=np.uint8)
    with DirectReader() as r:
        with pytest.warns(RuntimeWarning, match="/proc/self/cmdline"):
            h = r.open(path)
        assert not r.is_direct(h)
        out = np.zeros(want.size - 1, dtype=np.uint8)
        r.read(h, [1], [want.size - 1], out, [0])  # unaligned: fine in buffered mode
        np.testing.assert_array_equal(out, want[1:])


def test_tmpfs(data: tuple[Path, np.ndarray]) -> None:
    """/dev/shm: refused O_DIRECT -> warning + buffered reads; accepted (Linux >= 6.6) -> direct."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or _fs_type(shm) != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    content = data[1][: 64 * ALIGN]
    with tempfile.TemporaryDirectory(dir=shm) as d:
        path = _write(Path(d) / "x.bin", content)
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
            refused = False
        except OSError:
            refused = True
        with DirectReader() as r:
            if refused:
                with pytest.warns(RuntimeWarning, match=str(path)):
                    h = r.open(path)
            else:
                h = r.open(path)  # warnings are errors here: none may be emitted
            assert r.is_direct(h) is not refused
            out = aligned_empty(8 * ALIGN)
            r.read(h, [ALIGN, 40 * ALIGN], [4 * ALIGN, 4 * ALIGN], out, [4 * ALIGN, 0])
            np.testing.assert_array_equal(out[:4 * ALIGN], content[40 * ALIGN:44 * ALIGN])
            np.testing.assert_array_equal(out[4 * ALIGN:], content[ALIGN:5 * ALIGN])


def _page_runs(row_offsets: np.ndarray, row_bytes: int, max_pages: int, unit: int = ALIGN) -> tuple[int, int]:
    """(distinct units, requests) the unit-merged read must issue: runs of consecutive units (4 KiB
    pages unless told), each cut into pieces of at most max_pages units."""
    first = row_offsets // unit
    count = (row_offsets + row_bytes - 1) // unit - first + 1
    pages = np.unique(np.repeat(first, count) + np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count))
    breaks = np.flatnonzero(np.diff(pages) != 1)
    run_len = np.diff(np.concatenate([[0], breaks + 1, [pages.size]]))
    return int(pages.size), int(np.sum((run_len + max_pages - 1) // max_pages))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("row_bytes,merge_bytes,bounce_bytes", [
    (188, 1 * MiB, 32 * MiB),          # odd rows, everything in one round
    (188, 4 * ALIGN, 8 * ALIGN),       # short merges, many rounds: rows straddle requests and rounds
    (12, 2 * ALIGN, 2 * ALIGN),        # tiny rows, one request per round
    (5000, 3 * ALIGN, 7 * ALIGN),      # rows longer than a page
    (4096, 1 * MiB, 32 * MiB),         # page rows at unaligned offsets (two pages each)
])
def test_read_rows_page_merged(backend: str, row_bytes: int, merge_bytes: int, bounce_bytes: int,
                               data: tuple[Path, np.ndarray]) -> None:
    path, content = data
    rng = np.random.default_rng(row_bytes + merge_bytes)
    # Clustered random rows (adjacent pages merge), duplicates, the file's last bytes, unsorted.
    hot = rng.integers(0, 40, 300) * 97 + 3 * MiB
    anywhere = rng.integers(0, content.size - row_bytes + 1, 300)
    offsets = np.concatenate([hot, anywhere, anywhere[:50], [content.size - row_bytes, 0, ALIGN - 1]])
    offsets = rng.permutation(offsets).astype(np.int64)
    want = content[offsets[:, None] + np.arange(row_bytes)]
    pages, requests = _page_runs(offsets, row_bytes, merge_bytes // ALIGN)
    with DirectReader(backend=backend, queue_depth=8, merge_bytes=merge_bytes, bounce_bytes=bounce_bytes) as r:
        h = r.open(path)
        out = np.full((offsets.size, row_bytes), 7, dtype=np.uint8)  # unaligned out is fine here
        r.read_rows(h, offsets, row_bytes, out)
        np.testing.assert_array_equal(out, want)
        c = r.counters()
        assert c["bytes_read"] == pages * ALIGN
        assert c["bytes_requested"] == offsets.size * row_bytes
        assert c["requests"] == requests
        r.read_rows(h, np.zeros(0, dtype=np.int64), row_bytes, np.empty((0, row_bytes), np.uint8))
        assert r.counters()["requests"] == requests


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("row_bytes,merge_bytes,bounce_bytes", [
    (512, 1 * MiB, 32 * MiB),          # sector rows at unaligned offsets
    (80, 2 * ALIGN, 3 * ALIGN),        # small rows, short merges, many rounds
    (1000, 1 * ALIGN, 1 * ALIGN),      # rows over two sectors, one page per request and per round
])
def test_read_rows_in_sectors(backend: str, row_bytes: int, merge_bytes: int, bounce_bytes: int,
                              data: tuple[Path, np.ndarray]) -> None:
    """unit_bytes=SECTOR: the same rows, in units of the file's own direct-I/O alignment or 512 bytes."""
    path, content = data
    rng = np.random.default_rng(row_bytes)
    anywhere = rng.integers(0, content.size - row_bytes + 1, 400)
    offsets = np.concatenate([anywhere, anywhere[:40] + 3, [content.size - row_bytes, 0, SECTOR - 1, ALIGN - 7]])
    offsets = rng.permutation(offsets).astype(np.int64)
    want = content[offsets[:, None] + np.arange(row_bytes)]
    with DirectReader(backend=backend, queue_depth=8, merge_bytes=merge_bytes, bounce_bytes=bounce_bytes,
                      unit_bytes=SECTOR) as r:
        assert r.unit_bytes == SECTOR
        h = r.open(path)
        unit = r.unit_of(h)         # 512 where the device allows it (statx), else 4096
        assert unit in (SECTOR, 2 * SECTOR, 4 * SECTOR, ALIGN)
        units, requests = _page_runs(offsets, row_bytes, merge_bytes // unit, unit)
        out = np.empty((offsets.size, row_bytes), dtype=np.uint8)
        r.read_rows(h, offsets, row_bytes, out)
        np.testing.assert_array_equal(out, want)
        c = r.counters()
        assert c["bytes_read"] == units * unit
        assert c["requests"] == requests
    with DirectReader(backend=backend) as r:       # the default unit reads whole pages
        assert r.unit_of(r.open(path)) == ALIGN


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_rows_in_sectors_at_an_unpadded_end_of_file(backend: str, disk_dir: Path) -> None:
    size = 3 * ALIGN + 700           # ends inside a sector
    content = np.random.default_rng(8).integers(0, 256, size, dtype=np.uint8)
    path = _write(disk_dir / f"sectors-{backend}.bin", content)
    with DirectReader(backend=backend, unit_bytes=SECTOR, gap_bytes=ALIGN) as r:
        h = r.open(path)
        unit = r.unit_of(h)
        offsets = np.array([size - 100, 10, ALIGN + 600], dtype=np.int64)
        out = np.empty((3, 100), np.uint8)
        r.read_rows(h, offsets, 100, out)
        np.testing.assert_array_equal(out, content[offsets[:, None] + np.arange(100)])
        if unit == SECTOR:      # sectors 0 and 9 merge across the 8-sector gap; the last, partial one (25) is apart
            assert r.counters()["bytes_read"] == 10 * SECTOR + (size - 25 * SECTOR)
            assert r.counters()["requests"] == 2
        with pytest.raises(ShortReadError, match=rf"offset {size}.*{path}"):
            r.read_rows(h, np.array([size - 50]), 100, out[:1])
    for bad in (256, 768, 2 * ALIGN, 0):
        with pytest.raises(ValueError, match="unit_bytes must be a power of two in \\[512, 4096\\]"):
            DirectReader(backend=backend, unit_bytes=bad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_rows_reads_through_short_gaps(backend: str, disk_dir: Path) -> None:
    size = 21 * ALIGN + 700            # a partial last page, touched too
    content = np.random.default_rng(9).integers(0, 256, size, dtype=np.uint8)
    path = _write(disk_dir / f"gaps-{backend}.bin", content)
    touched = np.array([0, 2, 3, 7, 8, 21])          # pages with a row; gaps of 1, 3 and 12 pages
    offsets = (touched * ALIGN + 100).astype(np.int64)[::-1].copy()
    want = content[offsets[:, None] + np.arange(188)]
    for gap, requests, pages in ((0, 4, 6), (2 * ALIGN, 3, 7), (3 * ALIGN, 2, 10), (12 * ALIGN, 1, 22)):
        with DirectReader(backend=backend, gap_bytes=gap) as r:
            assert r.gap_bytes == gap
            h = r.open(path)
            out = np.empty((offsets.size, 188), np.uint8)
            r.read_rows(h, offsets, 188, out)
            np.testing.assert_array_equal(out, want)
            c = r.counters()
            assert c["requests"] == requests, gap
            assert c["bytes_read"] == (pages - 1) * ALIGN + 700, gap     # the last page is 700 bytes
    for bad in (-ALIGN, 100):
        with pytest.raises(ValueError, match="gap_bytes must be a multiple of 4096"):
            DirectReader(backend=backend, gap_bytes=bad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_rows_at_an_unpadded_end_of_file(backend: str, disk_dir: Path) -> None:
    size = 5 * ALIGN + 1000  # the last page is partial, like a store shard's .npy
    content = np.random.default_rng(5).integers(0, 256, size, dtype=np.uint8)
    path = _write(disk_dir / f"unpadded-{backend}.bin", content)
    with DirectReader(backend=backend) as r:
        h = r.open(path)
        offsets = np.array([size - 188, 5 * ALIGN - 100, 17], dtype=np.int64)
        out = np.empty((3, 188), np.uint8)
        r.read_rows(h, offsets, 188, out)
        np.testing.assert_array_equal(out, content[offsets[:, None] + np.arange(188)])
        assert r.counters()["bytes_read"] == 2 * ALIGN + 1000  # pages 0, 4 and the partial page 5
        with pytest.raises(ShortReadError, match=rf"offset {size}.*{path}"):
            r.read_rows(h, np.array([size - 100]), 188, out[:1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_errors_name_the_file_and_offset(backend: str, data: tuple[Path, np.ndarray], disk_dir: Path) -> None:
    path, content = data
    size = content.size
    with DirectReader(backend=backend) as r:
        with pytest.raises(FileNotFoundError, match="no-such-file.bin"):
            r.open(disk_dir / "no-such-file.bin")
        with pytest.raises(IsADirectoryError, match=str(disk_dir)):
            r.open(disk_dir)
        h = r.open(path)
        buf = aligned_empty(4 * ALIGN)
        # Past the end: a short read, raised after the other requests in flight are drained.
        offsets = np.array([0, size - ALIGN, ALIGN, 2 * ALIGN])
        with pytest.raises(ShortReadError, match=rf"offset {size}.*{path}") as info:
            r.read(h, offsets, [ALIGN, 2 * ALIGN, ALIGN, ALIGN], buf, [0, ALIGN, 3 * ALIGN, 3 * ALIGN])
        assert isinstance(info.value, OSError)
        with pytest.raises(ShortReadError, match=rf"offset {size + ALIGN}"):
            r.read(h, [size + ALIGN], [ALIGN], buf, [0])
        # Misaligned offset, length, buffer address: ValueError naming file, offset and length.
        for off, length, dst in [(100, ALIGN, 0), (0, 100, 0), (0, ALIGN, 8)]:
            with pytest.raises(ValueError, match=rf"{path}.*offset {off}, length {length}"):
                r.read(h, [off], [length], buf, [dst])
        with pytest.raises(ValueError, match="does not fit the output buffer"):
            r.read(h, [0], [ALIGN], buf, [4 * ALIGN])
        with pytest.raises(ValueError, match="negative"):
            r.read(h, [-ALIGN], [ALIGN], buf, [0])
        with pytest.raises(ValueError, match="uint8"):
            r.read(h, [0], [ALIGN], np.zeros(ALIGN, dtype=np.float32), [0])
        with pytest.raises(ValueError, match="same length"):
            r.read(h, [0, 0], [ALIGN], buf, [0])
        readonly = aligned_empty(ALIGN)
        readonly.flags.writeable = False
        with pytest.raises((BufferError, ValueError)):
            r.read(h, [0], [ALIGN], readonly, [0])
        # Bad handles: never opened, and closed.
        with pytest.raises(ValueError, match="bad handle 99"):
            r.read(99, [0], [ALIGN], buf, [0])
        with pytest.raises(ValueError, match="bad handle -1"):
            r.read_rows(-1, [0], 8, np.empty((1, 8), np.uint8))
        h2 = r.open(path)
        r.close_file(h2)
        with pytest.raises(ValueError, match=f"bad handle {h2}"):
            r.read(h2, [0], [ALIGN], buf, [0])
        with pytest.raises(ValueError, match="out holds"):
            r.read_rows(h, [0, 8], 8, np.empty((3, 8), np.uint8))
        # After all that, the reader still reads correctly (the ring or pool was left clean).
        r.read(h, [2 * ALIGN], [2 * ALIGN], buf, [0])
        np.testing.assert_array_equal(buf[:2 * ALIGN], content[2 * ALIGN:4 * ALIGN])
    with pytest.raises(ValueError, match="closed"):
        r.open(path)
    with pytest.raises(ValueError, match="backend"):
        DirectReader(backend="aio")
    with pytest.raises(ValueError, match="queue_depth"):
        DirectReader(queue_depth=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernel_errors_are_drained_and_raised_as_oserror(backend: str) -> None:
    """A real errno from the kernel: /proc/self/mem reads this process's memory (offset = address)
    and fails with EIO at an unmapped address. The error names the file and the offset, the other
    requests of the call are drained first, and the reader keeps working."""
    src = np.arange(3 * ALIGN, dtype=np.uint32).view(np.uint8)
    unmapped = ALIGN  # page 1 is never mapped (vm.mmap_min_addr >= 4096)
    with DirectReader(backend=backend, queue_depth=4, threads=2) as r:
        with pytest.warns(RuntimeWarning, match="/proc/self/mem"):
            h = r.open("/proc/self/mem")
        out = np.zeros(src.size, np.uint8)
        addr = src.ctypes.data
        offsets = np.array([addr, addr + 100, unmapped, addr + 300, addr + 400] + [addr] * 20)
        with pytest.raises(OSError, match=rf"offset {unmapped}.*/proc/self/mem") as info:
            r.read(h, offsets, np.full(offsets.size, 100), out, np.arange(offsets.size) * 100)
        assert info.value.errno == errno.EIO and info.value.filename == "/proc/self/mem"
        r.read(h, [addr], [src.size], out, [0])
        np.testing.assert_array_equal(out, src)


def test_uring_refused_at_run_time_falls_back_to_pread() -> None:
    if uring_unavailable():
        pytest.skip(f"io_uring refused here: {uring_unavailable()}")
    # io_uring_setup refuses more than 32768 entries (EINVAL): a real run-time refusal.
    with pytest.warns(RuntimeWarning, match=r"io_uring_setup\(65536 entries\) failed"):
        r = DirectReader(queue_depth=1 << 16, backend="auto")
    assert r.backend == "pread"
    r.close()
    with pytest.raises(OSError, match="uring"):
        DirectReader(queue_depth=1 << 16, backend="uring")


def test_aligned_empty() -> None:
    for n in [0, 1, 4095, 4097, 3 * MiB + 5]:
        a = aligned_empty(n)
        assert a.dtype == np.uint8 and a.shape == (n,) and a.flags.writeable and a.flags.c_contiguous
        assert a.ctypes.data % ALIGN == 0
        a[:] = 255
        assert int(a.sum()) == 255 * n
    with pytest.raises(ValueError):
        aligned_empty(-1)


def _read_bytes() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("read_bytes:")).split()[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_direct_reads_bypass_the_page_cache(backend: str, data: tuple[Path, np.ndarray]) -> None:
    path, content = data
    nbytes = 6 * MiB
    with DirectReader(backend=backend) as r:
        h = r.open(path)
        out = aligned_empty(nbytes)
        before = _read_bytes()
        for _ in range(2):  # the same range twice: both reads reach the disk
            r.read(h, np.arange(0, nbytes, MiB), np.full(6, MiB), out, np.arange(0, nbytes, MiB))
        grown = _read_bytes() - before
        np.testing.assert_array_equal(out, content[:nbytes])
    assert 0.95 * 2 * nbytes <= grown <= 3 * nbytes, grown


@pytest.mark.parametrize("backend", BACKENDS)
def test_reads_survive_signals(backend: str, data: tuple[Path, np.ndarray]) -> None:
    """Signals aimed at the reading thread interrupt its waits (io_uring_enter, pread) with EINTR:
    the reader retries, and every byte still arrives."""
    path, content = data
    handled = 0

    def on_signal(signum: int, frame: object) -> None:
        nonlocal handled
        handled += 1

    stop = threading.Event()
    main = threading.get_ident()

    def pester() -> None:
        while not stop.is_set():
            signal.pthread_kill(main, signal.SIGUSR1)
            time.sleep(0.0002)

    previous = signal.signal(signal.SIGUSR1, on_signal)
    thread = threading.Thread(target=pester)
    try:
        with DirectReader(backend=backend, queue_depth=4, threads=4) as r:
            h = r.open(path)
            n = content.size // MiB  # 1 MiB requests over the file, 4 in flight, for about 0.2 s
            out = aligned_empty(n * MiB)
            thread.start()
            t0 = time.perf_counter()
            # reads for at least 0.2 s, and until the main thread has handled a few signals (the other thread
            # may be slow to start pestering on a busy machine)
            while time.perf_counter() - t0 < 0.2 or handled < 10:
                assert time.perf_counter() - t0 < WAIT_S, f"{handled} signals handled in {WAIT_S:.0f} s of reads"
                out[:] = 0
                r.read(h, np.arange(n) * MiB, np.full(n, MiB), out, np.arange(n) * MiB)
                np.testing.assert_array_equal(out, content[:n * MiB])
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_gil_is_released_during_reads(backend: str, data: tuple[Path, np.ndarray]) -> None:
    path, _ = data
    ticks: list[float] = []
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.0005)

    with DirectReader(backend=backend, queue_depth=2, threads=2) as r:
        h = r.open(path)
        out = aligned_empty(4 * MiB)
        thread = threading.Thread(target=spin)
        thread.start()
        try:
            time.sleep(0.01)
            repeats, deadline = 16, time.perf_counter() + WAIT_S
            # Direct reads of 4 MiB from disk, more until one call lasts >= 0.15 s, again until the other thread
            # ticked a few times well inside one call (10 ms from either end). With the GIL held it could not tick
            # at all during the call; released, it ticks about every 0.5-1 ms, or less often on a busy machine.
            while True:
                t0 = time.perf_counter()
                zeros = np.zeros(repeats, np.int64)
                r.read(h, zeros, np.full(repeats, 4 * MiB), out, zeros)
                t1 = time.perf_counter()
                inside = sum(t0 + 0.01 < x < t1 - 0.01 for x in ticks)
                if (t1 - t0 >= 0.15 or repeats >= 1024) and inside >= 3:
                    break
                assert t1 < deadline, f"the other thread ticked {inside} times inside a {t1 - t0:.3f} s read: " \
                                      "the read holds the GIL"
                if t1 - t0 < 0.15 and repeats < 1024:
                    repeats *= 2
        finally:
            stop.set()
            thread.join()
    assert t1 - t0 > 0.05


# Child processes that refuse one io_uring system call with EPERM through a seccomp filter (as
# Docker's default profile does for io_uring_setup): `refuse(nr)` installs it, exit status 77 when
# this kernel or sandbox allows no seccomp filter.
_SECCOMP_PRELUDE = """
import ctypes, errno, sys, warnings
NR_IO_URING_SETUP, NR_IO_URING_ENTER = 425, 426  # the same numbers on every architecture since Linux 5.1
class Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]
def refuse(nr):
    insns = (Insn * 4)(
        Insn(0x20, 0, 0, 0),                          # load seccomp_data.nr
        Insn(0x15, 0, 1, nr),                         # == nr ?
        Insn(0x06, 0, 0, 0x00050000 | errno.EPERM),   #   return SECCOMP_RET_ERRNO | EPERM
        Insn(0x06, 0, 0, 0x7FFF0000))                 # else SECCOMP_RET_ALLOW
    prog = Prog(4, ctypes.cast(insns, ctypes.POINTER(Insn)))
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) or libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER,
                                                                 ctypes.byref(prog), 0, 0):
        sys.exit(77)
path = sys.argv[1]
"""

_SETUP_REFUSED = """
refuse(NR_IO_URING_SETUP)
import numpy as np
from diskflow.native.reader import DirectReader, aligned_empty, uring_unavailable
assert uring_unavailable() == "io_uring_setup failed: Operation not permitted", uring_unavailable()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    r = DirectReader(backend="auto", threads=3)
assert r.backend == "pread", r.backend
assert [str(w.message) for w in caught] == [
    "io_uring unavailable (io_uring_setup failed: Operation not permitted); reading with 3 pread threads instead"
], [str(w.message) for w in caught]
h = r.open(path)
out = aligned_empty(3 * 4096)
r.read(h, [8192, 0], [4096, 8192], out, [0, 4096])
want = np.fromfile(path, dtype=np.uint8, count=3 * 4096)
assert (out[:4096] == want[8192:]).all() and (out[4096:] == want[:8192]).all()
r.close()
try:
    DirectReader(backend="uring")
except OSError as e:
    assert e.errno == errno.EPERM and "backend 'uring' unavailable: io_uring_setup failed" in str(e), e
else:
    raise AssertionError("backend='uring' was accepted although io_uring_setup is refused")
print("ok")
"""

_ENTER_REFUSED = """
import numpy as np
from diskflow.native.reader import DirectReader, aligned_empty
r = DirectReader(backend="uring", queue_depth=4)
h = r.open(path)
out = aligned_empty(3 * 4096)
want = np.fromfile(path, dtype=np.uint8, count=3 * 4096)
r.read(h, [0], [3 * 4096], out, [0])
assert (out == want).all()
refuse(NR_IO_URING_ENTER)
for attempt in range(2):  # the failed ring is replaced by a fresh one, which fails the same way
    try:
        r.read(h, [8192, 0, 4096], [4096] * 3, out, [0, 4096, 8192])
    except OSError as e:
        assert e.errno == errno.EPERM and e.filename == path and "reading at offset" in str(e), e
    else:
        raise AssertionError("a read succeeded although io_uring_enter is refused")
r.close()
print("ok")
"""


def _seccomp_child(body: str, path: Path) -> None:
    """Run `body` after the prelude in a fresh interpreter; skip where seccomp is unavailable."""
    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("the seccomp filter assumes io_uring's system call numbers 425/426")
    env = {k: v for k, v in os.environ.items() if k != "DISKFLOW_NO_URING"}    # the kernel's refusal alone
    proc = subprocess.run([sys.executable, "-c", _SECCOMP_PRELUDE + body, str(path)], check=False, cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=env)
    if proc.returncode == 77:
        pytest.skip("seccomp filters are not available here")
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout[-4000:] + proc.stderr[-4000:]


def test_uring_refused_by_the_kernel_falls_back_to_pread(data: tuple[Path, np.ndarray]) -> None:
    """io_uring refused for the whole process (seccomp, kernel.io_uring_disabled): the once-per-
    process probe says why, "auto" reads with pread and warns, "uring" raises OSError."""
    _seccomp_child(_SETUP_REFUSED, data[0])


def test_the_environment_refuses_uring_as_the_kernel_would(data: tuple[Path, np.ndarray],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """DISKFLOW_NO_URING=1: "auto" reads with pread and warns why, "uring" raises OSError (EPERM); "0" or
    empty leaves the kernel's answer."""
    path, want = data
    monkeypatch.delenv("DISKFLOW_NO_URING", raising=False)
    kernel = uring_unavailable()
    monkeypatch.setenv("DISKFLOW_NO_URING", "1")
    assert uring_unavailable() == "DISKFLOW_NO_URING=1 is set"
    with pytest.warns(RuntimeWarning, match=r"^io_uring unavailable \(DISKFLOW_NO_URING=1 is set\); reading with 3 "
                                            r"pread threads instead$"):
        r = DirectReader(backend="auto", threads=3)
    with r:
        assert r.backend == "pread"
        out = aligned_empty(2 * ALIGN)
        r.read(r.open(str(path)), [ALIGN, 0], [ALIGN, ALIGN], out, [0, ALIGN])
        assert (out[:ALIGN] == want[ALIGN:2 * ALIGN]).all() and (out[ALIGN:] == want[:ALIGN]).all()
    with pytest.raises(OSError, match=r"backend 'uring' unavailable: DISKFLOW_NO_URING=1 is set") as e:
        DirectReader(backend="uring")
    assert e.value.errno == errno.EPERM
    with DirectReader(backend="pread") as r:                 # asked for: no warning
        assert r.backend == "pread"
    for value in ("0", ""):
        monkeypatch.setenv("DISKFLOW_NO_URING", value)
        assert uring_unavailable() == kernel


@pytest.mark.skipif(bool(uring_unavailable()), reason=f"io_uring refused here: {uring_unavailable()}")
def test_a_failing_ring_raises_and_is_replaced(data: tuple[Path, np.ndarray]) -> None:
    """io_uring_enter itself failing (here: refused by seccomp after the ring was made) raises an
    OSError naming the file and offset instead of hanging, and the reader starts a fresh ring."""
    _seccomp_child(_ENTER_REFUSED, data[0])


def test_benchmark_runs_small(disk_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from diskflow.bench import reader as bench_reader

    parser = argparse.ArgumentParser()
    bench_reader.add_arguments(parser)
    before = set(disk_dir.iterdir())
    figures = bench_reader.run(parser.parse_args([
        "--dir", str(disk_dir), "--size", "8MiB", "--seq-block", "1MiB", "--seq-depths", "2,3", "--rand-depth", "4",
        "--seconds", "0.05", "--repeat", "2", "--row-bytes", "188"]))
    assert set(disk_dir.iterdir()) == before  # the test file is gone
    assert figures["file_bytes"] == 8 * MiB and "pread" in figures["backends"]
    for b in figures["backends"]:
        assert figures[f"seq_bw_{b}_qd3"] > 0 and len(figures[f"seq_bw_{b}_qd3_runs"]) == 2
        assert figures[f"rand4k_iops_{b}"] > 0
        assert figures[f"rows_per_s_{b}"] > 0 and 0 < figures[f"rows_amplification_{b}"] <= 2 * ALIGN / 188
    if figures["fio"]:
        assert figures["seq_bw_fio_qd2"] > 0 and figures["rand4k_iops_fio_psync"] > 0
    assert "random 4 KiB" in capsys.readouterr().out
