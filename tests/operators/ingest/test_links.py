"""Edge features and link splits: ingest keeps edge features in CSC order, splits seed edges without leakage,
importers keep edge_attr and refuse what they cannot store, and bad input is one line."""
from __future__ import annotations

from pathlib import Path

import dask
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from diskflow.cli.main import main
from diskflow.flow.ingest import run_ingest
from diskflow.operators.formats.store import Store
from diskflow.operators.ingest.links import LinkConfig, link_tags, pair_uniform
from diskflow.operators.ingest.npyimport import from_npy
from diskflow.operators.ingest.pygimport import from_pyg
from diskflow.operators.ingest.raw import write_raw_dataset
from torch_geometric.data import Data

from diskflow.errors import ConfigError, InputError

N, E, D = 257, 1531, 3


@pytest.fixture(autouse=True)
def _sync_scheduler():
    with dask.config.set(scheduler="sync"):
        yield


def _graph(seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, N, E), rng.integers(0, N, E)
    return {"src": src, "dst": dst, "features": rng.random((N, 4)).astype(np.float32),
            "labels": rng.integers(-1, 3, N), "splits": rng.choice(["train", "val", "test", "none"], N),
            "edge_attr": rng.standard_normal((E, D)).astype(dtype)}


def _raw(tmp: Path, g: dict, name: str = "raw", **kw) -> Path:
    return write_raw_dataset(tmp / name, **{"edge_parts": 3, "row_group_rows": 101, **kw}, **g)


def _reference(src: np.ndarray, dst: np.ndarray, attr: np.ndarray, undirected: bool):
    """CSC order by numpy: sort by (dst, src) stable over raw rows (reversed copies at their edge's row),
    keeping the first of repeated pairs under undirected."""
    ordinal = np.arange(len(src))
    if undirected:
        src, dst, attr, ordinal = (np.concatenate([src, dst]), np.concatenate([dst, src]),
                                   np.concatenate([attr, attr]), np.concatenate([ordinal, ordinal]))
    order = np.lexsort((ordinal, src, dst))
    if undirected:
        s, d = src[order], dst[order]
        first = np.ones(len(order), bool)
        first[1:] = (s[1:] != s[:-1]) | (d[1:] != d[:-1])
        order = order[first]
    return src[order], dst[order], attr[order]


# ----------------------------------------------------------------------------- edge features

