"""Byte offsets past 4 GiB: a store and packed files whose rows lie beyond 2**32 bytes, bit-exact.

Node ids and index addresses are int32 (they fit), so an offset computed as ``ids * row_bytes``
without promoting to int64 wraps. Nothing here writes 4 GiB: the store's feature shards are
sparse files (``truncate`` to size) in which only the rows the graph can reach are written, and
the packed files are moved past 4 GiB by prefixing a hole.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pyarrow as pa
import pytest
import torch
from diskflow.flow.rundir import new_run_dir
from diskflow.operators.formats.manifest import write_manifest
from diskflow.operators.formats.npyio import create_aligned_npy, save_aligned_npy
from diskflow.operators.formats.packed import ROUND_DIR, PackedDataset
from diskflow.operators.formats.packedindex import IndexRecord, read_index_file, write_index_file
from diskflow.operators.formats.store import SPLITS, Store
from diskflow.operators.formats.verify import verify
from diskflow.operators.ingest.raw import store_manifest
from diskflow.operators.train.loader import PackedLoader
from diskflow.pipelines import belady, diskgnn, ginex, mmap

GIB4 = 1 << 32
CPU_MEMORY = 28 << 20  # staging (4 pieces of the largest batch) + I/O buffers + a CPU tier of a few MiB
N = 1_200_000           # nodes; with 4124-byte rows the features span 4.95e9 bytes
DIM = 1031              # an odd width: rows straddle pages
SHARD_ROWS = 131_072    # 10 shards; the last holds rows past byte 2**32 of the feature matrix
LOW, HIGH = 700, 1500   # the reachable nodes: ids [0, LOW) and [N - HIGH, N)
SETTINGS: dict[str, Any] = {"model": "sage", "hidden": 8, "fanouts": (4, 3), "batch_size": 128, "epochs": 1,
                            "lr": 0.01, "dropout": 0.0, "seed": 3, "threads": 1, "progress": False}


def features_of(ids: np.ndarray) -> np.ndarray:
    """The feature rows the store holds, as a function of the node id (x[v, 0] == v)."""
    ids = np.asarray(ids, np.int64)
    cols = np.arange(DIM, dtype=np.int64)
    x = ((ids[:, None] * 7919 + cols[None, :] * 104729) % 65521).astype(np.float32) / 65521
    x[:, 0] = ids
    return x


@pytest.fixture(scope="module")
def sparse_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4.95 GB store (as its file sizes say) of which only the reachable rows are written."""
    out = tmp_path_factory.mktemp("sparse") / "store"
    (out / "features").mkdir(parents=True)
    rng = np.random.default_rng(11)
    active = np.r_[np.arange(LOW), np.arange(N - HIGH, N)].astype(np.int64)
    dst = np.repeat(active, 6)
    src = active[rng.integers(0, active.size, dst.size)]
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(N + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=N), out=indptr[1:])
    save_aligned_npy(out / "indptr.npy", indptr)
    save_aligned_npy(out / "indices.npy", src[order].astype(np.int32))
    labels = np.full(N, -1, np.int64)
    labels[active] = active % 5
    splits = np.full(N, SPLITS.index("none"), np.uint8)
    splits[active] = rng.choice([0, 0, 0, 1, 2], active.size).astype(np.uint8)
    save_aligned_npy(out / "labels.npy", labels)
    save_aligned_npy(out / "splits.npy", splits)
    shards = []
    for p, lo in enumerate(range(0, N, SHARD_ROWS)):
        hi = min(N, lo + SHARD_ROWS)
        mm = create_aligned_npy(out / "features" / f"part-{p:05d}.npy", np.float32, (hi - lo, DIM), reserve=False)
        mine = active[(active >= lo) & (active < hi)]
        if mine.size:
            mm[mine - lo] = features_of(mine)
            mm.flush()
        del mm
        shards.append({"path": f"features/part-{p:05d}.npy", "row_start": lo, "rows": hi - lo, "offset": 4096,
                       "nbytes": (hi - lo) * DIM * 4})
    counts = {name: int((splits[active] == i).sum()) for i, name in enumerate(SPLITS)}
    counts["none"] += N - active.size
    nodes = {"num_classes": 5, "split_counts": counts}
    features = {"dtype": "float32", "dim": DIM, "row_bytes": DIM * 4, "shard_rows": SHARD_ROWS,
                "arrow_type": f"fixed_size_list<item: float>[{DIM}]", "shards": shards}
    write_manifest(out, store_manifest(num_nodes=N, num_edges=int(dst.size), indices_dtype="int32", nodes=nodes,
                                       features=features, inputs={}, config={"sparse-test": True}))
    return out


def test_the_store_really_reaches_past_4gib(sparse_store: Path) -> None:
    st = Store(sparse_store)
    assert st.feature_bytes > GIB4 and st.row_bytes * (N - 1) > GIB4
    assert sum(os.stat(s.path).st_blocks * 512 for s in st.shards) < 64 << 20      # sparse: written rows only
    assert np.array_equal(st.gather(np.array([N - 1, 3, N - HIGH])), features_of(np.array([N - 1, 3, N - HIGH])))


