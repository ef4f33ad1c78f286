"""`run_ingest` end to end: the store it writes, its Dask tasks, bad inputs, idempotence, atomicity, CLI."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import dask
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp
from dask.callbacks import Callback
from diskflow.flow.ingest import IngestResult, run_ingest
from diskflow.operators.formats.store import SPLITS, Store
from diskflow.operators.ingest.raw import write_raw_dataset
from task_keys import TaskKeys

from diskflow.errors import ConfigError, InputError

N, E, DIM = 1013, 5003, 7


@pytest.fixture(autouse=True)
def _sync_scheduler():
    with dask.config.set(scheduler="sync"):
        yield


def _graph(seed: int = 0, n: int = N, e: int = E) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n, e)
    dst = (rng.pareto(1.5, e) * 20).astype(np.int64) % n  # skewed in-degrees
    x = (np.arange(n)[:, None] * DIM + np.arange(DIM)).astype(np.float32)  # identity-like: row v holds v*dim+j
    return {"src": src, "dst": dst, "features": x, "labels": rng.integers(-1, 6, n),
            "splits": rng.choice(list(SPLITS), n)}


def _raw(tmp: Path, g: dict[str, np.ndarray] | None = None, name: str = "raw", **kw) -> Path:
    kw = {"edge_parts": 3, "feature_parts": 4, "node_parts": 2, "row_group_rows": 97, **kw}
    return write_raw_dataset(tmp / name, **(g or _graph()), **kw)


def _csc_reference(src: np.ndarray, dst: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """scipy's CSC of the edge list with repeated edges kept (each source repeated by its count)."""
    ref = sp.csc_matrix((np.ones(len(src)), (src, dst)), shape=(n, n))
    ref.sum_duplicates()
    ref.sort_indices()
    counts = np.asarray(ref.sum(axis=0)).ravel().astype(np.int64)
    return np.concatenate([[0], np.cumsum(counts)]), np.repeat(ref.indices, ref.data.astype(np.int64))


def _mtimes(path: Path) -> dict[str, int]:
    return {str(p.relative_to(path)): p.stat().st_mtime_ns for p in sorted(path.rglob("*"))}


# ----------------------------------------------------------------------------- the store

