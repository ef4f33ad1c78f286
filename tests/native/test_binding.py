"""The boundary between the native engine and Python: one binding file, wrappers for every kernel,
constants defined once in C++.

* Engine files (`native/*.cpp`, `native/*.h` but `bindings.cpp`) know nothing of Python; only
  `bindings.cpp` includes pybind11.
* No module outside `native/` imports `_native`: operators, flow, pipelines and bench go through
  the wrappers (`diskflow.native.kernels`, `diskflow.native.reader`, `diskflow.native.constants`).
* The constants Python uses (alignment, the reader's defaults) are the engine's, and the reader,
  the loader and the on-disk formats use exactly those.
* `copy_rows` through its wrapper: the copy, and its errors (the binding's checks, the engine's).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest
from diskflow.native import _native, constants, kernels
from diskflow.native.reader import DirectReader

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("diskflow", "flow", "operators", "pipelines", "bench")


def _imports_native_binding(tree: ast.AST) -> list[int]:
    """Lines of `tree` that import the compiled module `_native` (in any spelling)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if "_native" in module.split(".") or any(a.name == "_native" for a in node.names):
                lines.append(node.lineno)
        elif isinstance(node, ast.Import) and any("_native" in a.name.split(".") for a in node.names):
            lines.append(node.lineno)
    return lines


def test_binding_import_check_sees_every_spelling() -> None:
    for src in ("from ...native import _native", "from diskflow.native._native import copy_rows",
                "import diskflow.native._native", "from ..native import kernels, _native"):
        assert _imports_native_binding(ast.parse(src)) == [1], src
    assert _imports_native_binding(ast.parse("from ...native import kernels")) == []


def test_no_module_outside_native_imports_the_binding() -> None:
    offenders = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for line in _imports_native_binding(ast.parse(path.read_text(), str(path))):
                offenders.append(f"{path.relative_to(REPO)}:{line}")
    assert not offenders, f"import the wrappers in diskflow.native instead of _native: {offenders}"


def test_engine_files_know_nothing_of_python() -> None:
    sources = sorted(p for p in (REPO / "native").iterdir() if p.suffix in (".cpp", ".h"))
    assert {p.name for p in sources} >= {"bindings.cpp", "reader.cpp", "reader.h", "sampler.cpp", "sampler.h",
                                         "belady.cpp", "belady.h", "rows.cpp", "rows.h", "uring.cpp", "uring.h",
                                         "constants.h"}
    python = re.compile(r"pybind11|py::|Python\.h|PyObject")
    mixed = [p.name for p in sources if p.name != "bindings.cpp" and python.search(p.read_text())]
    assert not mixed, f"engine files must not use pybind11 or the Python C API: {mixed}"
    assert "PYBIND11_MODULE" in (REPO / "native" / "bindings.cpp").read_text()


def test_constants_are_the_engines() -> None:
    exported = {name: getattr(constants, name) for name in constants.__all__}
    assert exported == {name: int(getattr(_native, name)) for name in constants.__all__}
    assert constants.ALIGN == 4096
    assert constants.DEFAULT_MERGE_BYTES % constants.ALIGN == 0
    assert constants.ALIGN <= constants.DEFAULT_MERGE_BYTES <= constants.MAX_REQUEST_BYTES
    assert constants.DEFAULT_BOUNCE_BYTES >= constants.DEFAULT_MERGE_BYTES
    assert constants.BELADY_NO_USE == 2**31 - 1