@pytest.fixture(scope="module")
def prepared(sparse_store: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each packed pipeline prepared over the sparse store, with a CPU tier too small for every row."""
    root = tmp_path_factory.mktemp("packed")
    out = {}
    with dask.config.set(scheduler="sync"):
        for mod in (belady, diskgnn, ginex):
            out[mod.NAME] = root / mod.NAME
            mod.prepare(sparse_store, out[mod.NAME], fanouts=SETTINGS["fanouts"], batch_size=SETTINGS["batch_size"],
                        epochs=SETTINGS["epochs"], seed=SETTINGS["seed"], superbatch_size=3, readahead=0,
                        cpu_memory=CPU_MEMORY, quiet=True)
    return out


def _loader_is_exact(packed: Path, **kw: Any) -> int:
    """Every batch PackedLoader assembles equals features[n_id]; returns the batches seen."""
    seen = 0
    with PackedLoader(packed, **kw) as loader:
        for batch in loader:
            assert torch.equal(batch.x, torch.from_numpy(features_of(batch.n_id.numpy())))
            seen += 1
    return seen


@pytest.mark.parametrize("name", ["belady", "diskgnn", "ginex"])
def test_prepare_verify_and_load_past_4gib(prepared: dict[str, Path], name: str) -> None:
    packed = prepared[name]
    figures = json.loads((packed / "manifest.json").read_text())
    high = N - HIGH
    misses = 0
    for sb in PackedDataset(packed).superbatches:
        for rec in PackedDataset(packed).index(sb.key):
            misses += int((rec.src >= 2).sum())
    assert misses > 0, "the CPU tier holds everything: nothing is read from disk"
    assert verify(packed, full=True)["compared_batches"] == figures["round"]["batches"]
    assert _loader_is_exact(packed) == figures["round"]["batches"]
    assert _loader_is_exact(packed, pipelined=False) == figures["round"]["batches"]
    assert high * DIM * 4 > GIB4


def _shift_packed(src: Path, dst: Path, shift: int) -> None:
    """A copy of packed dataset `src` whose part files hold their segments `shift` bytes later."""
    import shutil

    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    for part in manifest["files"]["parts"]:
        path = dst / part["path"]
        data = path.read_bytes()
        with open(path, "wb") as f:
            f.truncate(shift + len(data))
            f.seek(shift)
            f.write(data)
        part["bytes"] = int(part["bytes"]) + shift
    for index in sorted((dst / ROUND_DIR / "index").glob("*.arrow")):
        records = read_index_file(index)
        moved = [IndexRecord(**{**r.__dict__, "seg_offset": r.seg_offset + shift}) for r in records]
        meta = pa.ipc.open_file(str(index)).schema.metadata or {}
        write_index_file(index, moved, {k.decode(): v.decode() for k, v in meta.items()})
    (dst / "manifest.json").write_text(json.dumps(manifest))


def test_packed_segments_past_4gib_load_bit_exact(prepared: dict[str, Path], tmp_path: Path) -> None:
    moved = tmp_path / "moved"
    _shift_packed(prepared["belady"], moved, GIB4 + 8192)
    ds = PackedDataset(moved)
    offsets = np.concatenate([r.seg_offset for sb in ds.superbatches for r in ds.index(sb.key)])
    assert offsets.min() > GIB4
    assert verify(moved, full=True)["compared_batches"] > 0
    n = json.loads((moved / "manifest.json").read_text())["round"]["batches"]
    assert _loader_is_exact(moved) == n
    assert _loader_is_exact(moved, queue_depth=1) == n


def test_every_pipeline_trains_the_same_past_4gib(sparse_store: Path, prepared: dict[str, Path],
                                                  tmp_path: Path) -> None:
    torch.set_num_threads(1)
    losses = {}
    with dask.config.set(scheduler="sync"):
        for mod in (belady, diskgnn, ginex):
            rep = mod.run(sparse_store, new_run_dir(tmp_path, mod.NAME), cpu_memory=CPU_MEMORY, superbatch_size=3,
                          readahead=0, **SETTINGS)
            losses[mod.NAME] = [e["losses"] for e in rep["epochs"]]
        rep = mmap.run(sparse_store, new_run_dir(tmp_path, "mmap"), **SETTINGS)
        losses["mmap"] = [e["losses"] for e in rep["epochs"]]
    assert losses["belady"] == losses["diskgnn"] == losses["ginex"] == losses["mmap"], losses


def test_the_streamed_run_ships_and_trains_past_4gib(sparse_store: Path, tmp_path: Path) -> None:
    """Ship and train on an embedded cluster: the same losses as prepare-then-train over the same store."""
    from diskflow.pipelines import streaming

    pytest.importorskip("distributed")
    torch.set_num_threads(1)
    settings = dict(SETTINGS, superbatch_size=3)
    settings.pop("progress")
    with dask.config.set(scheduler="sync"):
        ref = belady.run(sparse_store, new_run_dir(tmp_path, "ref"), progress=False, readahead=0,
                         cpu_memory=CPU_MEMORY, **settings)
    rep = streaming.run(sparse_store, new_run_dir(tmp_path, "stream"), window=2, quota="256MiB", workers=1,
                        cpu_memory=CPU_MEMORY,
                        processes=False, progress=False, **settings)
    assert [e["losses"] for e in rep["epochs"]] == [e["losses"] for e in ref["epochs"]]
    assert ref["tiers"]["rows"]["packed"] > 0 and rep["stream"]["trained"] == rep["stream"]["superbatches"] > 0
