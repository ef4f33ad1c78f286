"""Typed ingest end to end: a PyG HeteroData -> typed raw dataset -> typed store, checked against numpy
constructions of each relation's CSC, the padded global feature table, labels and splits; to_undirected; a small
memory budget; derived features; one-line errors through the command line."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp
import torch
from diskflow.cli import main
from diskflow.flow.ingest import run_ingest
from diskflow.operators.formats.npyio import load_npy
from diskflow.operators.formats.store import SPLIT_CODE, Store
from diskflow.operators.formats.verify import verify_store
from diskflow.operators.ingest.pygimport import from_pyg
from task_keys import TaskKeys
from torch_geometric.data import HeteroData

import diskflow
from diskflow.errors import ConfigError, InputError

COUNTS = {"author": 37, "paper": 53, "institution": 11}
EDGES = {("author", "writes", "paper"): 181, ("paper", "cites", "paper"): 223,
         ("author", "affiliated_with", "institution"): 41}
DIM = 5


@pytest.fixture(autouse=True)
def _sync_scheduler():
    with dask.config.set(scheduler="sync"):
        yield


def _graph(seed: int = 0) -> HeteroData:
    """authors first in hetero order (featureless: their ids must come after the featured papers'), papers with
    identity-like features, labels and masks, institutions featureless; repeated edges on purpose."""
    rng = np.random.default_rng(seed)
    h = HeteroData()
    h["author"].num_nodes = COUNTS["author"]
    n = COUNTS["paper"]
    h["paper"].x = torch.from_numpy((np.arange(n)[:, None] * DIM + np.arange(DIM)).astype(np.float32))
    h["paper"].y = torch.from_numpy(rng.integers(0, 4, n))
    split = rng.integers(0, 4, n)
    for code, name in enumerate(("train_mask", "val_mask", "test_mask")):
        h["paper"][name] = torch.from_numpy(split == code)
    h["institution"].num_nodes = COUNTS["institution"]
    for (s, r, d), e in EDGES.items():
        src, dst = rng.integers(0, COUNTS[s], e), rng.integers(0, COUNTS[d], e)
        src[:3], dst[:3] = src[0], dst[0]       # a repeated edge
        h[s, r, d].edge_index = torch.from_numpy(np.stack([src, dst]))
    return h


def _csc(src: np.ndarray, dst: np.ndarray, num_dst: int, dedupe: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The CSC by destination of an edge list: each destination's sources ascending (numpy), repeated ones kept
    unless `dedupe`."""
    if dedupe:
        pairs = np.unique(np.stack([dst, src], axis=1), axis=0)
        dst, src = pairs[:, 0], pairs[:, 1]
    order = np.lexsort((src, dst))
    return np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=num_dst))]), src[order]


def _scipy_dense(indptr: np.ndarray, indices: np.ndarray, num_src: int) -> np.ndarray:
    """The relation's dense [src, dst] edge-count matrix read from a CSC."""
    return sp.csc_matrix((np.ones(len(indices)), indices, indptr), shape=(num_src, len(indptr) - 1)).toarray()


def _ingest(tmp: Path, h: HeteroData, name: str = "store", **kw: Any) -> Store:
    raw = tmp / "raw"
    if not raw.exists():
        from_pyg(h, raw)
    run_ingest(raw, tmp / name, **kw)
    return Store(tmp / name)


def _arrays(store: Store) -> dict[str, np.ndarray]:
    """Every array of a store, by its file (to compare two stores)."""
    out = {"features": store.read_features(), "labels": store.labels, "splits": store.splits}
    assert store.hetero is not None
    for k in range(len(store.hetero.edge_types)):
        out[f"indptr{k}"], out[f"indices{k}"] = (np.asarray(a) for a in store.relation(k))
    return out


# ----------------------------------------------------------------------------- the store

