"""Importers: PyG Data, .npy files and both OGB layouts become exactly the expected raw dataset."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from diskflow.cli import main
from diskflow.operators.ingest.npyimport import from_npy
from diskflow.operators.ingest.ogbimport import from_ogb
from diskflow.operators.ingest.pygimport import from_pyg
from pyarrow import ipc
from torch_geometric.data import Data

from diskflow.errors import ConfigError, InputError

N, DIM = 7, 3
X = (np.arange(N * DIM, dtype=np.float32).reshape(N, DIM) / 4)  # exact in binary and in CSV text
SRC = np.array([0, 1, 2, 3, 4, 5, 6, 0, 2], dtype=np.int64)
DST = np.array([1, 2, 3, 4, 5, 6, 0, 6, 5], dtype=np.int64)
Y = np.array([2, 0, 1, -1, 2, 1, 0], dtype=np.int64)
SPLIT = np.array(["train", "train", "val", "test", "none", "train", "test"])
TRAIN, VAL, TEST = np.array([0, 1, 5]), np.array([2]), np.array([3, 6])


def read_raw(path: Path) -> dict:
    """A raw dataset's content, ordered by node id, plus its manifest."""
    edges = pq.read_table(sorted((path / "edges").glob("part-*.parquet")))
    nodes = pq.read_table(sorted((path / "nodes").glob("part-*.parquet")))
    feats = pa.concat_tables([ipc.open_file(f).read_all() if f.suffix == ".arrow" else pq.read_table(f)
                              for f in sorted((path / "features").glob("part-*"))])
    order = np.argsort(nodes["node_id"].to_numpy())
    forder = np.argsort(feats["node_id"].to_numpy())
    dim = feats.schema.field("x").type.list_size
    return {
        "src": edges["src"].to_numpy(), "dst": edges["dst"].to_numpy(),
        "node_id": nodes["node_id"].to_numpy()[order], "x_id": feats["node_id"].to_numpy()[forder],
        "label": nodes["label"].to_numpy()[order],
        "split": np.asarray(nodes["split"].cast(pa.string()).to_pylist())[order],
        "x": feats["x"].combine_chunks().flatten().to_numpy().reshape(-1, dim)[forder],
        "x_type": feats.schema.field("x").type, "edge_schema": edges.schema,
        "manifest": json.loads((path / "manifest.json").read_text()),
    }


def assert_expected(path: Path, y: np.ndarray = Y, split: np.ndarray = SPLIT, x: np.ndarray = X) -> dict:
    raw = read_raw(path)
    np.testing.assert_array_equal(raw["src"], SRC)
    np.testing.assert_array_equal(raw["dst"], DST)
    assert raw["edge_schema"].equals(pa.schema([("src", pa.int64()), ("dst", pa.int64())]))
    np.testing.assert_array_equal(raw["node_id"], np.arange(N))
    np.testing.assert_array_equal(raw["x_id"], np.arange(N))
    np.testing.assert_array_equal(raw["x"], x)
    assert raw["x_type"] == pa.list_(pa.from_numpy_dtype(x.dtype), DIM)
    np.testing.assert_array_equal(raw["label"], y)
    np.testing.assert_array_equal(raw["split"], split)
    m = raw["manifest"]
    assert (m["format"], m["num_nodes"], m["num_edges"], m["feature_dim"]) == ("diskflow-raw", N, len(SRC), DIM)
    assert m["feature_bytes"] == N * DIM * x.dtype.itemsize
    return raw


# ---------------------------------------------------------------------------- PyG

def pyg_data(**over) -> Data:
    mask = {k: torch.tensor(np.isin(np.arange(N), idx)) for k, idx in
            (("train_mask", TRAIN), ("val_mask", VAL), ("test_mask", TEST))}
    kw = dict(x=torch.tensor(X), edge_index=torch.tensor(np.stack([SRC, DST])), y=torch.tensor(Y), **mask)
    kw.update(over)
    return Data(**{k: v for k, v in kw.items() if v is not None})


def test_pyg_exact(tmp_path: Path) -> None:
    # 40 bytes per chunk: 3 rows (12 B each), 2 edges (16 B) per shard, to check the shards join up
    out = from_pyg(pyg_data(), tmp_path / "raw", chunk_bytes=40)
    assert len(list((out / "features").iterdir())) == 3 and len(list((out / "edges").iterdir())) == 5
    assert_expected(out)