def test_store_matches_scipy_and_input_with_several_buckets(tmp_path: Path) -> None:
    g = _graph()
    raw = _raw(tmp_path, g)
    with TaskKeys() as seen:
        r = run_ingest(raw, tmp_path / "store", memory_budget="16KiB", shard_rows=300)
    assert isinstance(r, IngestResult) and not r.skipped
    assert (r.num_nodes, r.num_edges) == (N, E)
    assert r.input_bytes == sum(p.stat().st_size for p in raw.rglob("*") if p.is_file())
    csc_tasks = [k for k in seen.keys if k.startswith("ingest-csc-")]
    assert len(csc_tasks) >= 4, "a 16 KiB budget must split the CSC into several bucket tasks"
    assert all(k.startswith("ingest-") for k in seen.keys)
    assert sum(k.startswith("ingest-scan-edges-") for k in seen.keys) == 3
    assert sum(k.startswith("ingest-feature-shard-") for k in seen.keys) == 4
    assert sum(k.startswith("ingest-scan-feature-") for k in seen.keys) == 4
    assert any(k.startswith("ingest-manifest") for k in seen.keys)

    s = Store(tmp_path / "store")
    indptr, indices = _csc_reference(g["src"], g["dst"], N)
    assert s.indices.dtype == np.int32 and s.indptr.dtype == np.int64
    np.testing.assert_array_equal(s.indptr, indptr)
    np.testing.assert_array_equal(s.indices, indices)
    assert [(sh.row_start, sh.rows) for sh in s.shards] == [(0, 300), (300, 300), (600, 300), (900, 113)]
    np.testing.assert_array_equal(s.read_features(), g["features"])
    for sh in s.shards:  # row-major data at byte 4096
        assert sh.path.read_bytes()[4096:] == g["features"][sh.row_start:sh.row_stop].tobytes()
    np.testing.assert_array_equal(s.labels, g["labels"])
    np.testing.assert_array_equal(s.splits, [SPLITS.index(v) for v in g["splits"]])
    m = s.manifest
    assert m["num_classes"] == 6
    assert m["split_counts"] == {k: int((g["splits"] == k).sum()) for k in SPLITS}
    assert m["features"]["arrow_type"] == "fixed_size_list<item: float>[7]"
    assert m["features"]["row_bytes"] == 28
    assert set(m["inputs"]) == {p.relative_to(raw).as_posix() for p in raw.rglob("*.parquet")}
    assert m["config"] == {"to_undirected": False, "allow_nonfinite": False, "shard_rows": 300,
                           "memory_budget": None, "link_split": None, "disjoint_train_ratio": 0.0,
                           "link_negatives": 100, "link_seed": 0}
    assert "edge_features" not in m and "link" not in m
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == [
        "features", "indices.npy", "indptr.npy", "labels.npy", "manifest.json", "splits.npy"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw", "store"]  # no staging left behind


def test_float16_arrow_input_and_budget_sized_shards(tmp_path: Path) -> None:
    g = _graph(1)
    g["features"] = np.random.default_rng(2).standard_normal((N, DIM)).astype(np.float16)
    raw = _raw(tmp_path, g, feature_format="arrow")
    run_ingest(raw, tmp_path / "store", memory_budget="32KiB")
    s = Store(tmp_path / "store")
    assert s.feature_dtype == np.float16
    assert s.manifest["features"]["arrow_type"] == "fixed_size_list<item: halffloat>[7]"
    assert s.shard_rows == (32 << 10) // 2 // (DIM * 2 + 8)
    assert len(s.shards) == -(-N // s.shard_rows) > 1
    assert s.read_features().tobytes() == g["features"].tobytes()
    assert s.manifest["config"]["memory_budget"] == 32 << 10


def test_ipc_stream_features(tmp_path: Path) -> None:
    g = _graph(2)
    raw = _raw(tmp_path, g, feature_format="stream")
    run_ingest(raw, tmp_path / "store", shard_rows=500)
    np.testing.assert_array_equal(Store(tmp_path / "store").read_features(), g["features"])


def test_to_undirected_is_coalesced_symmetric_csc(tmp_path: Path) -> None:
    g = _graph(3)
    raw = _raw(tmp_path, g)
    r = run_ingest(raw, tmp_path / "store", memory_budget="16KiB", to_undirected=True)
    ref = sp.csc_matrix((np.ones(2 * E), (np.r_[g["src"], g["dst"]], np.r_[g["dst"], g["src"]])), shape=(N, N))
    ref.sum_duplicates()
    ref.sort_indices()
    s = Store(tmp_path / "store")
    assert r.num_edges == s.num_edges == ref.nnz < 2 * E
    np.testing.assert_array_equal(s.indptr, ref.indptr)
    np.testing.assert_array_equal(s.indices, ref.indices)
    assert not (tmp_path / "store" / "_spill").exists()


def test_tiny_store_fixture_matches_its_raw_dataset(tiny_raw: Path, tiny_store: Path) -> None:
    def read(part: str) -> pa.Table:
        files = sorted((tiny_raw / part).glob("*"))
        tables = []
        for f in files:
            if f.suffix == ".parquet":
                tables.append(pq.read_table(f))
            else:
                from pyarrow import ipc
                with pa.memory_map(str(f)) as src:
                    try:
                        tables.append(ipc.open_file(src).read_all())
                    except pa.ArrowInvalid:
                        src.seek(0)
                        tables.append(ipc.open_stream(src).read_all())
        return pa.concat_tables(tables)

    s = Store(tiny_store)
    edges, feats = read("edges"), read("features")
    assert s.num_nodes == 4111 and s.feature_dim == 47 and len(s.shards) == 5
    indptr, indices = _csc_reference(edges["src"].to_numpy(), edges["dst"].to_numpy(), s.num_nodes)
    np.testing.assert_array_equal(s.indptr, indptr)
    np.testing.assert_array_equal(s.indices, indices)
    x = np.empty((s.num_nodes, 47), s.feature_dtype)
    x[feats["node_id"].to_numpy()] = feats["x"].combine_chunks().flatten().to_numpy().reshape(-1, 47)
    assert s.read_features().tobytes() == x.tobytes()


# ----------------------------------------------------------------------------- bad input

def _rewrite(path: Path, **columns) -> None:
    table = pq.read_table(path)
    for name, value in columns.items():
        if value is None:
            table = table.drop_columns([name])
        else:
            table = table.set_column(table.schema.get_field_index(name), name, value)
    pq.write_table(table, path)


def _fixed(x: np.ndarray) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])