def test_typed_store_matches_numpy_and_the_heterodata(tmp_path: Path) -> None:
    h = _graph()
    store = _ingest(tmp_path, h, memory_budget="1MiB")
    lay = store.hetero
    assert lay is not None and store.manifest["topology"] is None
    # global ids: the featured paper first, then author and institution in hetero order
    assert [(t.name, t.offset, t.count, t.dim, t.dtype) for t in lay.node_types] == [
        ("paper", 0, 53, DIM, "float32"), ("author", 53, 37, 0, None), ("institution", 90, 11, 0, None)]
    assert lay.target == "paper" and store.num_nodes == sum(COUNTS.values())
    assert [e.key for e in lay.edge_types] == list(EDGES)
    offset = 0
    for k, (s, r, d) in enumerate(EDGES):
        ei = h[s, r, d].edge_index.numpy()
        indptr, indices = store.relation(k)
        want_ptr, want_idx = _csc(ei[0], ei[1], COUNTS[d])
        np.testing.assert_array_equal(indptr, want_ptr)
        np.testing.assert_array_equal(indices, want_idx)
        assert indices.dtype == np.int32 and indptr.dtype == np.int64
        dense = np.zeros((COUNTS[s], COUNTS[d]))
        np.add.at(dense, (ei[0], ei[1]), 1)
        np.testing.assert_array_equal(_scipy_dense(indptr, indices, COUNTS[s]), dense)
        e = lay.edge_types[k]
        assert (e.num_edges, e.edge_offset, e.indptr) == (ei.shape[1], offset, f"etypes/{k}/indptr.npy")
        offset += ei.shape[1]
    assert store.num_edges == offset == lay.num_edges
    # one feature table over the featured rows; labels and splits over every global id
    np.testing.assert_array_equal(store.read_features(), h["paper"].x.numpy())
    assert store.features.num_rows == lay.feature_rows == 53 and store.feature_bytes == 53 * DIM * 4
    want_labels = np.full(store.num_nodes, -1)
    want_labels[:53] = h["paper"].y.numpy()
    np.testing.assert_array_equal(store.labels, want_labels)
    split = np.full(store.num_nodes, SPLIT_CODE["none"])
    for name in ("train", "val", "test"):
        split[:53][h["paper"][f"{name}_mask"].numpy()] = SPLIT_CODE[name]
    np.testing.assert_array_equal(store.splits, split)
    assert store.num_classes == int(h["paper"].y.max()) + 1
    with pytest.raises(InputError, match="a typed store has one topology per edge type"):
        _ = store.indptr
    with pytest.raises(InputError, match="out of range"):
        store.relation(3)
    assert verify_store(store.path)["checked"]
    assert {f"etypes/{k}/{a}.npy" for k in range(3) for a in ("indptr", "indices")} <= set(store.checks.files)


def test_to_undirected_adds_reverse_types_and_symmetrises_cites(tmp_path: Path) -> None:
    h = _graph(1)
    store = _ingest(tmp_path, h, to_undirected=True)
    lay = store.hetero
    assert lay is not None
    assert [e.key for e in lay.edge_types] == [*EDGES, ("paper", "rev_writes", "author"),
                                               ("institution", "rev_affiliated_with", "author")]
    cites = h["paper", "cites", "paper"].edge_index.numpy()
    indptr, indices = store.relation(1)
    want = _csc(np.concatenate([cites[0], cites[1]]), np.concatenate([cites[1], cites[0]]), 53, dedupe=True)
    np.testing.assert_array_equal(indptr, want[0])
    np.testing.assert_array_equal(indices, want[1])
    dense = _scipy_dense(indptr, indices, 53)
    np.testing.assert_array_equal(dense, dense.T)
    assert dense.max() == 1
    for k, rk in ((0, 3), (2, 4)):      # a reverse type holds its type's edges reversed, repeats kept (PyG)
        s, r, d = list(EDGES)[k]
        ei = h[s, r, d].edge_index.numpy()
        indptr, indices = store.relation(rk)
        want = _csc(ei[1], ei[0], COUNTS[s])
        np.testing.assert_array_equal(indptr, want[0])
        np.testing.assert_array_equal(indices, want[1])
        np.testing.assert_array_equal(_scipy_dense(indptr, indices, COUNTS[d]),
                                      _scipy_dense(*store.relation(k), COUNTS[s]).T)
    assert [e.edge_offset for e in lay.edge_types] == list(np.cumsum([0, *(e.num_edges for e in lay.edge_types)])[:-1])
    assert store.manifest["config"]["to_undirected"] is True
    # a reverse type the graph declares already is not added again
    h2 = _graph(1)
    h2["paper", "rev_writes", "author"].edge_index = torch.tensor([[0], [1]])
    store2 = _ingest(tmp_path / "again", h2, to_undirected=True)
    assert store2.hetero is not None
    keys = [e.key for e in store2.hetero.edge_types]
    assert keys.count(("paper", "rev_writes", "author")) == 1
    assert store2.relation(keys.index(("paper", "rev_writes", "author")))[1].tolist() == [0]


