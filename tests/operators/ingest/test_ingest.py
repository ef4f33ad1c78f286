"""Ingest operators without Dask: discovery, reading, nodes, edge spills + CSC, feature shards."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp
from diskflow.operators.formats.npyio import create_aligned_npy
from diskflow.operators.formats.store import SPLIT_CODE
from diskflow.operators.ingest.edges import compact_group, csc_group, indices_dtype, scan_edges
from diskflow.operators.ingest.features import (
    check_same_schema,
    scan_features,
    units_overlapping,
    write_feature_shard,
)
from diskflow.operators.ingest.nodes import ingest_nodes, split_codes
from diskflow.operators.ingest.raw import (
    check_memory_budget,
    find_raw_files,
    group_buckets,
    iter_file_batches,
    iter_units_batches,
    shard_rows_for,
    table_num_rows,
    table_units,
    write_raw_dataset,
)

from diskflow.errors import ConfigError, InputError


def _raw(tmp: Path, n: int = 211, e: int = 977, dim: int = 3, seed: int = 0, **kw) -> Path:
    rng = np.random.default_rng(seed)
    x = np.repeat(np.arange(n, dtype=np.float32)[:, None], dim, axis=1)  # identity features
    return write_raw_dataset(tmp / "raw", src=rng.integers(0, n, e), dst=rng.integers(0, n, e), features=x,
                             labels=rng.integers(-1, 4, n), splits=rng.choice(["train", "val", "test", "none"], n), **kw)


def _fixed(x: np.ndarray) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])


# ----------------------------------------------------------------------------- discovery and reading

def test_find_raw_files_lists_parts_sorted_and_skips_hidden(tmp_path: Path) -> None:
    raw = _raw(tmp_path, edge_parts=3, feature_parts=2)
    (raw / "edges" / "_SUCCESS.parquet").write_bytes(b"")
    (raw / "edges" / "notes.txt").write_text("ignored")
    files = find_raw_files(raw)
    assert [p.name for p in files.edges] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert len(files.features) == 2 and len(files.nodes) == 1
    assert files.relative(files.edges[1]) == "edges/part-00001.parquet"


def test_find_raw_files_errors_name_the_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such directory") as e:
        find_raw_files(tmp_path / "nope")
    assert e.value.path.endswith("nope")
    raw = _raw(tmp_path)
    for f in (raw / "features").iterdir():
        f.unlink()
    with pytest.raises(InputError, match="empty dataset: no table files") as e:
        find_raw_files(raw)
    assert e.value.path.endswith("features")
    (raw / "features").rmdir()
    with pytest.raises(InputError, match="missing directory") as e:
        find_raw_files(raw)
    assert e.value.path.endswith("features")


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "stream"])
def test_units_and_batches_cover_every_row_once(tmp_path: Path, fmt: str) -> None:
    raw = _raw(tmp_path, n=101, feature_format=fmt, row_group_rows=17)
    path = find_raw_files(raw).features[0]
    units = table_units(path)
    assert sum(u.rows for u in units) == table_num_rows(path) == 101
    assert len(units) == (1 if fmt == "stream" else 6)
    ids = np.concatenate([b.column("node_id").to_numpy() for _, b in iter_file_batches(path, ["node_id"], 5)])
    np.testing.assert_array_equal(ids, np.arange(101))
    rows = [r for r, _ in iter_file_batches(path, ["node_id"], 5)]
    assert rows[:4] == [0, 5, 10, 15]


def test_corrupt_files_raise_input_errors_naming_them(tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(InputError, match="unreadable Parquet file") as e:
        table_num_rows(bad)
    assert e.value.path == str(bad)
    bad_ipc = tmp_path / "bad.arrow"
    bad_ipc.write_bytes(b"\x00" * 10)
    with pytest.raises(InputError, match="unreadable Arrow IPC file"):
        table_units(bad_ipc)


def test_an_ipc_file_rewritten_as_a_stream_after_listing_is_an_input_error(tmp_path: Path) -> None:
    """Units listed from an IPC file (random access by batch) meet a stream when the file changed meanwhile."""
    path = tmp_path / "features.arrow"
    table = pa.table({"node_id": np.arange(7, dtype=np.int64)})
    with pa.ipc.new_file(path, table.schema) as w:
        w.write_table(table, max_chunksize=3)
    units = table_units(path)
    assert [u.kind for u in units] == ["batch"] * 3
    with pa.ipc.new_stream(path, table.schema) as w:
        w.write_table(table)
    with pytest.raises(InputError, match="now holds an IPC stream") as e:
        list(iter_units_batches(units, ["node_id"], 4))
    assert e.value.path == str(path)


def test_budget_and_sizing_helpers() -> None:
    assert check_memory_budget("1GiB") == 1 << 30
    with pytest.raises(ConfigError, match="^memory_budget"):
        check_memory_budget("lots")
    with pytest.raises(ConfigError, match="at least"):
        check_memory_budget(100)
    assert shard_rows_for(1 << 20, 100, 10**9) == (1 << 19) // 108
    assert shard_rows_for(1 << 40, 512, 10**9) == (64 << 20) // 512  # capped at 64 MiB per shard
    assert shard_rows_for(1 << 30, 4, 7) == 7
    assert group_buckets(np.array([3, 3, 3, 10, 1, 1]), 6) == [(0, 2), (2, 3), (3, 4), (4, 6)]
    assert group_buckets(np.array([0, 0]), 1) == [(0, 2)]


# ----------------------------------------------------------------------------- nodes

def test_split_codes_plain_and_dictionary() -> None:
    plain = pa.array(["val", "train", "none", "test"])
    want = [SPLIT_CODE[s] for s in ["val", "train", "none", "test"]]
    assert split_codes(plain, Path("f"), 0).tolist() == want
    assert split_codes(plain.dictionary_encode(), Path("f"), 0).tolist() == want
    assert split_codes(pa.array(["train"], pa.large_string()), Path("f"), 0).tolist() == [0]
    unused_bad_entry = pa.DictionaryArray.from_arrays(pa.array([1, 1], pa.int32()), pa.array(["trian", "test"]))
    assert split_codes(unused_bad_entry, Path("f"), 0).tolist() == [2, 2]


@pytest.mark.parametrize("col, match", [
    (pa.array(["train", "trian"]), "bad split value 'trian' at row 11"),
    (pa.array(["train", "trian"]).dictionary_encode(), "bad split value 'trian' at row 11"),
    (pa.array(["train", None]), "null at row 11"),
    (pa.array([1, 2]), "expected string"),
])
def test_split_codes_errors(col: pa.Array, match: str) -> None:
    with pytest.raises(InputError, match=match):
        split_codes(col, Path("nodes/x.parquet"), 10)


def test_ingest_nodes_writes_labels_and_splits(tmp_path: Path) -> None:
    ids = np.array([4, 2, 0, 1, 3])
    pq.write_table(pa.table({"node_id": ids[:3], "label": [1, -1, 0], "split": ["train", "val", "none"]}),
                   tmp_path / "a.parquet")
    pq.write_table(pa.table({"node_id": ids[3:], "label": [6, 2], "split": ["test", "train"]}), tmp_path / "b.parquet")
    info = ingest_nodes([tmp_path / "a.parquet", tmp_path / "b.parquet"], 5, tmp_path, batch_rows=2)
    assert np.load(tmp_path / "labels.npy").tolist() == [0, 6, -1, 2, 1]
    assert np.load(tmp_path / "splits.npy").tolist() == [3, 2, 1, 0, 0]
    assert info == {"num_classes": 7, "split_counts": {"train": 2, "val": 1, "test": 1, "none": 1}}


@pytest.mark.parametrize("table, match", [
    ({"node_id": [0, 1, 1], "label": [0, 0, 0], "split": ["train"] * 3}, "duplicate node_id 1 at rows 1 and 2"),
    ({"node_id": [0, 1, 7], "label": [0, 0, 0], "split": ["train"] * 3}, "node_id 7 at row 2 is out of range"),
    ({"node_id": [0, -1, 2], "label": [0, 0, 0], "split": ["train"] * 3}, "node_id -1 at row 1 is out of range"),
    ({"node_id": [0, 1, 2], "label": [0, -3, 0], "split": ["train"] * 3}, "label -3 at row 1 is negative"),
    ({"node_id": [0, 1, 2], "label": [0, 0, 0], "split": ["train", "x", "val"]}, "bad split value 'x' at row 1"),
    ({"node_id": [0, 1, 2], "label": [0, 0, 0]}, "missing column 'split'"),
    ({"node_id": [0.0, 1.0, 2.0], "label": [0, 0, 0], "split": ["train"] * 3}, "'node_id' has type double"),
])
def test_ingest_nodes_errors_name_file_and_row(tmp_path: Path, table: dict, match: str) -> None:
    path = tmp_path / "nodes.parquet"
    pq.write_table(pa.table(table), path)
    with pytest.raises(InputError, match=match) as e:
        ingest_nodes([path], 3, tmp_path)
    assert e.value.path == str(path)
    assert not (tmp_path / "labels.npy").exists()


def test_ingest_nodes_duplicate_across_files(tmp_path: Path) -> None:
    pq.write_table(pa.table({"node_id": [0, 1], "label": [0, 0], "split": ["train"] * 2}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"node_id": [1], "label": [0], "split": ["train"]}), tmp_path / "b.parquet")
    with pytest.raises(InputError, match="duplicate node_id 1 at row 0 .an earlier row") as e:
        ingest_nodes([tmp_path / "a.parquet", tmp_path / "b.parquet"], 3, tmp_path)
    assert e.value.path.endswith("b.parquet")


# ----------------------------------------------------------------------------- edges

def _scipy_csc(src: np.ndarray, dst: np.ndarray, n: int, keep_repeats: bool) -> tuple[np.ndarray, np.ndarray]:
    """scipy's CSC of the edge list (row = src, column = dst), sources sorted within each column.

    scipy sums repeated entries; with `keep_repeats` each source is repeated by its count.
    """
    ref = sp.csc_matrix((np.ones(len(src)), (src, dst)), shape=(n, n))
    ref.sum_duplicates()
    ref.sort_indices()
    if not keep_repeats:
        return ref.indptr.astype(np.int64), ref.indices
    counts = np.asarray(ref.sum(axis=0)).ravel().astype(np.int64)
    return np.concatenate([[0], np.cumsum(counts)]), np.repeat(ref.indices, ref.data.astype(np.int64))


def _spill_and_build(tmp: Path, files: list[Path], n: int, *, width: int, chunk: int, packed: bool,
                     undirected: bool = False, cap: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Scan every file, group buckets by `cap`, run each CSC group (and compaction): the flow's steps by hand."""
    nb = -(-n // width)
    spills = [scan_edges(f, tmp / f"spill-{i}.bin", num_nodes=n, bucket_width=width, num_buckets=nb,
                         chunk_rows=chunk, to_undirected=undirected, packed=packed) for i, f in enumerate(files)]
    counts = np.sum([s.bucket_counts() for s in spills], axis=0)
    groups = group_buckets(counts, cap)
    assert len(groups) > 2, "the test needs several CSC groups"
    dt = indices_dtype(n)
    indptr = tmp / "indptr.npy"
    create_aligned_npy(indptr, np.int64, (n + 1,))
    target = tmp / ("scratch.npy" if undirected else "indices.npy")
    create_aligned_npy(target, dt, (int(counts.sum()),))
    bases = np.concatenate([[0], np.cumsum([counts[a:b].sum() for a, b in groups])])
    kept = []
    for g, (a, b) in enumerate(groups):
        runs = [(s.path, s.offsets[:, a], s.offsets[:, b]) for s in spills]
        kept.append(csc_group(runs, lo=a * width, hi=min(b * width, n), base=int(bases[g]), indptr_path=indptr,
                              indices_path=target, index_dtype=dt, packed=packed, dedupe=undirected))
    if undirected:
        create_aligned_npy(tmp / "indices.npy", dt, (sum(kept),))
        for g, (a, b) in enumerate(groups):
            compact_group(scratch_path=target, scratch_base=int(bases[g]), kept=kept[g],
                          indices_path=tmp / "indices.npy", final_base=sum(kept[:g]), indptr_path=indptr,
                          lo=a * width, hi=min(b * width, n), index_dtype=dt)
    else:
        assert sum(kept) == counts.sum()
    return np.load(indptr), np.load(tmp / "indices.npy")


@pytest.mark.parametrize("packed", [True, False], ids=["uint64-keys", "int64-pairs"])
@pytest.mark.parametrize("undirected", [False, True], ids=["directed", "undirected"])
def test_scan_and_csc_match_scipy(tmp_path: Path, packed: bool, undirected: bool) -> None:
    n, e = 97, 613
    rng = np.random.default_rng(3)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    src[:20], dst[:20] = src[20:40], dst[20:40]  # repeated edges
    files = []
    for i, (a, b) in enumerate([(0, 200), (200, 201), (201, e)]):
        files.append(tmp_path / f"e{i}.parquet")
        pq.write_table(pa.table({"src": src[a:b], "dst": dst[a:b]}), files[-1], row_group_size=90)
    indptr, indices = _spill_and_build(tmp_path, files, n, width=7, chunk=64, packed=packed, undirected=undirected)
    if undirected:  # to_undirected coalesces: scipy's CSC of the symmetric pattern
        ref_indptr, ref_indices = _scipy_csc(np.r_[src, dst], np.r_[dst, src], n, keep_repeats=False)
    else:
        ref_indptr, ref_indices = _scipy_csc(src, dst, n, keep_repeats=True)
    assert indices.dtype == np.int32
    np.testing.assert_array_equal(indptr, ref_indptr)
    np.testing.assert_array_equal(indices, ref_indices)


def test_scan_edges_rejects_bad_ids_naming_file_and_row(tmp_path: Path) -> None:
    path = tmp_path / "edges.parquet"
    pq.write_table(pa.table({"src": [0, 1, 2, 3], "dst": [1, 2, 9, 0]}), path)
    with pytest.raises(InputError, match="edge dst 9 at row 2 is out of range") as e:
        scan_edges(path, tmp_path / "s.bin", num_nodes=5, bucket_width=2, num_buckets=3, chunk_rows=3)
    assert e.value.path == str(path)
    pq.write_table(pa.table({"src": [0, -4], "dst": [1, 2]}), path)
    with pytest.raises(InputError, match="edge src -4 at row 1"):
        scan_edges(path, tmp_path / "s.bin", num_nodes=5, bucket_width=2, num_buckets=3, chunk_rows=3)
    pq.write_table(pa.table({"src": [0, None], "dst": [1, 2]}, schema=pa.schema([("src", pa.int64()),
                                                                                 ("dst", pa.int64())])), path)
    with pytest.raises(InputError, match="'src' is null at row 1"):
        scan_edges(path, tmp_path / "s.bin", num_nodes=5, bucket_width=2, num_buckets=3, chunk_rows=3)
    pq.write_table(pa.table({"src": [0], "target": [1]}), path)
    with pytest.raises(InputError, match="missing column 'dst'"):
        scan_edges(path, tmp_path / "s.bin", num_nodes=5, bucket_width=2, num_buckets=3, chunk_rows=3)


# ----------------------------------------------------------------------------- features

@pytest.mark.parametrize("fmt", ["parquet", "arrow", "stream"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_feature_shards_equal_input_rows_bit_exactly(tmp_path: Path, fmt: str, dtype: type) -> None:
    n, dim = 103, 5
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, dim)).astype(dtype)
    perm = rng.permutation(n)  # rows in shuffled order across files
    files = []
    for i, (a, b) in enumerate([(0, 40), (40, 41), (41, n)]):
        ids = perm[a:b]
        files.append(tmp_path / f"f{i}.{'parquet' if fmt == 'parquet' else 'arrow'}")
        table = pa.table({"node_id": ids, "x": _fixed(x[ids])})
        if fmt == "parquet":
            pq.write_table(table, files[-1], row_group_size=9)
        else:
            from pyarrow import ipc
            opener = ipc.new_file if fmt == "arrow" else ipc.new_stream
            with pa.OSFile(str(files[-1]), "wb") as sink, opener(sink, table.schema) as w:
                w.write_table(table, max_chunksize=9)
    scans = [scan_features(f, n) for f in files]
    dt, d = check_same_schema(scans)
    assert (dt, d) == (np.dtype(dtype), dim)
    assert scans[0].arrow_type == str(pa.list_(pa.from_numpy_dtype(np.dtype(dtype)), dim))
    out = []
    for lo, hi in [(0, 30), (30, 60), (60, 90), (90, n)]:
        entry = write_feature_shard(units_overlapping(scans, lo, hi), tmp_path / f"s{lo}.npy", lo=lo, hi=hi,
                                    dtype=dt, dim=d, features_dir=tmp_path, batch_rows=4)
        assert entry == {"row_start": lo, "rows": hi - lo, "offset": 4096, "nbytes": (hi - lo) * dim * dt.itemsize}
        out.append(np.load(tmp_path / f"s{lo}.npy"))
        raw_bytes = (tmp_path / f"s{lo}.npy").read_bytes()
        assert raw_bytes[4096:] == x[lo:hi].tobytes()
    np.testing.assert_array_equal(np.concatenate(out).view(np.uint8), x.view(np.uint8))


def test_units_overlapping_skips_row_groups_outside_the_range(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"node_id": np.arange(100), "x": _fixed(np.zeros((100, 2), np.float32))}), path,
                   row_group_size=10)
    scan = scan_features(path, 100)
    units = units_overlapping([scan], 25, 45)
    assert [u.index for u in units] == [2, 3, 4]


