"""The store's checksums: recorded by ingest as it writes, checked by `verify STORE`, prepare and `verify --full`."""
from __future__ import annotations

import json
import os
import shutil
import zlib
from pathlib import Path

import dask
import numpy as np
import pytest
from diskflow.cli import main
from diskflow.flow.ingest import run_ingest
from diskflow.operators.formats import storecheck
from diskflow.operators.formats.store import SPLITS, Store
from diskflow.operators.formats.storecheck import CHECKSUMS, crc_pieces, merge_blocks
from diskflow.operators.ingest.raw import write_raw_dataset

import diskflow.datasets
from diskflow.errors import InputError

SMALL = {"fanouts": (4, 4), "batch_size": 256, "superbatch_size": 4, "epochs": 1, "seed": 2, "cpu_memory": "6MiB"}
BLOCK = 8192        # small blocks, so that every file has several


@pytest.fixture(autouse=True)
def _sync() -> object:
    with dask.config.set(scheduler="sync"):
        yield


# ----------------------------------------------------------------------------- pieces into blocks

def test_pieces_written_out_of_order_merge_into_zlibs_block_crcs() -> None:
    rng = np.random.default_rng(0)
    size = 5 * BLOCK + 123
    data = np.zeros(size, np.uint8)
    pieces = []
    cuts = np.sort(rng.choice(np.arange(1, size - 64), 9, replace=False))
    spans = list(zip([64, *cuts.tolist()], [*cuts.tolist(), size]))       # bytes 0..64 never written: zeros
    for a, b in [spans[i] for i in rng.permutation(len(spans))]:
        chunk = rng.integers(0, 256, b - a, dtype=np.uint8)
        data[a:b] = chunk
        pieces += crc_pieces(a, chunk, BLOCK)
    a, b = spans[2]                                                       # a range written twice: the later wins
    data[a:b] = rng.integers(0, 256, b - a, dtype=np.uint8)
    pieces += crc_pieces(a, data[a:b], BLOCK)
    want = [zlib.crc32(data[k:k + BLOCK].tobytes()) for k in range(0, size, BLOCK)]
    assert merge_blocks(pieces, size, BLOCK) == want


# ----------------------------------------------------------------------------- a store and its faults