def test_pyg_defaults_and_float16(tmp_path: Path) -> None:
    data = pyg_data(y=None, x=torch.tensor(X).half(), train_mask=None, val_mask=None, test_mask=None)
    out = from_pyg(data, tmp_path / "raw", feature_format="parquet")
    assert_expected(out, y=np.full(N, -1), split=np.full(N, "none"), x=X.astype(np.float16))
    out2 = from_pyg(pyg_data(), tmp_path / "raw2", split_masks=False)
    assert_expected(out2, split=np.full(N, "none"))


def test_pyg_cli_and_file_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "g.pt"
    torch.save(pyg_data(), f)
    assert main(["import", "pyg", str(f), str(tmp_path / "raw")]) == 0
    assert capsys.readouterr().out.startswith(f"import: {N} nodes, {len(SRC)} edges")
    assert_expected(tmp_path / "raw")
    bad = tmp_path / "junk.pt"
    bad.write_bytes(b"not a torch file")
    assert main(["import", "pyg", str(bad), str(tmp_path / "raw2")]) == 2
    assert str(bad) in capsys.readouterr().err
    assert not (tmp_path / "raw2").exists()


@pytest.mark.parametrize("over, where, fault", [
    ({"x": None}, "g.pt", "no node features"),
    ({"edge_index": torch.tensor([[0, 1], [1, 7]])}, "edge_index", r"out of range \[0, 7\)"),
    ({"edge_index": torch.tensor([[0.0, 1.0], [1.0, 2.0]])}, "edge_index", "integer"),
    ({"y": torch.zeros(N, 3)}, "y", "one class per node"),
    ({"y": torch.tensor(Y[:-1])}, "y", "6 labels for 7 nodes"),
    ({"val_mask": torch.ones(N, dtype=torch.bool)}, "val_mask", "also in the train split"),
    ({"test_mask": torch.ones(N)}, "test_mask", "bool"),
])
def test_pyg_malformed(tmp_path: Path, over: dict, where: str, fault: str) -> None:
    with pytest.raises(InputError, match=fault) as e:
        from_pyg(pyg_data(**over), tmp_path / "raw", name="g.pt")
    assert e.value.path.startswith("g.pt") and where in e.value.path
    assert not (tmp_path / "raw").exists()


# ---------------------------------------------------------------------------- .npy

@pytest.fixture()
def npy_dir(tmp_path: Path) -> Path:
    d = tmp_path / "npy"
    d.mkdir()
    for name, arr in {"x": X.astype(np.float64), "ei": np.stack([SRC, DST]), "ei_t": np.stack([SRC, DST], axis=1),
                          "src": SRC.astype(np.int32), "dst": DST.astype(np.int32), "y": Y, "split": SPLIT,
                          "codes": np.array([["train", "val", "test", "none"].index(s) for s in SPLIT]),
                          "train": TRAIN, "val": VAL, "test": TEST}.items():
        np.save(d / f"{name}.npy", arr)
    return d


def test_npy_split_names_and_float64(npy_dir: Path, tmp_path: Path) -> None:
    out = from_npy(tmp_path / "raw", features=npy_dir / "x.npy", edge_index=npy_dir / "ei.npy",
                   labels=npy_dir / "y.npy", split=npy_dir / "split.npy", chunk_bytes=30)
    assert_expected(out)  # float64 features are stored as float32


def test_npy_variants(npy_dir: Path, tmp_path: Path) -> None:
    assert (np.load(npy_dir / "codes.npy") == [0, 0, 1, 2, 3, 0, 2]).all()
    a = from_npy(tmp_path / "a", features=npy_dir / "x.npy", edge_index=npy_dir / "ei_t.npy",
                 labels=npy_dir / "y.npy", split=npy_dir / "codes.npy")
    assert_expected(a)
    b = from_npy(tmp_path / "b", features=npy_dir / "x.npy", src=npy_dir / "src.npy", dst=npy_dir / "dst.npy",
                 labels=npy_dir / "y.npy", train_idx=npy_dir / "train.npy", val_idx=npy_dir / "val.npy",
                 test_idx=npy_dir / "test.npy")
    assert_expected(b)
    c = from_npy(tmp_path / "c", features=npy_dir / "x.npy", edge_index=npy_dir / "ei.npy",
                 train_idx=npy_dir / "train.npy")
    assert_expected(c, y=np.full(N, -1), split=np.where(SPLIT == "train", "train", "none"))


def test_npy_rerun_skips_until_an_input_changes(npy_dir: Path, tmp_path: Path) -> None:
    kw = {"features": npy_dir / "x.npy", "edge_index": npy_dir / "ei.npy", "labels": npy_dir / "y.npy"}
    out = from_npy(tmp_path / "raw", **kw)
    stamp = (out / "manifest.json").stat().st_mtime_ns
    from_npy(out, **kw)
    assert (out / "manifest.json").stat().st_mtime_ns == stamp
    np.save(npy_dir / "y.npy", np.zeros(N, dtype=np.int64))
    from_npy(out, **kw)
    np.testing.assert_array_equal(read_raw(out)["label"], np.zeros(N))