def test_mixed_widths_and_dtypes_are_padded_into_one_table(tmp_path: Path) -> None:
    h = _graph(2)
    venue = np.random.default_rng(3).standard_normal((13, 3)).astype(np.float16)
    h["venue"].x = torch.from_numpy(venue)
    h["paper", "in", "venue"].edge_index = torch.tensor([[0, 1, 2], [3, 3, 12]])
    store = _ingest(tmp_path, h, shard_rows=7)      # shards that straddle the types' ranges
    lay = store.hetero
    assert lay is not None
    assert [(t.name, t.offset, t.dim, t.dtype) for t in lay.node_types] == [
        ("paper", 0, DIM, "float32"), ("venue", 53, 3, "float16"), ("author", 66, 0, None),
        ("institution", 103, 0, None)]
    assert store.feature_dtype == np.float32 and store.feature_dim == DIM and len(store.shards) == 10
    want = np.zeros((66, DIM), np.float32)
    want[:53] = h["paper"].x.numpy()
    want[53:, :3] = venue
    np.testing.assert_array_equal(store.read_features(), want)
    np.testing.assert_array_equal(store.relation(3)[0], [0, 0, 0, 0, 2] + [2] * 8 + [3])


def test_a_small_memory_budget_gives_the_same_store(tmp_path: Path) -> None:
    h = _graph(4)
    big = _ingest(tmp_path, h, name="big", to_undirected=True)
    with TaskKeys() as seen:
        small = _ingest(tmp_path, h, name="small", to_undirected=True, memory_budget="4KiB", shard_rows=20)
    cites = [k for k in seen.keys if k.startswith("ingest-csc-r1-")]
    assert len(cites) >= 2, "a 4 KiB budget must split the symmetrised cites CSC into several bucket tasks"
    assert any(k.startswith("ingest-compact-r1-") for k in seen.keys)
    assert len(small.shards) == 3 and len(big.shards) == 1
    a, b = _arrays(big), _arrays(small)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert big.manifest["hetero"] == small.manifest["hetero"]


def test_rerun_is_skipped_and_the_api_takes_a_heterodata(tmp_path: Path) -> None:
    h = _graph(5)
    r = diskflow.ingest(h, tmp_path / "store")
    assert not r.skipped and r.num_nodes == sum(COUNTS.values()) and r.feature_bytes == 53 * DIM * 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]     # the temporary raw dataset is gone
    from_pyg(h, tmp_path / "raw")
    run_ingest(tmp_path / "raw", tmp_path / "s2")
    assert run_ingest(tmp_path / "raw", tmp_path / "s2").skipped
    np.testing.assert_array_equal(Store(tmp_path / "s2").relation(2)[1], Store(tmp_path / "store").relation(2)[1])


def test_a_homogeneous_only_option_is_refused(tmp_path: Path) -> None:
    from_pyg(_graph(), tmp_path / "raw")
    with pytest.raises(ConfigError, match="^link_split: .*typed stores have no link split yet"):
        run_ingest(tmp_path / "raw", tmp_path / "store", link_split=(0.1, 0.1))
    attr = tmp_path / "raw" / "edges" / "author__writes__paper" / "part-00000.parquet"
    table = pq.read_table(attr)
    pq.write_table(table.append_column("edge_attr", pa.FixedSizeListArray.from_arrays(
        pa.array(np.zeros(table.num_rows, np.float32)), 1)), attr)
    with pytest.raises(InputError, match="an edge_attr column: a typed raw dataset cannot have edge features") as e:
        run_ingest(tmp_path / "raw", tmp_path / "store")
    assert e.value.path == str(attr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]


# ----------------------------------------------------------------------------- derived features