@pytest.mark.parametrize("undirected", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_edge_features_land_in_csc_order(tmp_path: Path, undirected: bool, dtype) -> None:
    g = _graph(1, dtype)
    raw = _raw(tmp_path, g)
    r = run_ingest(raw, tmp_path / "store", memory_budget="16KiB", shard_rows=200, to_undirected=undirected)
    s = Store(tmp_path / "store")
    src, dst, attr = _reference(g["src"], g["dst"], g["edge_attr"], undirected)
    np.testing.assert_array_equal(s.indices, src)
    np.testing.assert_array_equal(np.repeat(np.arange(N), np.diff(s.indptr)), dst)
    ef = s.edge_features
    assert ef is not None and ef.dtype == np.dtype(dtype) and ef.dim == D and ef.num_rows == s.num_edges
    assert len(ef.shards) == -(-s.num_edges // 200) > 3
    np.testing.assert_array_equal(ef.read_all(), attr)
    ids = np.random.default_rng(0).integers(0, s.num_edges, 300)
    np.testing.assert_array_equal(ef.gather(ids), attr[ids])
    np.testing.assert_array_equal(ef.shard_array(1), attr[200:400])
    for sh in ef.shards:  # page-aligned shards: data at byte 4096
        assert sh.path.read_bytes()[4096:] == attr[sh.row_start:sh.row_stop].tobytes()
    assert r.edge_feature_bytes == s.num_edges * D * np.dtype(dtype).itemsize
    m = s.manifest["edge_features"]
    assert set(m) == {"dtype", "dim", "row_bytes", "shard_rows", "arrow_type", "shards"}
    assert not s.has_link and not (tmp_path / "store" / "_spill").exists()


def test_edges_without_features_have_none(tmp_path: Path) -> None:
    g = _graph()
    del g["edge_attr"]
    run_ingest(_raw(tmp_path, g), tmp_path / "store")
    s = Store(tmp_path / "store")
    assert s.edge_features is None and "edge_features" not in s.manifest
    with pytest.raises(InputError, match="has no link split"):
        s.link_edges("val")


def _bad_edges(raw: Path, part: int, **cols) -> None:
    path = raw / "edges" / f"part-{part:05d}.parquet"
    table = pq.read_table(path)
    for name, col in cols.items():
        table = table.drop_columns([name]) if col is None else table.set_column(table.schema.get_field_index(name),
                                                                                 name, col)
    pq.write_table(table, path)


@pytest.mark.parametrize("case, fault", [
    ("nan", r"part-00001.parquet: non-finite edge feature value \(NaN or inf\) at row 7"),
    ("width", (r"part-00002.parquet: schema mismatch between edge shards: edge_attr float32\[2\] here but "
               r"edge_attr float32\[3\]")),
    ("dtype", r"part-00000.parquet: column 'edge_attr' has item type double, expected float32 or float16"),
    ("missing", r"part-00001.parquet: schema mismatch between edge shards: no edge_attr here"),
    ("null", r"part-00001.parquet: edge feature row 3 is null"),
])
def test_bad_edge_features_are_one_line(tmp_path: Path, case: str, fault: str) -> None:
    g = _graph()
    raw = _raw(tmp_path, g)
    if case == "nan":
        attr = g["edge_attr"][510:1020].copy()
        attr[7, 1] = np.nan
        _bad_edges(raw, 1, edge_attr=pa.FixedSizeListArray.from_arrays(pa.array(attr.reshape(-1)), D))
    elif case == "width":
        rows = pq.read_metadata(raw / "edges" / "part-00002.parquet").num_rows
        _bad_edges(raw, 2, edge_attr=pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(rows * 2, np.float32)), 2))
    elif case == "dtype":
        _bad_edges(raw, 0, edge_attr=pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(510 * D)), D))
    elif case == "missing":
        _bad_edges(raw, 1, edge_attr=None)
    else:
        attr = pa.FixedSizeListArray.from_arrays(pa.array(g["edge_attr"][510:1020].reshape(-1)), D)
        mask = np.zeros(510, bool)
        mask[3] = True
        _bad_edges(raw, 1, edge_attr=pa.FixedSizeListArray.from_arrays(attr.values, D, mask=pa.array(mask)))
    with pytest.raises(InputError, match=fault) as e:
        run_ingest(raw, tmp_path / "store")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "store").exists()


# ----------------------------------------------------------------------------- link splits

def _pairs(a: np.ndarray) -> set[tuple[int, int]]:
    return set(zip(a[0].tolist(), a[1].tolist()))


@pytest.mark.parametrize("undirected", [False, True])
def test_split_column_keeps_val_and_test_out_of_the_topology(tmp_path: Path, undirected: bool) -> None:
    g = _graph(2)
    # one split per unordered pair, so that no pair is in two splits, even reversed
    u = pair_uniform(np.minimum(g["src"], g["dst"]), np.maximum(g["src"], g["dst"]), 9, 1)
    split = np.where(u < 0.1, "test", np.where(u < 0.25, "val", "train"))
    raw = _raw(tmp_path, g, edge_split=split)
    r = run_ingest(raw, tmp_path / "store", memory_budget="16KiB", shard_rows=100, to_undirected=undirected,
                   link_negatives=7, link_seed=3)
    s = Store(tmp_path / "store")
    train = split == "train"
    src, dst, attr = _reference(g["src"][train], g["dst"][train], g["edge_attr"][train], undirected)
    np.testing.assert_array_equal(s.indices, src)
    np.testing.assert_array_equal(np.repeat(np.arange(N), np.diff(s.indptr)), dst)
    np.testing.assert_array_equal(s.edge_features.read_all(), attr)
    for name in ("train", "val", "test"):
        np.testing.assert_array_equal(s.link_edges(name), np.stack([g["src"][split == name], g["dst"][split == name]]))
    topo = set(zip(s.indices.tolist(), np.repeat(np.arange(N), np.diff(s.indptr)).tolist()))
    held = _pairs(s.link_edges("val")) | _pairs(s.link_edges("test"))
    assert not (held & topo) and not ({(b, a) for a, b in held} & topo if undirected else set())
    for name in ("val", "test"):
        neg = s.link_negatives(name)
        assert neg.shape == (int((split == name).sum()), 7) and neg.dtype == np.int64
        assert neg.min() >= 0 and neg.max() < N
    link = s.manifest["link"]
    assert (link["source"], link["val"], link["test"], link["seed"], link["negatives"], link["undirected"]) == \
        ("column", None, None, 3, 7, undirected)
    assert link["counts"] == r.link_counts == {k: int((split == k).sum()) for k in ("train", "val", "test")}