def test_npy_cli(npy_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "raw"
    assert main(["import", "npy", str(out), "--edge-index", str(npy_dir / "ei.npy"), "--features",
                 str(npy_dir / "x.npy"), "--labels", str(npy_dir / "y.npy"), "--train-idx", str(npy_dir / "train.npy"),
                 "--val-idx", str(npy_dir / "val.npy"), "--test-idx", str(npy_dir / "test.npy"),
                 "--format", "parquet", "--chunk", "1KiB"]) == 0
    assert str(out) in capsys.readouterr().out
    assert_expected(out)


@pytest.mark.parametrize("edit, role, fault", [
    (lambda d: np.save(d / "x.npy", X[0]), "x.npy", "2-D"),
    (lambda d: (d / "x.npy").write_bytes(b"garbage"), "x.npy", "not a readable .npy"),
    (lambda d: np.save(d / "x.npy", np.full((N, DIM), "a")), "x.npy", "numeric"),
    (lambda d: np.save(d / "y.npy", Y[:5]), "y.npy", "5 labels"),
    (lambda d: np.save(d / "y.npy", Y - 1), "y.npy", ">= -1"),
    (lambda d: np.save(d / "y.npy", Y + 0.5), "y.npy", "integral"),
    (lambda d: np.save(d / "ei.npy", np.stack([SRC, DST + 3])), "ei.npy", "out of range"),
    (lambda d: np.save(d / "ei.npy", np.stack([SRC, DST, SRC])), "ei.npy", r"\[2, E\]"),
    (lambda d: np.save(d / "split.npy", np.full(N, "dev")), "split.npy", "unknown split name 'dev'"),
    (lambda d: np.save(d / "split.npy", np.full(N, 7)), "split.npy", "0..3"),
])
def test_npy_malformed(npy_dir: Path, tmp_path: Path, edit, role: str, fault: str) -> None:
    edit(npy_dir)
    with pytest.raises(InputError, match=fault) as e:
        from_npy(tmp_path / "raw", features=npy_dir / "x.npy", edge_index=npy_dir / "ei.npy",
                 labels=npy_dir / "y.npy", split=npy_dir / "split.npy")
    assert Path(e.value.path).name == role
    assert not (tmp_path / "raw").exists()


def test_npy_overlapping_and_exclusive_splits(npy_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="also in the train split") as e:
        from_npy(tmp_path / "raw", features=npy_dir / "x.npy", edge_index=npy_dir / "ei.npy",
                 train_idx=npy_dir / "train.npy", test_idx=npy_dir / "train.npy")
    assert e.value.path.endswith("train.npy")
    with pytest.raises(ConfigError, match="^split"):
        from_npy(tmp_path / "raw", features=npy_dir / "x.npy", edge_index=npy_dir / "ei.npy",
                 split=npy_dir / "split.npy", train_idx=npy_dir / "train.npy")
    with pytest.raises(InputError, match="no such file") as e:
        from_npy(tmp_path / "raw", features=npy_dir / "missing.npy", edge_index=npy_dir / "ei.npy")


# ---------------------------------------------------------------------------- OGB

def _gz_lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")


def _ogb_splits(root: Path, name: str = "time") -> None:
    for stem, idx in (("train", TRAIN), ("valid", VAL), ("test", TEST)):
        _gz_lines(root / "split" / name / f"{stem}.csv.gz", [str(i) for i in idx])


@pytest.fixture()
def ogb_csv(tmp_path: Path) -> Path:
    root = tmp_path / "ogbn_tiny"
    raw = root / "raw"
    _gz_lines(raw / "edge.csv.gz", [f"{s},{d}" for s, d in zip(SRC, DST)])
    _gz_lines(raw / "node-feat.csv.gz", [",".join(repr(float(v)) for v in row) for row in X])
    _gz_lines(raw / "node-label.csv.gz", ["nan" if v < 0 else str(v) for v in Y])
    _gz_lines(raw / "num-node-list.csv.gz", [str(N)])
    _gz_lines(raw / "num-edge-list.csv.gz", [str(len(SRC))])
    _ogb_splits(root)
    return root


@pytest.fixture()
def ogb_npz(tmp_path: Path) -> Path:
    root = tmp_path / "ogbn_big"
    (root / "raw").mkdir(parents=True)
    np.savez_compressed(root / "raw" / "data.npz", edge_index=np.stack([SRC, DST]), node_feat=X,
                        num_nodes_list=np.array([N]), num_edges_list=np.array([len(SRC)]))
    np.savez_compressed(root / "raw" / "node-label.npz",
                        node_label=np.where(Y < 0, np.nan, Y).astype(np.float32)[:, None])
    _ogb_splits(root)
    return root


def test_ogb_csv_exact(ogb_csv: Path, tmp_path: Path) -> None:
    raw = assert_expected(from_ogb(ogb_csv, tmp_path / "raw"), split=np.where(SPLIT == "none", "none", SPLIT))
    assert raw["manifest"]["source"]["layout"] == "csv"
    assert "split/time/train.csv.gz" in raw["manifest"]["source"]["inputs"]


def test_ogb_npz_exact(ogb_npz: Path, tmp_path: Path) -> None:
    raw = assert_expected(from_ogb(ogb_npz, tmp_path / "raw", chunk_bytes=32))
    assert raw["manifest"]["source"]["layout"] == "npz"
    assert len(list((tmp_path / "raw" / "edges").iterdir())) == 5  # 2 edges (16 bytes) per chunk


def test_ogb_npz_fortran_edge_index_and_stored_members(tmp_path: Path) -> None:
    root = tmp_path / "ogbn_f"
    (root / "raw").mkdir(parents=True)
    np.savez(root / "raw" / "data.npz", edge_index=np.asfortranarray(np.stack([SRC, DST])), node_feat=X,
             num_nodes_list=np.array([N]), num_edges_list=np.array([len(SRC)]))
    np.savez(root / "raw" / "node-label.npz", node_label=Y)
    assert_expected(from_ogb(root, tmp_path / "raw", chunk_bytes=24), split=np.full(N, "none"))


def test_ogb_cli(ogb_csv: Path, tmp_path: Path) -> None:
    assert main(["import", "ogb", str(ogb_csv), str(tmp_path / "raw"), "--split", "time"]) == 0
    assert_expected(tmp_path / "raw")


def test_ogb_malformed_csv(ogb_csv: Path, tmp_path: Path) -> None:
    out = tmp_path / "raw"
    edge = ogb_csv / "raw" / "edge.csv.gz"
    _gz_lines(edge, ["0,1", "1,x"])
    with pytest.raises(InputError, match="malformed CSV") as e:
        from_ogb(ogb_csv, out)
    assert e.value.path == str(edge)
    _gz_lines(edge, [f"{s},{d}" for s, d in zip(SRC[:-1], DST[:-1])])
    with pytest.raises(InputError, match="8 edges but num-edge-list.csv.gz says 9"):
        from_ogb(ogb_csv, out)
    feat = ogb_csv / "raw" / "node-feat.csv.gz"
    _gz_lines(feat, ["1.0,2.0,3.0"] * (N + 1))
    with pytest.raises(InputError, match="more than 7 rows") as e:
        from_ogb(ogb_csv, out)
    assert e.value.path == str(feat)
    _gz_lines(feat, ["1.0,2.0,3.0"] * 3 + ["1.0,2.0"])
    with pytest.raises(InputError, match="malformed CSV") as e:
        from_ogb(ogb_csv, out)
    assert e.value.path == str(feat)
    _ogb_splits(ogb_csv, "random")
    with pytest.raises(InputError, match="several split folders"):
        from_ogb(ogb_csv, out)
    assert not out.exists()


def test_ogb_malformed_npz(ogb_npz: Path, tmp_path: Path) -> None:
    data = ogb_npz / "raw" / "data.npz"
    np.savez(data, edge_index=np.stack([SRC, DST]), num_nodes_list=np.array([N]), num_edges_list=np.array([9]))
    with pytest.raises(InputError, match="no array 'node_feat'") as e:
        from_ogb(ogb_npz, tmp_path / "raw")
    assert e.value.path == str(data)
    np.savez(data, edge_index=np.stack([SRC, DST]), node_feat=X, num_nodes_list=np.array([N, 2]),
             num_edges_list=np.array([9, 1]))
    with pytest.raises(InputError, match="one"):
        from_ogb(ogb_npz, tmp_path / "raw")
    data.write_bytes(b"PK not really")
    with pytest.raises(InputError, match="not a readable .npz"):
        from_ogb(ogb_npz, tmp_path / "raw")
    with pytest.raises(InputError, match="no raw/"):
        from_ogb(tmp_path, tmp_path / "raw")
    assert not (tmp_path / "raw").exists()