def _features_file(path: Path, ids: list[int], x: np.ndarray) -> Path:
    pq.write_table(pa.table({"node_id": np.asarray(ids, np.int64), "x": _fixed(x)}), path)
    return path


def _one_shard(tmp: Path, files: list[Path], n: int, **kw) -> dict:
    scans = [scan_features(f, n) for f in files]
    dt, dim = check_same_schema(scans)
    return write_feature_shard(units_overlapping(scans, 0, n), tmp / "shard.npy", lo=0, hi=n, dtype=dt, dim=dim,
                               features_dir=tmp, **kw)


def test_feature_shard_errors(tmp_path: Path) -> None:
    z = np.zeros((3, 2), np.float32)
    a = _features_file(tmp_path / "a.parquet", [0, 1, 2], z)
    b = _features_file(tmp_path / "b.parquet", [3, 1, 4], z)
    with pytest.raises(InputError, match=r"duplicate feature row for node 1 at row 1 \(a row of .*a.parquet") as e:
        _one_shard(tmp_path, [a, b], 5)
    assert e.value.path == str(b)
    a2 = _features_file(tmp_path / "a2.parquet", [1, 2, 3], z)  # consecutive ids: the slice path
    with pytest.raises(InputError, match=r"duplicate feature row for node 1 at row 0 \(a row of .*a.parquet") as e:
        _one_shard(tmp_path, [a, a2], 5)
    c = _features_file(tmp_path / "c.parquet", [3, 4, 3], z)
    with pytest.raises(InputError, match="duplicate feature row for node 3 at rows 0 and 2"):
        _one_shard(tmp_path, [a, c], 5)
    with pytest.raises(InputError, match="no feature row for node 3 .2 of nodes 0..4 missing") as e:
        _one_shard(tmp_path, [a], 5)
    assert e.value.path == str(tmp_path)
    nan = z.copy()
    nan[2, 1] = np.nan
    d = _features_file(tmp_path / "d.parquet", [3, 4, 5], nan)
    with pytest.raises(InputError, match="non-finite feature value .NaN or inf. for node 5 at row 2"):
        _one_shard(tmp_path, [a, d], 6)
    inf = z.copy()
    inf[0, 0] = -np.inf
    f = _features_file(tmp_path / "f.parquet", [3, 4, 5], inf)
    with pytest.raises(InputError, match="for node 3 at row 0"):
        _one_shard(tmp_path, [a, f], 6)
    _one_shard(tmp_path, [a, d], 6, allow_nonfinite=True)
    assert np.isnan(np.load(tmp_path / "shard.npy")[5, 1])
    assert not list(tmp_path.glob(".shard.npy.tmp-*"))