def test_unknown_split_value_and_split_conflicts_are_refused(tmp_path: Path) -> None:
    g = _graph(3)
    split = np.full(E, "train", dtype=object)
    split[600] = "validation"
    with pytest.raises(InputError, match=r"part-00001.parquet: bad split value 'validation' at row 90; "
                                         r"expected one of train, val, test"):
        run_ingest(_raw(tmp_path, g, edge_split=split), tmp_path / "store")
    # the same pair as a training edge in one file and a validation edge in another
    g["src"][1200], g["dst"][1200] = g["src"][5], g["dst"][5]
    split[600] = "train"
    split[1200] = "val"
    raw = _raw(tmp_path, g, name="raw2", edge_split=split)
    pair = f"{g['src'][5]}->{g['dst'][5]}"
    with pytest.raises(InputError, match=rf"part-00000.parquet: edge {pair} is a train edge at row 5 and a val "
                                         rf"edge at row 180 of .*part-00002.parquet") as e:
        run_ingest(raw, tmp_path / "store")
    assert "\n" not in str(e.value) and not (tmp_path / "store").exists()
    # reversed: a train edge whose reverse is a validation edge leaks only under to_undirected
    g = _graph(3)
    g["src"][1200], g["dst"][1200] = g["dst"][5], g["src"][5]
    raw = _raw(tmp_path, g, name="raw3", edge_split=split)
    run_ingest(raw, tmp_path / "directed")
    with pytest.raises(InputError, match=r"edge \(or its reverse\) .* is a (train|val) edge"):
        run_ingest(raw, tmp_path / "store", to_undirected=True)


def test_random_split_is_seeded_proportional_and_undirected_pairs_stay_together(tmp_path: Path) -> None:
    g = _graph(4)
    del g["edge_attr"]
    g["src"][:200], g["dst"][:200] = g["dst"][200:400], g["src"][200:400]  # 200 pairs given in both directions
    raw = _raw(tmp_path, g)
    kw = {"link_split": (0.1, 0.2), "to_undirected": True, "memory_budget": "16KiB"}
    run_ingest(raw, tmp_path / "a", **kw)
    run_ingest(raw, tmp_path / "b", **kw)
    run_ingest(raw, tmp_path / "c", **{**kw, "link_seed": 1})
    a, b, c = Store(tmp_path / "a"), Store(tmp_path / "b"), Store(tmp_path / "c")
    for name in ("train", "val", "test"):
        np.testing.assert_array_equal(a.link_edges(name), b.link_edges(name))
    np.testing.assert_array_equal(a.link_negatives("test"), b.link_negatives("test"))
    assert not np.array_equal(a.link_edges("val"), c.link_edges("val"))
    counts = a.manifest["link"]["counts"]
    assert sum(counts.values()) == E
    assert abs(counts["val"] - 0.1 * E) < 4 * np.sqrt(0.1 * E) and abs(counts["test"] - 0.2 * E) < 4 * np.sqrt(0.2 * E)
    split_of = {}
    for name in ("train", "val", "test"):
        for u, v in _pairs(a.link_edges(name)):
            split_of.setdefault((min(u, v), max(u, v)), set()).add(name)
    assert all(len(s) == 1 for s in split_of.values())
    topo = set(zip(a.indices.tolist(), np.repeat(np.arange(N), np.diff(a.indptr)).tolist()))
    held = _pairs(a.link_edges("val")) | _pairs(a.link_edges("test"))
    assert not (held & topo) and not ({(v, u) for u, v in held} & topo)
    assert a.manifest["link"]["source"] == "random" and a.manifest["link"]["val"] == 0.1