def test_reader_loader_and_formats_use_the_engines_constants() -> None:
    from diskflow.native import reader
    from diskflow.operators.formats import directwrite, npyio
    from diskflow.operators.train import batchload, memory

    assert reader.ALIGN == npyio.ALIGN == directwrite.ALIGN == constants.ALIGN
    with DirectReader(backend="pread") as r:  # the Python defaults are the engine's
        assert (r.queue_depth, r.threads) == (constants.DEFAULT_QUEUE_DEPTH, constants.DEFAULT_THREADS)
        assert (r.merge_bytes, r.bounce_bytes) == (constants.DEFAULT_MERGE_BYTES, constants.DEFAULT_BOUNCE_BYTES)
    binding = _native.DirectReader()  # the binding's own defaults are the same constants
    assert (binding.queue_depth, binding.threads, binding.merge_bytes, binding.bounce_bytes) == (
        constants.DEFAULT_QUEUE_DEPTH, constants.DEFAULT_THREADS, constants.DEFAULT_MERGE_BYTES,
        constants.DEFAULT_BOUNCE_BYTES)
    binding.close()
    r = batchload.make_reader()
    try:
        assert (r.merge_bytes, r.bounce_bytes) == (constants.DEFAULT_MERGE_BYTES, constants.DEFAULT_BOUNCE_BYTES)
    finally:
        r.close()
    # The memory budget counts the loader's bounce buffer and the reader's, each of the default size.
    assert memory.io_buffer_bytes() == 2 * constants.DEFAULT_BOUNCE_BYTES
    assert memory.io_buffer_bytes(row_reads=False) == 0
    with DirectReader(backend="pread", merge_bytes=8 * constants.ALIGN, bounce_bytes=10 * constants.ALIGN + 1) as r:
        assert (r.merge_bytes, r.bounce_bytes) == (8 * constants.ALIGN, 11 * constants.ALIGN)  # rounded up


def test_copy_rows() -> None:
    src = np.arange(7 * 5, dtype=np.float32).reshape(7, 5)  # identity-like rows: row i starts at 5 i
    out = np.zeros((4, 5), dtype=np.float32)
    kernels.copy_rows(out, np.array([3, 0, 2], dtype=np.int64), src, np.array([6, 1, 1], dtype=np.int64))
    expect = np.zeros_like(out)
    expect[[3, 0, 2]] = src[[6, 1, 1]]
    assert np.array_equal(out, expect)
    kernels.copy_rows(out, np.zeros(0, np.int64), src, np.zeros(0, np.int64))  # nothing to copy
    assert np.array_equal(out, expect)


def test_copy_rows_errors() -> None:
    src = np.arange(12, dtype=np.int64).reshape(4, 3)
    out = np.zeros((2, 3), dtype=np.int64)
    pos = np.array([0, 1], dtype=np.int64)
    with pytest.raises(IndexError, match=r"row 1: out_pos 2 \(of 2\)"):
        kernels.copy_rows(out, np.array([0, 2], dtype=np.int64), src, pos)
    assert not out.any()  # checked before anything is copied
    with pytest.raises(IndexError, match=r"src_rows -1 \(of 4\)"):
        kernels.copy_rows(out, pos, src, np.array([0, -1], dtype=np.int64))
    with pytest.raises(ValueError, match="src: dtype int32 differs from out's int64"):
        kernels.copy_rows(out, pos, src.astype(np.int32), pos)
    with pytest.raises(ValueError, match="row size differs"):
        kernels.copy_rows(out, pos, src[:, :2].copy(), pos)
    with pytest.raises(ValueError, match="out_pos: expected dtype int64, got int32"):
        kernels.copy_rows(out, pos.astype(np.int32), src, pos)
    with pytest.raises(ValueError, match="differ in length"):
        kernels.copy_rows(out, pos, src, pos[:1])
    with pytest.raises(ValueError, match="out: expected a 2-D array, got 1 dimensions"):
        kernels.copy_rows(out.reshape(-1), pos, src, pos)
    with pytest.raises(ValueError, match="src: expected a C-contiguous array"):
        kernels.copy_rows(out, pos, src[::2], pos)
    readonly = out.copy()
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="out: the array is read-only"):
        kernels.copy_rows(readonly, pos, src, pos)


