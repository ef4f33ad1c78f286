"""`npyio`: `read_into` copies a memory-mapped array by reading its file, without mapping its pages in; `.npy`
and `.npz` reads are safe from many threads."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from diskflow.operators.formats.npyio import read_into, save_aligned_npy

from diskflow.errors import InputError


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

    from diskflow.operators.formats.npyio import NpzReader, load_npy

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



def _cached_bytes(path: Path) -> int:
    """Bytes of `path` in the page cache (mincore over a fresh map of it, which faults nothing in)."""
    import ctypes
    import mmap

    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
        view = np.frombuffer(m, np.uint8)
        rc = libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size), vec)
        del view
    if rc != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(b & 1 for b in vec) * mmap.PAGESIZE


def test_read_into_leaves_no_copy_in_the_page_cache(tmp_path: Path) -> None:
    """The loader reads its initial tiers once into RAM; their file pages are dropped as they are read, so a
    memory cgroup, which counts the page cache, is not charged for the file a second time."""
    import os

    rows = np.random.default_rng(0).standard_normal((4096, 256)).astype(np.float32)     # 4 MiB
    path = tmp_path / "tier.npy"
    save_aligned_npy(path, rows)
    with open(path, "rb") as f:                  # read once the ordinary way: the file is cached ...
        f.read()
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        if _cached_bytes(path) > 0:                # ... unless this file system keeps what it is told to drop
            pytest.skip("this file system keeps pages posix_fadvise(DONTNEED) drops (tmpfs)")
        f.seek(0)
        f.read()
    assert _cached_bytes(path) > 3 << 20
    out = np.empty_like(rows)
    read_into(np.load(path, mmap_mode="r"), out, chunk=1 << 20)
    assert np.array_equal(out, rows) and _cached_bytes(path) <= 4096     # the header, which np.load read