def test_disjoint_train_ratio_holds_supervision_edges_out_of_message_passing(tmp_path: Path) -> None:
    g = _graph(5)
    raw = _raw(tmp_path, g)
    run_ingest(raw, tmp_path / "store", link_split=(0.1, 0.1), disjoint_train_ratio=0.3, shard_rows=500)
    s = Store(tmp_path / "store")
    counts = s.manifest["link"]["counts"]
    assert s.num_edges + sum(counts.values()) == E
    assert abs(counts["train"] - 0.3 * 0.8 * E) < 4 * np.sqrt(0.24 * E)
    topo = set(zip(s.indices.tolist(), np.repeat(np.arange(N), np.diff(s.indptr)).tolist()))
    assert not (_pairs(s.link_edges("train")) & topo)
    # the edge features follow the message-passing edges
    tags = link_tags(g["src"], g["dst"], None, LinkConfig((0.1, 0.1), 0.3), False)
    mp = tags == 0
    _, _, attr = _reference(g["src"][mp], g["dst"][mp], g["edge_attr"][mp], False)
    np.testing.assert_array_equal(s.edge_features.read_all(), attr)


def test_link_options_are_checked(tmp_path: Path) -> None:
    g = _graph()
    raw = _raw(tmp_path, g)
    with pytest.raises(ConfigError, match="val \\+ test < 1"):
        run_ingest(raw, tmp_path / "s", link_split=(0.6, 0.5))
    with pytest.raises(ConfigError, match="disjoint_train_ratio.*needs a link split"):
        run_ingest(raw, tmp_path / "s", disjoint_train_ratio=0.2)
    with pytest.raises(ConfigError, match="link_negatives"):
        run_ingest(raw, tmp_path / "s", link_split=(0.1, 0.1), link_negatives=0)
    raw2 = _raw(tmp_path, g, name="raw2", edge_split=np.full(E, "train"))
    with pytest.raises(ConfigError, match="link_split.*have a split column"):
        run_ingest(raw2, tmp_path / "s", link_split=(0.1, 0.1))
    r = run_ingest(raw, tmp_path / "s", link_split=(0.1, 0.1))
    assert run_ingest(raw, tmp_path / "s", link_split=(0.1, 0.1)).skipped
    again = run_ingest(raw, tmp_path / "s", link_split=(0.1, 0.1), link_negatives=5)
    assert not again.skipped and r.link_counts == again.link_counts
    assert Store(tmp_path / "s").link_negatives("val").shape[1] == 5