def test_gather_rows() -> None:
    src = np.arange(7 * 5, dtype=np.float32).reshape(7, 5)
    rows = np.array([6, 1, 1, 0], dtype=np.int64)
    out = np.full((5, 5), -1, dtype=np.float32)            # one row more than gathered: left as it was
    kernels.gather_rows(out, src, rows)
    assert np.array_equal(out[:4], src[rows]) and (out[4] == -1).all()
    with pytest.raises(IndexError, match=r"out: 2 rows, 4 to gather"):
        kernels.gather_rows(out[:2], src, rows)
    with pytest.raises(IndexError, match=r"row 1: src_rows 7 \(of 7\)"):
        kernels.gather_rows(out, src, np.array([0, 7], dtype=np.int64))
    with pytest.raises(ValueError, match="src: dtype float64 differs from out's float32"):
        kernels.gather_rows(out, src.astype(np.float64), rows)


def test_crc32_is_zlibs_for_every_length_alignment_and_start() -> None:
    """The native crc32 (folded with carry-less multiplication where the CPU has it, a table elsewhere and
    for the bytes short of a 16-byte block) gives zlib's value for lengths across every path's edges."""
    import zlib
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, size=1 << 20, dtype=np.uint8)
    for n in [*range(600), 1023, 1024, 1025, 4096 + 15, (1 << 20) - 7]:
        for off in (0, 1, 7):
            part = data[off:off + n]
            for value in (0, 0xDEADBEEF, 0xFFFFFFFF):
                assert kernels.crc32(part, value) == zlib.crc32(part.tobytes(), value), (n, off, value)


@pytest.mark.parametrize("dtype, dim, shift", [(np.float32, 128, 0), (np.float16, 3, 0), (np.float32, 8, 4)])
def test_gather_rows_crc_gathers_and_checksums_what_it_wrote(dtype: type, dim: int, shift: int) -> None:
    """Rows of 512 bytes (streamed past the cache), of 6 bytes (not 16-byte aligned: copied) and of 32 bytes
    into an `out` 4 bytes off alignment (copied) all land as `gather_rows` puts them, and the crc is zlib's
    of the bytes written, continuing the crc passed in; bad rows raise before anything is written."""
    import zlib
    rng = np.random.default_rng(4)
    src = rng.standard_normal((500, dim)).astype(dtype)
    rows = rng.integers(0, 500, size=333).astype(np.int64)
    raw = np.zeros(334 * dim * src.itemsize + 64, np.uint8)
    start = (-raw.ctypes.data) % 64 + shift
    out = raw[start:start + 334 * dim * src.itemsize].view(dtype).reshape(334, dim)
    out[333] = 7
    crc = kernels.gather_rows_crc(out, src, rows, 12345)
    assert np.array_equal(out[:333], src[rows]) and (out[333] == 7).all()
    assert crc == zlib.crc32(out[:333].tobytes(), 12345)
    assert kernels.gather_rows_crc(out, src, rows[:0], 99) == 99
    before = out.copy()
    with pytest.raises(IndexError, match=r"row 2: src_rows 500 \(of 500\)"):
        kernels.gather_rows_crc(out, src, np.array([0, 1, 500], np.int64))
    with pytest.raises(IndexError, match=r"out: 2 rows, 333 to gather"):
        kernels.gather_rows_crc(out[:2], src, rows)
    assert np.array_equal(out, before)