@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A store of several blocks a file (feature shards of 1000 rows) and a packed dataset built from it."""
    tmp = tmp_path_factory.mktemp("storecheck")
    rng = np.random.default_rng(1)
    n, e, dim = 3001, 30011, 16
    raw = write_raw_dataset(tmp / "raw", src=rng.integers(0, n, e), dst=rng.integers(0, n, e),
                            features=rng.standard_normal((n, dim)).astype(np.float32), labels=rng.integers(0, 4, n),
                            splits=rng.choice(list(SPLITS[:3]), n), edge_parts=2, feature_parts=3)
    mp = pytest.MonkeyPatch()
    mp.setattr(storecheck, "BLOCK_BYTES", BLOCK)
    with dask.config.set(scheduler="sync"):
        run_ingest(raw, tmp / "store", shard_rows=1000)
    mp.undo()
    diskflow.prepare(tmp / "store", tmp / "packed", "belady", **SMALL)
    return tmp / "store", tmp / "packed"


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x04
    path.write_bytes(bytes(data))


# (file, byte flipped): every kind of store file, each in a block past its first
FAULTS = [("features/part-00001.npy", 4096 + 2 * BLOCK + 37), ("indptr.npy", BLOCK + 11),
          ("indices.npy", 4096 + 5 * BLOCK + 2), ("labels.npy", 2 * BLOCK + 3), ("splits.npy", 200)]


@pytest.mark.parametrize(("rel", "offset"), FAULTS, ids=[f for f, _ in FAULTS])
def test_one_flipped_bit_fails_verify_prepare_and_verify_full(built: tuple[Path, Path], rel: str, offset: int,
                                                             tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store, packed = built
    assert main(["verify", str(store)]) == 0
    bad = tmp_path / "store"
    shutil.copytree(store, bad)
    _flip(bad / rel, offset)
    block = offset // BLOCK
    capsys.readouterr()

    assert main(["verify", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad / rel) in err and f"checksum mismatch in block {block} " in err, err

    with pytest.raises(InputError, match=f"checksum mismatch in block {block} .*read by") as e:
        diskflow.prepare(bad, tmp_path / "packed", "belady", **SMALL)
    assert e.value.path == str(bad / rel)

    assert main(["verify", str(packed), "--full", "--store", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad / rel) in err and f"checksum mismatch in block {block} " in err, err

    if rel.startswith("features/"):     # --no-crc: the reads are not checked (prepare packs the flipped bit)
        diskflow.prepare(bad, tmp_path / "unchecked", "belady", check_crc=False, **SMALL)


def test_store_files_all_have_checksums_and_verify_counts_them(built: tuple[Path, Path]) -> None:
    store, _ = built
    manifest = json.loads((store / "manifest.json").read_text())
    files = manifest[CHECKSUMS]["files"]
    on_disk = {p.relative_to(store).as_posix() for p in store.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(files) == on_disk
    assert all(len(f["blocks"]) == -(-f["bytes"] // BLOCK) for f in files.values())
    out = diskflow.datasets.verify(store)
    assert out["checked"] and out["files"] == len(files)


def test_a_store_written_before_checksums_still_works_and_says_so(built: tuple[Path, Path], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    store, _ = built
    old = tmp_path / "old"
    shutil.copytree(store, old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest[CHECKSUMS]
    (old / "manifest.json").write_text(json.dumps(manifest))
    assert main(["verify", str(old)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "cannot be checked" in out[0] and "diskflow ingest" in out[0]
    assert not Store(old).has_checksums
    r = diskflow.prepare(old, tmp_path / "packed", "belady", **SMALL)
    assert r.path.is_dir()
    assert main(["verify", str(r.path), "--full"]) == 0
    assert "cannot be checked" in capsys.readouterr().out
    np.testing.assert_array_equal(Store(old).read_features(), Store(store).read_features())
    report = diskflow.train(old, "sage", pipeline="inmemory", epochs=1, run_dir=tmp_path / "run", fanouts=(3, 3))
    assert report["epochs"]


def test_reads_check_only_the_blocks_they_touch(built: tuple[Path, Path], tmp_path: Path) -> None:
    store, _ = built
    bad = tmp_path / "store"
    shutil.copytree(store, bad)
    st = Store(bad)
    shard = st.shards[1]
    _flip(shard.path, 4096 + 2 * BLOCK + 37)                  # a row in block 2 of shard 1
    far = shard.row_start + 10                                # a row in block 0
    st.gather(np.array([far]))
    row = (2 * BLOCK + 37) // st.row_bytes
    with pytest.raises(InputError, match="block 2 "):
        st.gather(np.array([shard.row_start + row]))
    os.environ.pop(storecheck.ENV, None)
    assert Store(bad, check_crc=False).gather(np.array([shard.row_start + row])).shape == (1, st.feature_dim)


# ----------------------------------------------------------------------------- edge features and link arrays

EDGE_DIM = 6


@pytest.fixture(scope="module")
def edge_stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two stores with edge features: ``link`` with a random link split under to_undirected (CSC compacted,
    negatives), ``plain`` without (ordinals in place). Ingest may not read a file back to checksum it: every
    writer reports what it wrote."""
    tmp = tmp_path_factory.mktemp("storecheck-edges")
    rng = np.random.default_rng(5)
    n, e = 2001, 20011
    raw = write_raw_dataset(tmp / "raw", src=rng.integers(0, n, e), dst=rng.integers(0, n, e),
                            features=rng.standard_normal((n, 8)).astype(np.float32), labels=rng.integers(0, 3, n),
                            splits=rng.choice(list(SPLITS[:3]), n),
                            edge_attr=rng.standard_normal((e, EDGE_DIM)).astype(np.float32), edge_parts=2)

    def read_back(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"ingest read a store file back to checksum it: {args[0]}")

    mp = pytest.MonkeyPatch()
    mp.setattr(storecheck, "BLOCK_BYTES", BLOCK)
    mp.setattr(storecheck, "_read_blocks", read_back)
    with dask.config.set(scheduler="sync"):
        run_ingest(raw, tmp / "link", shard_rows=1000, to_undirected=True, link_split=(0.05, 0.1), link_negatives=20)
        run_ingest(raw, tmp / "plain", shard_rows=1000)
    mp.undo()
    return {"link": tmp / "link", "plain": tmp / "plain"}