def _feature_part(raw: Path, i: int, ids: np.ndarray, x: np.ndarray) -> None:
    pq.write_table(pa.table({"node_id": ids, "x": _fixed(x)}), raw / "features" / f"part-{i:05d}.parquet")


def _bad_src(raw: Path) -> None:
    t = pq.read_table(raw / "edges/part-00001.parquet")
    _rewrite(raw / "edges/part-00001.parquet", src=pa.array(np.r_[t["src"].to_numpy()[:5], -3, t["src"].to_numpy()[6:]]))


def _bad_dst(raw: Path) -> None:
    t = pq.read_table(raw / "edges/part-00002.parquet")
    _rewrite(raw / "edges/part-00002.parquet", dst=pa.array(np.r_[t["dst"].to_numpy()[:-1], N]))


def _feature_id_out_of_range(raw: Path) -> None:
    _feature_part(raw, 3, np.r_[np.arange(759, N - 1), N + 5], np.zeros((N - 759, DIM), np.float32))


def _node_id_out_of_range(raw: Path) -> None:
    t = pq.read_table(raw / "nodes/part-00001.parquet")
    ids = t["node_id"].to_numpy().copy()
    ids[3] = -1
    _rewrite(raw / "nodes/part-00001.parquet", node_id=pa.array(ids))


def _duplicate_feature_row(raw: Path) -> None:
    _feature_part(raw, 3, np.r_[np.arange(759, N), 10], np.zeros((N - 758, DIM), np.float32))


def _missing_feature_row(raw: Path) -> None:
    _feature_part(raw, 3, np.arange(759, N - 1), np.zeros((N - 760, DIM), np.float32))


def _wrong_dim(raw: Path) -> None:
    _feature_part(raw, 2, np.arange(506, 759), np.zeros((253, DIM + 1), np.float32))


def _wrong_dtype_between_shards(raw: Path) -> None:
    _feature_part(raw, 2, np.arange(506, 759), np.zeros((253, DIM), np.float16))


def _float64_features(raw: Path) -> None:
    _feature_part(raw, 0, np.arange(0, 253), np.zeros((253, DIM), np.float64))


def _nan_feature(raw: Path) -> None:
    x = np.zeros((253, DIM), np.float32)
    x[40, 2] = np.nan
    _feature_part(raw, 2, np.arange(506, 759), x)


def _inf_feature(raw: Path) -> None:
    x = np.zeros((253, DIM), np.float32)
    x[0, 0] = np.inf
    _feature_part(raw, 1, np.arange(253, 506), x)


def _missing_x_column(raw: Path) -> None:
    pq.write_table(pa.table({"node_id": np.arange(253, 506)}), raw / "features/part-00001.parquet")


def _missing_dst_column(raw: Path) -> None:
    _rewrite(raw / "edges/part-00000.parquet", dst=None)


def _no_edge_files(raw: Path) -> None:
    for f in (raw / "edges").iterdir():
        f.unlink()