@pytest.mark.parametrize("num_nodes", [50, 10**9])      # a scan of a dense scratch array / a sort of the ids
def test_count_ids_and_merge(num_nodes: int) -> None:
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 50, 300), rng.integers(0, 50, 40)
    ids_a, counts_a = kernels.count_ids(a, num_nodes)
    ref_ids, ref_counts = np.unique(a, return_counts=True)
    assert np.array_equal(ids_a, ref_ids) and np.array_equal(counts_a, ref_counts)
    ids_b, counts_b = kernels.count_ids(b, num_nodes)
    ids, counts = kernels.merge_counts(ids_a, counts_a, ids_b, counts_b)
    ref_ids, ref_counts = np.unique(np.concatenate([a, b]), return_counts=True)
    assert np.array_equal(ids, ref_ids) and np.array_equal(counts, ref_counts)
    # calls are independent: again, and over a smaller id space
    assert np.array_equal(kernels.count_ids(b, num_nodes)[1], counts_b)
    small = b[b < 10]
    assert np.array_equal(kernels.count_ids(small, 10)[1], np.unique(small, return_counts=True)[1])
    with pytest.raises(ValueError, match=r"node id 50 at position 1 is outside \[0, 50\)"):
        kernels.count_ids(np.array([3, 50], dtype=np.int64), 50)
    with pytest.raises(ValueError, match="node id -2"):
        kernels.count_ids(np.array([-2], dtype=np.int64), num_nodes)
    with pytest.raises(ValueError, match=r"a: ids must be strictly ascending \(at position 1\)"):
        kernels.merge_counts(np.array([4, 4]), np.ones(2, np.int64), ids_b, counts_b)
    with pytest.raises(ValueError, match="differ in length"):
        kernels.merge_counts(ids_a, counts_a[:-1], ids_b, counts_b)


def test_count_dense_checks_every_array_before_counting_any() -> None:
    """Counts in list order whatever the dtypes; a bad array anywhere (its id, dtype, layout, or memory shared
    with `out`) is named and leaves `out` as it was; a count past int32 is an OverflowError."""
    good32, good64 = np.array([0, 2, 2], np.int32), np.array([3, 0], np.int64)
    out = np.zeros(4, np.int32)
    kernels.count_dense([good64, good32], out)
    assert out.tolist() == [2, 0, 2, 1]
    faults = {r"arrays\[1\]: node id 9 at position 1 is outside \[0, 4\)": [good32, np.array([1, 9])],
              r"arrays\[2\]: node id -1 at position 0": [good32, good64, np.array([-1], np.int32)],
              r"arrays\[1\]: expected dtype int32 or int64, got float64": [good32, np.array([1.0])],
              r"arrays\[0\]: expected a C-contiguous": [np.arange(6, dtype=np.int64)[::2]],
              r"arrays\[1\]: shares memory with out": [good32, out.view(np.int32)[:2]]}
    for message, arrays in faults.items():
        with pytest.raises(ValueError, match=message):
            kernels.count_dense(arrays, out)
        assert out.tolist() == [2, 0, 2, 1], message      # nothing counted
    buf = np.zeros(3, np.int32)
    with pytest.raises(ValueError, match="shares memory with out"):     # ids inside out could count past its end
        kernels.count_dense([buf[:2]], buf[:2])
    assert buf.tolist() == [0, 0, 0]
    full = np.array([2**31 - 1, 0], np.int32)
    with pytest.raises(OverflowError, match="would pass 2147483647"):
        kernels.count_dense([np.array([1, 0], np.int32)], full)


def test_belady_workspace_keeps_no_storage_per_call() -> None:
    """The simulation's scratch is reused from call to call: plans of hundreds of batches that never hold a
    row (no CPU tier, or every row on the GPU) leave nothing behind, call after call. The idle workspace's
    bytes (its arrays' capacities, the list of bucket vectors included) are the same after one call of each
    as after forty (an empty bucket vector kept per batch per call added 12 kB a call here)."""
    b = 500
    nodes, offsets, none = np.arange(b, dtype=np.int64), np.arange(b + 1, dtype=np.int64), np.zeros(0, np.int64)

    def workspace_after(calls: int) -> int:
        kernels.belady_release_workspace()
        for _ in range(calls):
            kernels.belady_plan(nodes, offsets, b, 0, none, none, None)
            kernels.belady_plan(nodes, offsets, b, 10, np.full(10, -1, np.int64), nodes, None)
        return kernels.belady_release_workspace()

    once = workspace_after(1)
    assert 0 < once < 24 * b            # the per-node arrays; no vector per batch bucket
    assert workspace_after(40) == once