def _stub_derive(store_dir: Path, rules: list, memory_budget: int) -> float:
    """A stand-in for flow/derive.py: each rule's mean over its CSC, from the staged store, written in place."""
    st = Store(store_dir)
    lay = st.hetero
    assert lay is not None and memory_budget > 0
    for r in rules:
        indptr, indices = load_npy(Path(store_dir) / r.indptr), load_npy(Path(store_dir) / r.indices)
        me, nb = lay.node(r.type), lay.node(r.neighbour)
        rows = st.gather(nb.offset + np.asarray(indices, np.int64))[:, :nb.dim].astype(np.float64)
        owner = np.repeat(np.arange(me.count), np.diff(indptr))
        sums = np.zeros((me.count, nb.dim))
        np.add.at(sums, owner, rows)
        mean = sums / np.maximum(np.diff(indptr), 1)[:, None]
        for s in st.shards:
            a, b = max(s.row_start, me.offset), min(s.row_stop, me.stop)
            if a < b:
                shard = np.lib.format.open_memmap(s.path, mode="r+")
                shard[a - s.row_start:b - s.row_start, :nb.dim] = mean[a - me.offset:b - me.offset]
                shard.flush()
    return 0.0


@pytest.fixture()
def derive_features(monkeypatch: pytest.MonkeyPatch) -> None:
    """flow/derive.py where there is one, else the stub."""
    if importlib.util.find_spec("diskflow.flow.derive") is None:
        module = types.ModuleType("diskflow.flow.derive")
        module.derive_features = _stub_derive     # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "diskflow.flow.derive", module)


def test_derived_types_get_their_neighbours_mean(tmp_path: Path, derive_features: None) -> None:
    h = _graph(6)
    # the institution rule first: its neighbour (author) is itself derived, so it must run second
    rules = ["institution=mean:author__affiliated_with__institution", "author=mean:author__writes__paper"]
    store = _ingest(tmp_path, h, derive=rules, shard_rows=16)
    lay = store.hetero
    assert lay is not None
    assert [(t.name, t.offset, t.dim, t.dtype) for t in lay.node_types] == [
        ("author", 0, DIM, "float32"), ("paper", 37, DIM, "float32"), ("institution", 90, DIM, "float32")]
    assert lay.node("author").derived == {"reduce": "mean", "edge_type": ["author", "writes", "paper"],
                                          "from": "paper"}
    assert lay.node("institution").derived["from"] == "author"
    assert store.manifest["config"]["derive"] == [rules[1], rules[0]]
    assert "derive_seconds" in store.manifest["stats"]
    # author is the source of writes: its reversed CSC is kept in the store
    writes = h["author", "writes", "paper"].edge_index.numpy()
    indptr, indices = load_npy(store.path / "derive/0/indptr.npy"), load_npy(store.path / "derive/0/indices.npy")
    want = _csc(writes[1], writes[0], COUNTS["author"])
    np.testing.assert_array_equal(indptr, want[0])
    np.testing.assert_array_equal(indices, want[1])
    x = store.read_features()
    paper = h["paper"].x.numpy()
    np.testing.assert_array_equal(x[37:90], paper)
    deg = np.bincount(writes[0], minlength=COUNTS["author"])
    sums = np.zeros((COUNTS["author"], DIM))
    np.add.at(sums, writes[0], paper[writes[1]])
    author = sums / np.maximum(deg, 1)[:, None]
    np.testing.assert_allclose(x[:37], author, rtol=1e-5)
    aff = h["author", "affiliated_with", "institution"].edge_index.numpy()
    sums = np.zeros((COUNTS["institution"], DIM))
    np.add.at(sums, aff[1], author[aff[0]])
    inst = sums / np.maximum(np.bincount(aff[1], minlength=COUNTS["institution"]), 1)[:, None]
    np.testing.assert_allclose(x[90:], inst, rtol=1e-5)
    assert verify_store(store.path)["checked"]      # the derived rows' checksums were taken afresh