@pytest.mark.parametrize("x, match", [
    (pa.array([[0.0, 1.0]], pa.list_(pa.float64(), 2)), "item type double, expected float32 or float16"),
    (pa.array([[0.0, 1.0]], pa.list_(pa.float32())), "expected fixed_size_list"),
    (pa.array([1.0], pa.float32()), "expected fixed_size_list"),
])
def test_scan_features_rejects_wrong_types(tmp_path: Path, x: pa.Array, match: str) -> None:
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"node_id": [0], "x": x}), path)
    with pytest.raises(InputError, match=match) as e:
        scan_features(path, 1)
    assert e.value.path == str(path)


def test_scan_features_rejects_ids_out_of_range_and_schema_mismatch(tmp_path: Path) -> None:
    a = _features_file(tmp_path / "a.parquet", [0, 1, 5], np.zeros((3, 2), np.float32))
    with pytest.raises(InputError, match="node_id 5 at row 2 is out of range"):
        scan_features(a, 5)
    b = _features_file(tmp_path / "b.parquet", [0], np.zeros((1, 3), np.float32))
    c = _features_file(tmp_path / "c.parquet", [1], np.zeros((1, 2), np.float16))
    scans = [scan_features(p, 6) for p in (a, b, c)]
    with pytest.raises(InputError, match=r"schema mismatch .* fixed_size_list<item: float>\[3\] here") as e:
        check_same_schema(scans)
    assert e.value.path == str(b)
    with pytest.raises(InputError, match="halffloat") as e:
        check_same_schema([scans[0], scans[2]])
    assert e.value.path == str(c)
    pq.write_table(pa.table({"id": [0], "x": _fixed(np.zeros((1, 2), np.float32))}), tmp_path / "d.parquet")
    with pytest.raises(InputError, match="missing column 'node_id'"):
        scan_features(tmp_path / "d.parquet", 6)


def test_populate_topology_faults_in_the_mapped_topology(tiny_store) -> None:
    import platform

    from diskflow.operators.formats.store import Store

    store = Store(tiny_store)
    before = (np.array(store.indptr), np.array(store.indices))
    kernel = tuple(int(x) for x in platform.release().split("-")[0].split(".")[:2])
    done = store.populate_topology()
    assert done is (kernel >= (5, 14))                # tiny: always under half the free memory
    assert np.array_equal(store.indptr, before[0]) and np.array_equal(store.indices, before[1])