def _zero_edge_rows(raw: Path) -> None:
    for f in (raw / "edges").iterdir():
        pq.write_table(pq.read_table(f).slice(0, 0), f)


def _zero_node_rows(raw: Path) -> None:
    for f in (raw / "nodes").iterdir():
        pq.write_table(pq.read_table(f).slice(0, 0), f)


def _corrupt_parquet(raw: Path) -> None:
    (raw / "edges/part-00001.parquet").write_bytes(b"PAR1" + os.urandom(200))


def _corrupt_feature_file(raw: Path) -> None:
    p = raw / "features/part-00002.parquet"
    p.write_bytes(p.read_bytes()[:-100])


def _bad_split(raw: Path) -> None:
    t = pq.read_table(raw / "nodes/part-00000.parquet")
    splits = t["split"].combine_chunks().dictionary_decode().to_pylist()
    splits[7] = "validation"
    _rewrite(raw / "nodes/part-00000.parquet", split=pa.array(splits))


def _duplicate_node(raw: Path) -> None:
    t = pq.read_table(raw / "nodes/part-00001.parquet")
    ids = t["node_id"].to_numpy().copy()
    ids[0] = 0
    _rewrite(raw / "nodes/part-00001.parquet", node_id=pa.array(ids))


def _no_features_dir(raw: Path) -> None:
    for f in (raw / "features").iterdir():
        f.unlink()
    (raw / "features").rmdir()


