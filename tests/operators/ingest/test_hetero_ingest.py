"""Typed raw datasets without Dask: hetero.json, the typed writer and the PyG import, the planning helpers
(relations, global id order, derive rules) and the typed operators (nodes, feature shards, reversed scans)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from diskflow.operators.formats.npyio import load_npy
from diskflow.operators.ingest.edges import allocate_npy, csc_group, scan_edges
from diskflow.operators.ingest.features import scan_features
from diskflow.operators.ingest.heterotypes import (
    HETERO_FILE,
    DeriveRule,
    HeteroSpec,
    TypedSegment,
    find_hetero_files,
    ingest_typed_nodes,
    node_order,
    parse_derive,
    plan_derive,
    relations,
    write_typed_feature_shard,
)
from diskflow.operators.ingest.pygimport import from_pyg
from diskflow.operators.ingest.raw import table_units
from diskflow.operators.ingest.rawwriter import HeteroRawWriter, publish_hetero_raw, write_typed_arrays
from torch_geometric.data import HeteroData

from diskflow.errors import ConfigError, InputError

SPEC = {"node_types": [{"name": "author", "num_nodes": 7}, {"name": "paper", "num_nodes": 5},
                       {"name": "institution", "num_nodes": 3}],
        "edge_types": [["author", "writes", "paper"], ["paper", "cites", "paper"],
                       ["author", "affiliated_with", "institution"]]}


def _hetero() -> HeteroData:
    h = HeteroData()
    h["author"].num_nodes = 7
    h["paper"].x = torch.arange(15, dtype=torch.float32).reshape(5, 3)
    h["paper"].y = torch.tensor([0, 1, 2, 1, 0])
    h["paper"].train_mask = torch.tensor([True, True, False, False, False])
    h["institution"].num_nodes = 3
    h["author", "writes", "paper"].edge_index = torch.tensor([[0, 1, 6, 6], [4, 4, 0, 2]])
    h["paper", "cites", "paper"].edge_index = torch.tensor([[0, 1], [1, 2]])
    h["author", "affiliated_with", "institution"].edge_index = torch.tensor([[0, 5], [2, 2]])
    return h


# ----------------------------------------------------------------------------- hetero.json

def test_spec_round_trips_and_refuses_what_it_cannot_hold() -> None:
    spec = HeteroSpec.from_json(SPEC)
    assert spec.names == ["author", "paper", "institution"] and spec.count("paper") == 5
    assert HeteroSpec.from_json(spec.to_json()) == spec
    bad = [({**SPEC, "edge_types": [["author", "writes", "journal"]]}, "names an unknown node type 'journal'"),
           ({**SPEC, "node_types": [{"name": "a", "num_nodes": 0}]}, "num_nodes must be an integer >= 1"),
           ({**SPEC, "node_types": [{"name": "a__b", "num_nodes": 1}]}, "cannot name a folder"),
           ({**SPEC, "node_types": [{"name": "a", "num_nodes": 1}] * 2}, "listed twice"),
           ({"node_types": []}, "expected"),
           ({**SPEC, "edge_types": [["author", "writes"]]}, "is not \\[src, rel, dst\\]")]
    for obj, match in bad:
        with pytest.raises(InputError, match=match) as e:
            HeteroSpec.from_json(obj, "raw/hetero.json")
        assert e.value.path == "raw/hetero.json"


# ----------------------------------------------------------------------------- writing the typed raw format

def test_from_pyg_writes_the_typed_raw_format(tmp_path: Path) -> None:
    raw = from_pyg(_hetero(), tmp_path / "raw", chunk_bytes=48)      # 4 feature rows, 3 edges a shard: chunked
    assert json.loads((raw / HETERO_FILE).read_text()) == SPEC
    files = find_hetero_files(raw)
    assert len(files.features["paper"]) == 2 and not files.features["author"] and not files.nodes["author"]
    assert [p.parent.name for p in files.edges[("author", "writes", "paper")]] == ["author__writes__paper"] * 2
    assert files.relative(files.all()[0]) == HETERO_FILE
    nodes = pa.concat_tables([pq.read_table(p) for p in files.nodes["paper"]]).to_pydict()
    assert nodes["node_id"] == [0, 1, 2, 3, 4] and nodes["label"] == [0, 1, 2, 1, 0]
    assert nodes["split"] == ["train", "train", "none", "none", "none"]
    m = json.loads((raw / "manifest.json").read_text())
    assert (m["num_nodes"], m["num_edges"], m["feature_dim"], m["feature_bytes"]) == (15, 8, 3, 60)
    assert [t["labelled"] for t in m["hetero"]["node_types"]] == [False, True, False]


def test_from_pyg_refuses_typed_edge_features_and_link_labels(tmp_path: Path) -> None:
    for attr, match in [("edge_attr", "typed edge features are not supported yet"),
                        ("edge_label_index", "link-prediction labels are not supported for typed graphs"),
                        ("edge_weight", "is not stored by the typed raw format")]:
        h = _hetero()
        h["author", "writes", "paper"][attr] = torch.zeros(4)
        with pytest.raises(InputError, match=match) as e:
            from_pyg(h, tmp_path / "raw", name="g.pt")
        assert e.value.path == f"g.pt: author__writes__paper.{attr}"
    h = _hetero()
    h["paper"].pos = torch.zeros(5, 2)
    with pytest.raises(InputError, match="is not stored by the typed raw format") as e:
        from_pyg(h, tmp_path / "raw", name="g.pt")
    assert e.value.path == "g.pt: paper.pos"
    h = _hetero()
    h["author", "writes", "paper"].edge_index = torch.tensor([[7], [0]])
    with pytest.raises(InputError, match="source id out of range \\[0, 7\\) of node type 'author'"):
        from_pyg(h, tmp_path / "raw", name="g.pt")
    assert not (tmp_path / "raw").exists()


def test_writer_checks_row_counts(tmp_path: Path) -> None:
    spec = HeteroSpec.from_json(SPEC)

    def short(w: HeteroRawWriter) -> None:
        write_typed_arrays(w, {"paper": (np.zeros((4, 2), np.float32), None, None)}, {}, 1 << 20, "g")

    with pytest.raises(InputError, match="4 feature rows for the 5 nodes of type 'paper'"):
        publish_hetero_raw(tmp_path / "raw", False, {"kind": "test"}, "arrow", spec, short)
    assert not (tmp_path / "raw").exists()


def test_find_hetero_files_refuses_undeclared_folders(tmp_path: Path) -> None:
    raw = from_pyg(_hetero(), tmp_path / "raw")
    (raw / "features" / "venue").mkdir()
    with pytest.raises(InputError, match="names no node type of hetero.json") as e:
        find_hetero_files(raw)
    assert e.value.path == str(raw / "features" / "venue")
    (raw / "features" / "venue").rmdir()
    (raw / "edges" / "part-00000.parquet").write_bytes(b"")
    with pytest.raises(InputError, match="one folder per type"):
        find_hetero_files(raw)


# ----------------------------------------------------------------------------- planning

def test_relations_follow_pyg_to_undirected(tmp_path: Path) -> None:
    files = find_hetero_files(from_pyg(_hetero(), tmp_path / "raw"))
    assert [(r.key, r.undirected) for r in relations(files, False)] == [
        (("author", "writes", "paper"), False), (("paper", "cites", "paper"), False),
        (("author", "affiliated_with", "institution"), False)]
    rels = relations(files, True)
    assert [(r.key, r.undirected) for r in rels] == [
        (("author", "writes", "paper"), False), (("paper", "cites", "paper"), True),
        (("author", "affiliated_with", "institution"), False), (("paper", "rev_writes", "author"), False),
        (("institution", "rev_affiliated_with", "author"), False)]
    assert [rev for _, rev in rels[3].sources] == [True] and rels[3].sources[0][0] == rels[0].sources[0][0]
    assert rels[0].reversed().key == ("paper", "writes", "author")


def test_node_order_puts_featured_types_first() -> None:
    spec = HeteroSpec.from_json(SPEC)
    assert node_order(spec, {"paper"}) == ["paper", "author", "institution"]
    assert node_order(spec, {"paper", "institution"}) == ["paper", "institution", "author"]
    assert node_order(spec, {"author", "paper", "institution"}) == spec.names


def test_parse_and_plan_derive_rules() -> None:
    spec = HeteroSpec.from_json(SPEC)
    store_types = [tuple(et) for et in SPEC["edge_types"]]
    rule = parse_derive("author=mean:author__writes__paper")
    assert rule == DeriveRule("author", ("author", "writes", "paper")) and rule.text == "author=mean:author__writes__paper"
    assert parse_derive("paper=mean:author,writes,paper").edge_type == ("author", "writes", "paper")
    inst, author = plan_derive([parse_derive("institution=mean:author__affiliated_with__institution"), rule],
                               spec, store_types, {"paper"})[::-1]
    assert (author.type, author.neighbour, author.indptr, author.indices) == \
        ("author", "paper", "derive/0/indptr.npy", "derive/0/indices.npy")
    assert (inst.type, inst.neighbour, inst.indptr) == ("institution", "author", "etypes/2/indptr.npy")
    assert author.entry() == {"reduce": "mean", "edge_type": ["author", "writes", "paper"], "from": "paper"}
    for rules, match in [(["author=mean:author__cites__paper"], "unknown edge type"),
                         (["author=mean:paper__cites__paper"], "no end of edge type"),
                         ([rule.text, rule.text], "derived by two rules"),
                         (["author=sum:author__writes__paper"], "unknown reduce 'sum'"),
                         (["author:author__writes__paper"], "is not a derive rule")]:
        with pytest.raises(ConfigError, match=match):
            plan_derive([parse_derive(t) for t in rules], spec, store_types, {"paper"})


# ----------------------------------------------------------------------------- operators

def test_typed_nodes_over_global_ids(tmp_path: Path) -> None:
    files = find_hetero_files(from_pyg(_hetero(), tmp_path / "raw"))
    (tmp_path / "store").mkdir()
    out = ingest_typed_nodes([("paper", 0, 5, [str(p) for p in files.nodes["paper"]]), ("author", 5, 7, []),
                              ("institution", 12, 3, [])], 15, tmp_path / "store")
    assert out["labelled"] == ["paper"] and out["num_classes"] == 3
    assert out["split_counts"] == {"train": 2, "val": 0, "test": 0, "none": 13}
    np.testing.assert_array_equal(load_npy(tmp_path / "store" / "labels.npy"), [0, 1, 2, 1, 0] + [-1] * 10)


def test_typed_feature_shard_pads_and_casts(tmp_path: Path) -> None:
    h = HeteroData()
    a = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((5, 2)).astype(np.float16)
    h["a"].x, h["b"].x = torch.from_numpy(a), torch.from_numpy(b)
    h["a", "to", "b"].edge_index = torch.tensor([[0], [0]])
    files = find_hetero_files(from_pyg(h, tmp_path / "raw", chunk_bytes=32))
    scans = {t: [scan_features(p, n, node_type=t) for p in files.features[t]] for t, n in (("a", 6), ("b", 5))}
    units = {t: tuple(u.unit for f in fs for u in f.units) for t, fs in scans.items()}
    segs = [TypedSegment("a", 4, 6, 0, 4, units["a"], "fa"), TypedSegment("b", 0, 3, 2, 2, units["b"], "fb"),
            TypedSegment("c", 0, 2, 5, 2, (), "fc")]     # a derived type's rows: zeros for now
    entry = write_typed_feature_shard(segs, tmp_path / "s.npy", row_start=4, rows=7, dtype=np.float32, dim=4)
    assert entry == {"row_start": 4, "rows": 7, "offset": 4096, "nbytes": 7 * 16}
    want = np.zeros((7, 4), np.float32)
    want[:2] = a[4:]
    want[2:5, :2] = b[:3]
    np.testing.assert_array_equal(load_npy(tmp_path / "s.npy"), want)
    with pytest.raises(InputError, match="no feature row for node 2 .4 of nodes 0..5 missing") as e:
        write_typed_feature_shard([TypedSegment("a", 0, 6, 0, 4, units["a"][:1], "fa")], tmp_path / "t.npy",
                                  row_start=0, rows=6, dtype=np.float32, dim=4)
    assert e.value.path == "fa"


def test_reversed_scan_builds_the_csc_by_source(tmp_path: Path) -> None:
    files = find_hetero_files(from_pyg(_hetero(), tmp_path / "raw"))
    path = files.edges[("author", "writes", "paper")][0]
    spill = scan_edges(path, tmp_path / "s.bin", num_nodes=7, num_src=5, bucket_width=2, num_buckets=4,
                       chunk_rows=3, reverse=True, types=("author", "paper"))
    indptr = allocate_npy(tmp_path / "indptr.npy", np.int64, 8)
    indices = allocate_npy(tmp_path / "indices.npy", np.int32, 4)
    runs = [(spill.path, spill.offsets[:, 0], spill.offsets[:, 4])]
    assert csc_group(runs, lo=0, hi=7, base=0, indptr_path=indptr, indices_path=indices, index_dtype=np.int32) == 4
    np.testing.assert_array_equal(load_npy(indptr), [0, 1, 2, 2, 2, 2, 2, 4])     # authors 0, 1, 6
    np.testing.assert_array_equal(load_npy(indices), [4, 4, 0, 2])
    with pytest.raises(InputError, match="edge src 6 at row 2 is out of range: author ids must be 0..4") as e:
        scan_edges(path, tmp_path / "t.bin", num_nodes=5, num_src=5, bucket_width=2, num_buckets=3, chunk_rows=3,
                   types=("author", "paper"))
    assert e.value.path == str(path) and "node type 'author' has 5 nodes" in str(e.value)
    assert table_units(path)[0].rows == 4


def test_a_typed_dataset_at_a_url_is_refused_in_one_line() -> None:
    import fsspec
    from diskflow.operators.ingest.raw import find_raw_files

    fs = fsspec.filesystem("memory")
    for rel in ("hetero.json", "edges/a__b__a/part-0.parquet", "features/a/part-0.parquet", "nodes/a/part-0.parquet"):
        fs.pipe(f"/typed-url/raw/{rel}", b"{}")
    try:
        with pytest.raises(InputError, match="a typed raw dataset is ingested from a local directory only") as e:
            find_raw_files("memory://typed-url/raw")
        assert e.value.path == "memory://typed-url/raw/hetero.json"
    finally:
        fs.rm("/typed-url", recursive=True)