def test_cli_link_options_and_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = _graph()
    raw = _raw(tmp_path, g)
    assert main(["ingest", str(raw), str(tmp_path / "s"), "--link-split", "0.05,0.1", "--link-negatives", "4",
                 "--disjoint-train-ratio", "0.2", "--link-seed", "7", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "edge features" in out and "link split     train" in out
    link = Store(tmp_path / "s").manifest["link"]
    assert (link["val"], link["test"], link["negatives"], link["seed"], link["disjoint_train_ratio"]) == \
        (0.05, 0.1, 4, 7, 0.2)
    for argv, fault in [(["--link-split", "0.5,0.6"], "--link-split: expected shares val, test >= 0"),
                        (["--disjoint-train-ratio", "0.5"], "--disjoint-train-ratio: needs a link split")]:
        assert main(["ingest", str(raw), str(tmp_path / "t"), "--workers", "1", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]  # after the cluster's dashboard lines
        assert err.startswith("diskflow ingest: error: ") and fault in err, err
    with pytest.raises(SystemExit) as e:  # not two numbers: argparse's own message
        main(["ingest", str(raw), str(tmp_path / "t"), "--link-split", "0.5"])
    assert e.value.code == 2
    assert "--link-split: expected two shares VAL,TEST" in capsys.readouterr().err.strip().splitlines()[-1]
    split = np.full(E, "train", dtype=object)
    split[3] = "dev"
    bad = _raw(tmp_path, g, name="bad", edge_split=split)
    assert main(["ingest", str(bad), str(tmp_path / "t"), "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("diskflow ingest: error: ") and "bad split value 'dev' at row 3" in err


# ----------------------------------------------------------------------------- importers

def _data(**over) -> Data:
    rng = np.random.default_rng(0)
    kw = {"x": torch.tensor(rng.random((N, 4), dtype=np.float32)),
          "edge_index": torch.tensor(np.stack([rng.integers(0, N, E), rng.integers(0, N, E)])),
          "edge_attr": torch.tensor(rng.random((E, D)), dtype=torch.float64), **over}
    return Data(**{k: v for k, v in kw.items() if v is not None})


def test_pyg_keeps_edge_attr_and_ingest_stores_it(tmp_path: Path) -> None:
    data = _data()
    raw = from_pyg(data, tmp_path / "raw", chunk_bytes=4096)
    assert len(list((raw / "edges").iterdir())) > 1
    table = pq.read_table(sorted((raw / "edges").iterdir()))
    assert table.schema.field("edge_attr").type == pa.list_(pa.float32(), D)
    np.testing.assert_array_equal(table["edge_attr"].combine_chunks().flatten().to_numpy().reshape(-1, D),
                                  data.edge_attr.numpy().astype(np.float32))
    run_ingest(raw, tmp_path / "store")
    ei = data.edge_index.numpy()
    _, _, attr = _reference(ei[0], ei[1], data.edge_attr.numpy().astype(np.float32), False)
    np.testing.assert_array_equal(Store(tmp_path / "store").edge_features.read_all(), attr)
    # a 1-D edge_attr is one feature per edge
    one = from_pyg(_data(edge_attr=torch.ones(E)), tmp_path / "raw1")
    assert pq.read_schema(next((one / "edges").iterdir())).field("edge_attr").type == pa.list_(pa.float32(), 1)


@pytest.mark.parametrize("over, attr, fault", [
    ({"pos": torch.zeros(N, 3)}, "pos", "is not stored by the raw format"),
    ({"edge_weight": torch.ones(E)}, "edge_weight", "is not stored by the raw format"),
    ({"node_year": torch.zeros(N)}, "node_year", "keeps x, edge_index, edge_attr, y"),
    ({"edge_label_index": torch.zeros(2, 5, dtype=torch.long)}, "edge_label_index", "link-prediction labels"),
    ({"edge_attr": torch.ones(E - 1, D)}, "edge_attr", rf"must be \[E={E}, D\]"),
    ({"edge_attr": torch.full((E, D), float("nan"))}, "edge_attr", "non-finite edge feature value"),
])
def test_pyg_refuses_what_it_cannot_store(tmp_path: Path, over: dict, attr: str, fault: str) -> None:
    with pytest.raises(InputError, match=fault) as e:
        from_pyg(_data(**over), tmp_path / "raw", name="g.pt")
    assert e.value.path == f"g.pt: {attr}" and "\n" not in str(e.value)
    assert not (tmp_path / "raw").exists()


def test_pyg_cli_refuses_pos_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "g.pt"
    torch.save(_data(pos=torch.zeros(N, 3)), f)
    assert main(["import", "pyg", str(f), str(tmp_path / "raw")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{f}: pos: is not stored by the raw format" in err and "\n" not in err


def test_npy_edge_features(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = _graph(6)
    for name, arr in {"x": g["features"], "ei": np.stack([g["src"], g["dst"]]), "ea": g["edge_attr"],
                      "short": g["edge_attr"][:-1]}.items():
        np.save(tmp_path / f"{name}.npy", arr)
    out = from_npy(tmp_path / "raw", features=tmp_path / "x.npy", edge_index=tmp_path / "ei.npy",
                   edge_features=tmp_path / "ea.npy", chunk_bytes=8192)
    run_ingest(out, tmp_path / "store", to_undirected=True)
    _, _, attr = _reference(g["src"], g["dst"], g["edge_attr"], True)
    np.testing.assert_array_equal(Store(tmp_path / "store").edge_features.read_all(), attr)
    assert main(["import", "npy", str(tmp_path / "raw2"), "--features", str(tmp_path / "x.npy"), "--edge-index",
                 str(tmp_path / "ei.npy"), "--edge-features", str(tmp_path / "short.npy")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{tmp_path / 'short.npy'}: edge features must be [E={E}, D]" in err and "\n" not in err