@pytest.mark.parametrize("kind", ["link", "plain"])
def test_edge_feature_shards_and_link_arrays_have_their_checksums(edge_stores: dict[str, Path], kind: str) -> None:
    store = edge_stores[kind]
    files = json.loads((store / "manifest.json").read_text())[CHECKSUMS]["files"]
    on_disk = {p.relative_to(store).as_posix() for p in store.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(files) == on_disk
    assert any(f.startswith("edge_features/") for f in files)
    assert {f for f in files if f.startswith("link/")} == (
        {f"link/{s}.npy" for s in ("train", "val", "test", "val_neg", "test_neg")} if kind == "link" else set())
    assert diskflow.datasets.verify(store)["checked"]
    st = Store(store)
    assert st.edge_features is not None
    st.edge_features.read_all()                 # the recorded crcs are those of the bytes on disk
    if kind == "link":
        st.link_edges("train")
        st.link_negatives("val")


# (file, byte flipped, what reads it: a callable of the store that raises): each in a block past its first
_ROW = (2 * BLOCK + 5) // (EDGE_DIM * 4)
EDGE_FAULTS = [
    ("edge_features/part-00000.npy", 4096 + 2 * BLOCK + 5, "a gather of edge features",
     lambda st: st.edge_features.gather(np.array([_ROW]))),
    ("edge_features/part-00001.npy", 4096 + BLOCK + 1, "loading the edge features",
     lambda st: st.edge_features.read_all()),
    ("link/train.npy", 3 * BLOCK + 9, "loading it", lambda st: st.link_edges("train")),
    ("link/val_neg.npy", BLOCK + 17, "loading it", lambda st: st.link_negatives("val")),
]


@pytest.mark.parametrize(("rel", "offset", "reader", "read"), EDGE_FAULTS, ids=[f[0] for f in EDGE_FAULTS])
def test_a_flipped_bit_in_edge_features_or_link_arrays_fails_verify_and_the_reader(
        edge_stores: dict[str, Path], rel: str, offset: int, reader: str, read: object, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "store"
    shutil.copytree(edge_stores["link"], bad)
    _flip(bad / rel, offset)
    block = offset // BLOCK
    capsys.readouterr()
    assert main(["verify", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad / rel) in err and f"checksum mismatch in block {block} " in err, err
    assert callable(read)
    with pytest.raises(InputError, match=f"checksum mismatch in block {block} .*read by {reader}") as e:
        read(Store(bad))
    assert e.value.path == str(bad / rel)
    read(Store(bad, check_crc=False))           # checks off: the flipped bit is read as it is


def test_training_and_verify_full_check_the_edge_features(edge_stores: dict[str, Path], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    store = edge_stores["plain"]
    packed = diskflow.prepare(store, tmp_path / "packed", "belady", **SMALL).path
    bad = tmp_path / "bad"
    shutil.copytree(store, bad)
    rel, offset = "edge_features/part-00002.npy", 4096 + BLOCK + 3
    _flip(bad / rel, offset)
    capsys.readouterr()
    assert main(["verify", str(packed), "--full", "--store", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad / rel) in err and "checksum mismatch in block 1 " in err, err
    # prepare packs the edge rows too, through a view of the store (`Store.edge_table`) that checks them
    with pytest.raises(InputError, match="checksum mismatch in block 1 .*read by prepare's pack pass") as e:
        diskflow.prepare(bad, tmp_path / "packed-bad", "belady", **SMALL)
    assert e.value.path == str((bad / rel).resolve())
    diskflow.prepare(bad, tmp_path / "packed-unchecked", "belady", check_crc=False, **SMALL)
    with pytest.raises(InputError, match="checksum mismatch in block 1 .*read by loading the edge features") as e:
        diskflow.train(bad, "gat", pipeline="inmemory", run_dir=tmp_path / "run", epochs=1, fanouts=(3, 3),
                       hidden=8, heads=2)
    assert e.value.path == str(bad / rel)
    report = diskflow.train(bad, "gat", pipeline="inmemory", run_dir=tmp_path / "unchecked", epochs=1,
                            fanouts=(3, 3), hidden=8, heads=2, check_crc=False)
    assert report["epochs"]