BAD_CASES = {
    "edge-src-negative": (_bad_src, "edges/part-00001.parquet", "edge src -3 at row 5 is out of range"),
    "edge-dst-too-big": (_bad_dst, "edges/part-00002.parquet", f"edge dst {N} at row 1667 is out of range"),
    "feature-id-out-of-range": (_feature_id_out_of_range, "features/part-00003.parquet",
                                f"node_id {N + 5} at row {N - 760} is out of range"),
    "node-id-negative": (_node_id_out_of_range, "nodes/part-00001.parquet", "node_id -1 at row 3 is out of range"),
    "duplicate-feature-row": (_duplicate_feature_row, "features/part-00003.parquet",
                              "duplicate feature row for node 10 at row 254 .a row of .*part-00000.parquet"),
    "missing-feature-row": (_missing_feature_row, "features", f"no feature row for node {N - 1}"),
    "wrong-dim": (_wrong_dim, "features/part-00002.parquet", r"schema mismatch .*\[8\] here but .*\[7\]"),
    "float16-vs-float32": (_wrong_dtype_between_shards, "features/part-00002.parquet", "schema mismatch .*halffloat"),
    "float64": (_float64_features, "features/part-00000.parquet", "item type double"),
    "nan": (_nan_feature, "features/part-00002.parquet", "non-finite .* node 546 at row 40"),
    "inf": (_inf_feature, "features/part-00001.parquet", "non-finite .* node 253 at row 0"),
    "missing-x": (_missing_x_column, "features/part-00001.parquet", "missing column 'x'"),
    "missing-dst": (_missing_dst_column, "edges/part-00000.parquet", "missing column 'dst'"),
    "no-edge-files": (_no_edge_files, "edges", "empty dataset: no table files"),
    "zero-edge-rows": (_zero_edge_rows, "edges", "empty dataset: the edges files hold zero rows"),
    "zero-node-rows": (_zero_node_rows, "nodes", "empty dataset: the nodes files hold zero rows"),
    "corrupt-parquet": (_corrupt_parquet, "edges/part-00001.parquet", "unreadable Parquet file"),
    "truncated-features": (_corrupt_feature_file, "features/part-00002.parquet", "unreadable Parquet file"),
    "bad-split": (_bad_split, "nodes/part-00000.parquet", "bad split value 'validation' at row 7"),
    "duplicate-node": (_duplicate_node, "nodes/part-00001.parquet", "duplicate node_id 0 at row 0"),
    "no-features-dir": (_no_features_dir, "features", "missing directory"),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_input_names_the_file_and_leaves_no_output(tmp_path: Path, case: str) -> None:
    mutate, where, match = BAD_CASES[case]
    raw = _raw(tmp_path)
    mutate(raw)
    with pytest.raises(InputError, match=match) as e:
        run_ingest(raw, tmp_path / "store", memory_budget="64KiB", shard_rows=400)
    assert e.value.path == str(raw / where)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"], "no output and no staging dir may remain"


def test_missing_raw_directory_and_bad_options(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such directory"):
        run_ingest(tmp_path / "nope", tmp_path / "store")
    raw = _raw(tmp_path)
    with pytest.raises(ConfigError, match="^shard_rows"):
        run_ingest(raw, tmp_path / "store", shard_rows=0)
    with pytest.raises(ConfigError, match="^memory_budget"):
        run_ingest(raw, tmp_path / "store", memory_budget="a lot")
    with pytest.raises(ConfigError, match="overlaps the raw dataset"):
        run_ingest(raw, raw)


def test_allow_nonfinite_keeps_nan_bit_exactly(tmp_path: Path) -> None:
    raw = _raw(tmp_path)
    _nan_feature(raw)
    run_ingest(raw, tmp_path / "store", allow_nonfinite=True)
    x = Store(tmp_path / "store").read_features()
    assert np.isnan(x[546, 2]) and np.isfinite(np.delete(x, 546, axis=0)).all()


# ----------------------------------------------------------------------------- idempotence and atomicity

def test_rerun_is_skipped_without_touching_files(tmp_path: Path) -> None:
    raw = _raw(tmp_path)
    out = tmp_path / "store"
    first = run_ingest(raw, out, memory_budget="64KiB")
    before = _mtimes(out)
    with TaskKeys() as seen:
        again = run_ingest(raw, out, memory_budget="64KiB")
    assert again.skipped and not seen.keys
    assert (again.num_nodes, again.num_edges, again.num_shards) == (first.num_nodes, first.num_edges, first.num_shards)
    assert _mtimes(out) == before

    assert not run_ingest(raw, out, memory_budget="64KiB", force=True).skipped
    assert _mtimes(out) != before
    assert not run_ingest(raw, out, memory_budget="128KiB").skipped  # the budget sets the shard size
    assert run_ingest(raw, out, memory_budget="128KiB").skipped
    assert not run_ingest(raw, out, memory_budget="128KiB", to_undirected=True).skipped


def test_changed_input_is_redone(tmp_path: Path) -> None:
    g = _graph(5)
    raw = _raw(tmp_path, g)
    out = tmp_path / "store"
    run_ingest(raw, out, shard_rows=400)
    g2 = dict(g, src=g["src"][::-1].copy())
    write_raw_dataset(tmp_path / "raw2", **g2, edge_parts=3, feature_parts=4, node_parts=2, row_group_rows=97)
    os.replace(tmp_path / "raw2" / "edges" / "part-00001.parquet", raw / "edges" / "part-00001.parquet")
    r = run_ingest(raw, out, shard_rows=400)
    assert not r.skipped
    src = np.concatenate([pq.read_table(f)["src"].to_numpy() for f in sorted((raw / "edges").iterdir())])
    np.testing.assert_array_equal(Store(out).indices, _csc_reference(src, g["dst"], N)[1])


def test_failure_keeps_the_previous_store(tmp_path: Path) -> None:
    raw = _raw(tmp_path)
    out = tmp_path / "store"
    run_ingest(raw, out, shard_rows=400)
    before = _mtimes(out)
    _duplicate_feature_row(raw)
    with pytest.raises(InputError, match="duplicate feature row"):
        run_ingest(raw, out, shard_rows=400)
    assert _mtimes(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw", "store"]


def test_failure_midway_leaves_no_manifest(tmp_path: Path) -> None:
    """The edges and nodes are fine; one feature shard fails after others were written."""
    raw = _raw(tmp_path)
    _nan_feature(raw)
    stages: list[Path] = []

    class _Spy(Callback):
        def _posttask(self, key, result, dsk, state, worker_id):
            stages.extend(p for p in tmp_path.glob(".store.tmp-*") if p not in stages)

    with _Spy(), pytest.raises(InputError, match="non-finite"):
        run_ingest(raw, tmp_path / "store", shard_rows=100)
    assert stages and all(not p.exists() for p in stages)  # there was a staging dir, and it is gone
    assert not (tmp_path / "store").exists()


# ----------------------------------------------------------------------------- distributed and CLI

@pytest.mark.timeout(120)
def test_distributed_process_cluster_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dask.utils import key_split
    from distributed import Client, LocalCluster, get_task_stream

    g = _graph(6, n=301, e=1201)
    raw = _raw(tmp_path, g)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        with get_task_stream(client) as stream:
            r = run_ingest(raw, tmp_path / "store", memory_budget="16KiB", shard_rows=100)
        assert not r.skipped
        groups = {key_split(t["key"]) for t in stream.data}
        workers = {t["worker"] for t in stream.data}
        argv = [str(raw), str(tmp_path / "cli-store"), "--scheduler", cluster.scheduler_address,
                "--to-undirected", "--shard-rows", "64"]
        assert _cli(argv) == 0
        out = capsys.readouterr().out
        assert "edges" in out and "feature bytes" in out and "5 shard(s)" in out
        assert _cli(argv) == 0
        assert "up to date" in capsys.readouterr().out
    assert {"ingest-nodes", "ingest-scan-feature", "ingest-scan-edges", "ingest-alloc-indptr", "ingest-alloc-indices",
            "ingest-csc", "ingest-feature-shard", "ingest-manifest"} == groups  # the dashboard's task groups
    assert len(workers) == 2
    s = Store(tmp_path / "store")
    indptr, indices = _csc_reference(g["src"], g["dst"], 301)
    np.testing.assert_array_equal(s.indptr, indptr)
    np.testing.assert_array_equal(s.indices, indices)
    np.testing.assert_array_equal(s.read_features(), g["features"])
    u = Store(tmp_path / "cli-store")
    assert u.shard_rows == 64 and u.manifest["config"]["to_undirected"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli-store", "raw", "store"]


def test_cli_options_reach_run_ingest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from diskflow.flow import cluster, ingest

    calls: list[tuple] = []
    monkeypatch.setattr(cluster, "dask_client", lambda **kw: contextlib.nullcontext(calls.append(("client", kw))))
    real = ingest.run_ingest
    monkeypatch.setattr(ingest, "run_ingest", lambda raw, out, **kw: (calls.append(("ingest", kw)), real(raw, out, **kw))[1])
    raw = _raw(tmp_path)
    assert _cli([str(raw), str(tmp_path / "store"), "--memory-budget", "64KiB", "--allow-nonfinite", "--force",
                 "--workers", "3"]) == 0
    assert calls[0] == ("client", {"scheduler": None, "n_workers": 3, "security": None})
    assert calls[1] == ("ingest", {"memory_budget": "64KiB", "shard_rows": None, "to_undirected": False,
                                   "allow_nonfinite": True, "force": True, "link_split": None,
                                   "disjoint_train_ratio": 0.0, "link_negatives": 100, "link_seed": 0,
                                   "storage_options": None, "derive": []})
    with pytest.raises(InputError, match="no such directory"):  # flow.cli prints it as one line, exit 2
        _cli([str(tmp_path / "missing"), str(tmp_path / "store")])


def _cli(argv: list[str]) -> int:
    """Run `diskflow ingest ARGV` through the subcommand's own parser."""
    import argparse

    from diskflow.cli import ingest as command

    parser = argparse.ArgumentParser(prog="diskflow")
    command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["ingest", *argv])
    return int(args.func(args))