def test_derive_rule_errors(tmp_path: Path, derive_features: None) -> None:
    from_pyg(_graph(), tmp_path / "raw")
    for rule, fault in [
        ("venue=mean:author__writes__paper", "unknown node type 'venue'"),
        ("author=mean:author__reads__paper", "unknown edge type author__reads__paper"),
        ("author=max:author__writes__paper", "unknown reduce 'max'"),
        ("paper=mean:author__writes__paper", "node type 'paper' has features in the raw data"),
        ("institution=mean:author__affiliated_with__institution", "neighbour type 'author' has no features and no rule"),
        ("author", "is not a derive rule"),
    ]:
        with pytest.raises(ConfigError, match=f"^derive: .*{fault}"):
            run_ingest(tmp_path / "raw", tmp_path / "store", derive=[rule])
    with pytest.raises(ConfigError, match="^derive: rules derive from one another in a cycle"):
        run_ingest(tmp_path / "raw", tmp_path / "store", to_undirected=True,
                   derive=["institution=mean:author__affiliated_with__institution",
                           "author=mean:institution__rev_affiliated_with__author"])
    with pytest.raises(ConfigError, match="^derive: .*has no hetero.json"):
        run_ingest(tmp_path / "nope", tmp_path / "store", derive=["a=mean:a__b__c"])


# ----------------------------------------------------------------------------- one-line errors, command line

def _unknown_type(raw: Path) -> tuple[Path, str]:
    spec = json.loads((raw / "hetero.json").read_text())
    spec["edge_types"].append(["author", "edits", "journal"])
    (raw / "hetero.json").write_text(json.dumps(spec))
    return raw / "hetero.json", "edge type author__edits__journal names an unknown node type 'journal'"


def _feature_widths(raw: Path) -> tuple[Path, str]:
    folder = raw / "features" / "paper"
    x = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(6 * 2, np.float32)), 6)
    pq.write_table(pa.table({"node_id": np.arange(2), "x": x}), folder / "part-00001.parquet")
    return folder / "part-00001.parquet", r"schema mismatch between feature shards: .*\[6\] here but .*\[5\]"


def _id_out_of_range(raw: Path) -> tuple[Path, str]:
    path = raw / "edges" / "author__writes__paper" / "part-00000.parquet"
    t = pq.read_table(path)
    dst = t.column("dst").to_numpy().copy()
    dst[9] = COUNTS["paper"]
    pq.write_table(t.set_column(1, "dst", pa.array(dst)), path)
    return path, (f"edge dst {COUNTS['paper']} at row 9 is out of range: paper ids must be 0..52 "
                  "\\(node type 'paper' has 53 nodes")


def _derive_unknown(raw: Path) -> tuple[Path, str]:
    return raw, "--derive: venue=mean:author__writes__paper: unknown node type 'venue'"


def _derive_unknown_edge(raw: Path) -> tuple[Path, str]:
    return raw, "--derive: author=mean:author__reads__paper: unknown edge type author__reads__paper"


CLI_CASES = {"unknown-node-type": (_unknown_type, []), "feature-widths": (_feature_widths, []),
             "id-out-of-range": (_id_out_of_range, []),
             "derive-unknown-type": (_derive_unknown, ["--derive", "venue=mean:author__writes__paper"]),
             "derive-unknown-edge-type": (_derive_unknown_edge, ["--derive", "author=mean:author__reads__paper"])}


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_cli_errors_are_one_line_and_exit_2(tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from diskflow import api

    monkeypatch.setattr(api, "_cluster", lambda *a, **k: contextlib.nullcontext())   # Dask's local scheduler
    from_pyg(_graph(), tmp_path / "raw")
    mutate, argv = CLI_CASES[case]
    where, fault = mutate(tmp_path / "raw")
    assert main(["ingest", str(tmp_path / "raw"), str(tmp_path / "store"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("diskflow ingest: error: "), err
    import re
    assert re.search(fault, err[0]), err[0]
    if case not in ("derive-unknown-type", "derive-unknown-edge-type"):
        assert str(where) in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]


def test_cli_ingests_a_typed_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from diskflow import api

    monkeypatch.setattr(api, "_cluster", lambda *a, **k: contextlib.nullcontext())
    h = _graph()
    torch.save(h, tmp_path / "graph.pt")
    assert main(["import", "pyg", str(tmp_path / "graph.pt"), str(tmp_path / "raw")]) == 0
    assert "101 nodes, 445 edges of 3 node types and 3 edge types" in capsys.readouterr().out
    assert main(["ingest", str(tmp_path / "raw"), str(tmp_path / "store"), "--to-undirected"]) == 0
    assert "nodes          101" in capsys.readouterr().out
    assert main(["verify", str(tmp_path / "store")]) == 0
    lay = Store(tmp_path / "store").hetero
    assert lay is not None and len(lay.edge_types) == 5
