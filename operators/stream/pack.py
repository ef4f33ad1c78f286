"""Streamed packing: one superbatch at a time, as a bundle of files that can travel to the training machine.

In a streamed run (docs/design.md, "The streamed split-machine run") the round is never packed
as a whole: superbatch k is
sampled, planned and packed on a CPU worker while earlier superbatches train, and reaches the
GPU worker's scratch disk as a `Bundle` — a handful of files, each with its size and crc32:

    round-0/part-PPPPP.bin          shard p's packed segments of the superbatch's batches
                                    (4096-aligned, in batch order, offsets from 0)
    round-0/index/{key}.arrow       every batch's address translation (operators.packed)
    round-0/samples/{key}.arrow     the graph samples
    edges/...                       (a store with edge features) the same files of the edge rows'
                                    one-superbatch packed dataset, planned on their own chain
    manifest.json                   written last by the receiver: a packed dataset holding
                                    exactly this superbatch (global batch numbers)

The tiers travel once, as the base bundle (`pack_base`: GPU-tier rows, the CPU tier at the
stream's start, labels); the receiver links them into every superbatch directory, so each one
is a complete packed dataset that `PackedLoader` reads and `PackedLoader.follow` continues into.

A bundle carries its files inline (``data``: moved by Dask from the worker that packed it, no
shared filesystem needed) or names a directory holding them (``url``: any fsspec URL, e.g. a
shared filesystem). Packing reads each needed row once per superbatch through the shard's memory
map and gathers every segment with `prepare.writers.gather_segment`, the packing step of `pack_shard` too.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InputError
from ..formats.checksum import crc32
from ..formats.hashing import config_hash
from ..formats.npyio import aligned_npy_bytes, npy_bytes
from ..formats.packed import PACKED_FORMAT, PACKED_VERSION, ROUND_DIR, index_name, part_name, samples_name
from ..formats.packedindex import index_bytes
from ..formats.plan import BatchPlan
from ..formats.rowcodec import RowCodec, encode_bytes
from ..formats.samples import read_n_ids
from ..formats.store import Store, open_table
from ..prepare.route import RouteFile, route_superbatch, segment_offsets
from ..prepare.superbatch import SuperbatchRef
from ..prepare.writers import gather_segment

__all__ = ["BASE_FILES", "Bundle", "make_bundle", "nest_bundle", "pack_base", "pack_superbatch", "sample_n_ids",
           "stream_header"]

BASE_FILES = ("gpu_ids.npy", "gpu_cache.npy", "cpu_ids.npy", "cpu_init.npy", "labels.npy")


@dataclass
class Bundle:
    """The files of one staged unit (a superbatch, or the base tiers), each with its size and crc32.

    Attributes:
        key: the superbatch key (``e{e}-s{k:05d}``) or ``"base"``.
        sizes: relative path -> bytes.
        crcs: relative path -> zlib.crc32 of the whole file, computed by the producer.
        manifest: the directory's ``manifest.json`` (written last by the receiver), or None.
        data: relative path -> content (uint8 array), when the files travel inline.
        url: a directory (fsspec URL) holding the files, when they travel through a shared store.
        meta: what the receiver reports along (timings of the tasks that made it, figures).
        nested: subdirectory -> the manifest of a packed dataset held there (the edge rows'), written by
            the receiver before the bundle's own.
    """

    key: str
    sizes: dict[str, int]
    crcs: dict[str, int]
    manifest: dict[str, Any] | None = None
    data: dict[str, np.ndarray] | None = None
    url: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    nested: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes the bundle takes on the receiver's disk (its files; the manifest is not counted)."""
        return int(sum(self.sizes.values()))

    def __sizeof__(self) -> int:
        """Bytes held in memory, the inline files included: what Dask's memory accounting (`dask.sizeof`)
        and its dashboard count for a pack task's result (a URL bundle holds only its bookkeeping)."""
        return object.__sizeof__(self) + sum(a.nbytes for a in (self.data or {}).values())


def _bytes(buf: np.ndarray) -> memoryview:
    """A contiguous array's bytes, without a copy."""
    return np.ascontiguousarray(buf).reshape(-1).view(np.uint8).data


def _crc(buf: np.ndarray | bytes) -> int:
    return crc32(_bytes(buf)) if isinstance(buf, np.ndarray) else crc32(buf)


def make_bundle(key: str, files: dict[str, np.ndarray], manifest: dict[str, Any] | None, url: str | None = None,
                meta: dict[str, Any] | None = None) -> Bundle:
    """A bundle of `files`: inline, or written under `url` (fsspec; each file atomically, temp name -> rename)."""
    files = {rel: np.ascontiguousarray(np.frombuffer(v, np.uint8) if isinstance(v, (bytes, bytearray)) else v)
             for rel, v in files.items()}
    sizes = {rel: int(v.nbytes) for rel, v in files.items()}
    crcs = {rel: _crc(v) for rel, v in files.items()}
    if url is None:
        return Bundle(key, sizes, crcs, manifest, data=files, meta=dict(meta or {}))
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    for rel, v in files.items():
        path = f"{root.rstrip('/')}/{rel}"
        tmp = f"{path}.tmp-{os.getpid()}"
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with fs.open(tmp, "wb") as f:
            f.write(_bytes(v))
        fs.mv(tmp, path)
    return Bundle(key, sizes, crcs, manifest, url=url, meta=dict(meta or {}))


def nest_bundle(outer: Bundle, name: str, inner: Bundle) -> Bundle:
    """`outer` holding `inner`'s files under ``name/`` (its manifest written there by the receiver): a
    superbatch's edge rows travel, are checked and staged with its node rows. Inline files are taken over;
    files at a URL must already be under ``{outer.url}/{name}`` (`inner` packed there)."""
    if (outer.url is None) != (inner.url is None) or (
            inner.url is not None and inner.url.rstrip("/") != f"{str(outer.url).rstrip('/')}/{name}"):
        raise ValueError(f"bundle {inner.key}: its files must travel as {outer.key}'s do, under {name}/")
    def rel(r: str) -> str:
        return f"{name}/{r}"
    outer.sizes.update({rel(r): v for r, v in inner.sizes.items()})
    outer.crcs.update({rel(r): v for r, v in inner.crcs.items()})
    if inner.data is not None and outer.data is not None:
        outer.data.update({rel(r): v for r, v in inner.data.items()})
    if inner.manifest is not None:
        outer.nested[name] = inner.manifest
    outer.nested.update({rel(r): m for r, m in inner.nested.items()})
    return outer


def sample_n_ids(data: bytes | np.ndarray, key: str = "") -> list[np.ndarray]:
    """The `n_id` arrays of a superbatch's samples given as Arrow IPC file bytes (zero-copy)."""
    return read_n_ids(f"samples of {key or 'a superbatch'}", data)


# ---------------------------------------------------------------------------- the shared header

def stream_header(store: Store, config: dict[str, Any], gpu_rows: int, cpu_rows: int, round_batches: int,
                  epochs: int, codec: RowCodec | None = None) -> dict[str, Any]:
    """The manifest fields every superbatch directory of a streamed run shares (the round's shape); `codec`: its
    rows are encoded (raw bytes of `codec.row_bytes`)."""
    table = store.table_of       # a table of rows alone (the edge rows'): no graph, no labels
    rows = {} if codec is None else {"dtype": "uint8", "dim": codec.row_bytes, "row_bytes": codec.row_bytes,
                                     "rows": codec.to_manifest()}
    return {
        "format": PACKED_FORMAT, "version": PACKED_VERSION, "pipeline": "streaming",
        "config": {**config, "packing": True}, "config_hash": config_hash(config),
        "store": {"path": str(store.path.resolve()), "manifest_hash": config_hash(store.manifest),
                  **({"table": table["table"]} if table is not None else {})},
        "dtype": store.feature_dtype.name, "dim": store.feature_dim, "row_bytes": store.row_bytes,
        "num_nodes": store.num_nodes, "num_shards": len(store.shards), "shard_rows": store.shard_rows,
        "num_classes": store.num_classes, "labels": "labels.npy",
        **({"hetero": store.manifest["hetero"]} if store.manifest.get("hetero") else {}),
        "tiers": {"gpu_rows": int(gpu_rows), "cpu_rows": int(cpu_rows), "cpu_policy": config.get("cpu_policy")},
        "round": {"epochs": int(epochs), "batches": int(round_batches)},
        **rows,
    }


# ---------------------------------------------------------------------------- packing

def _local(store: Store, p: int, ids: np.ndarray) -> np.ndarray:
    """Rows `ids` (all in shard p) as row numbers within the shard, range-checked."""
    shard = store.shards[p]
    local = ids - shard.row_start
    if local.size and (local.min() < 0 or local.max() >= shard.rows):
        raise InputError(shard.path, f"packed node id outside rows [{shard.row_start}, {shard.row_stop})")
    return local


def pack_superbatch(store_path: str | os.PathLike[str], ref: SuperbatchRef, samples: bytes | np.ndarray,
                    plans: Sequence[BatchPlan], header: dict[str, Any], *, final_cache: np.ndarray | None = None,
                    stream_index: int | None = None, url: str | None = None,
                    tmp_dir: str | os.PathLike[str] | None = None,
                    global_batches: Sequence[int] | None = None, codec: RowCodec | None = None) -> Bundle:
    """Route and pack one superbatch into a bundle holding a one-superbatch packed dataset.

    Args:
        store_path: the ingested store (a path the packing worker can read), or one of its row tables
            (`formats.store.table_locator`).
        ref: the superbatch (its global first batch numbers the index records).
        samples: its samples as Arrow IPC file bytes (`superbatch.sample_superbatch_bytes`).
        plans: one `BatchPlan` per batch (GPU slot / CPU slot / miss, CPU inserts).
        header: the run's shared manifest fields (`stream_header`).
        final_cache: the plan's CPU tier after the superbatch; its crc lets the trainer check
            that the tier it carries is the one planned.
        stream_index: position of the superbatch in the stream (recorded in the manifest).
        url: write the files under this fsspec directory instead of carrying them inline.
        tmp_dir: where the routing scratch file goes (default: the system's temp dir).
        global_batches: the batches' numbers in the merged stream of several GPU workers that share
            one CPU tier (``--cache shared``: the order in which they take turns at it).
        codec: pack the rows encoded (`rowcodec.encode_bytes`, each shard's needed rows encoded once).

    Returns:
        The bundle; ``meta["figures"]`` holds packed rows and bytes, the store bytes gathered, and the hits per
        tier.
    """
    store = open_table(store_path)
    n_ids = sample_n_ids(samples, ref.key)
    if len(n_ids) != ref.num_batches:
        raise InputError(f"samples of {ref.key}", f"{len(n_ids)} batches, the round layout says {ref.num_batches}")
    P, rb = len(store.shards), store.row_bytes if codec is None else codec.row_bytes
    with tempfile.TemporaryDirectory(prefix="diskflow-pack-", dir=tmp_dir) as d:
        routed = route_superbatch(ref.key, n_ids, plans, None, ref.round_first_batch, store.shard_rows, P,
                                  Path(d) / "route.npz", epoch=ref.epoch)
        route = RouteFile(routed["path"])
        try:
            seg_rows = np.asarray(route.seg_rows, np.int64)
            offsets, part_bytes = segment_offsets(seg_rows, rb)
            crc = np.zeros(seg_rows.shape, np.int64)
            files: dict[str, np.ndarray] = {}
            for p in range(P):
                buf = np.zeros(int(part_bytes[p]), np.uint8)
                if buf.size:
                    local, feats = _local(store, p, route.shard_ids(p)), store.shard_array(p)
                    if codec is not None:     # the shard's rows this superbatch packs, encoded, in segment order
                        feats = encode_bytes(codec, feats[local], str(store.shards[p].path))
                        local = np.arange(local.shape[0], dtype=np.int64)
                    ends = np.cumsum(seg_rows[:, p])
                    for j in np.flatnonzero(seg_rows[:, p]):     # one gather per (batch, shard) segment
                        n = int(seg_rows[j, p])
                        crc[j, p] = gather_segment(buf[offsets[j, p]:offsets[j, p] + n * rb], feats,
                                                   local[ends[j] - n:ends[j]])
                files[f"{ROUND_DIR}/{part_name(p)}"] = buf
            index = index_bytes(route.records(offsets, crc),
                                {"key": ref.key, "epoch": ref.epoch, "first_batch": ref.round_first_batch})
            files[f"{ROUND_DIR}/{index_name(ref.key)}"] = np.frombuffer(index, np.uint8)
        finally:
            route.close()
    files[f"{ROUND_DIR}/{samples_name(ref.key)}"] = np.frombuffer(samples, np.uint8)
    max_rows = max((int(n.shape[0]) for n in n_ids), default=0)
    manifest = {
        **header,
        "round": {**header["round"], "max_batch_rows": max_rows,
                  "superbatches": [{"key": ref.key, "epoch": ref.epoch, "index": ref.index,
                                    "batches": ref.num_batches, "first_batch": ref.round_first_batch}]},
        "files": {"parts": [{"path": f"{ROUND_DIR}/{part_name(p)}", "bytes": int(part_bytes[p])} for p in range(P)],
                  "dcache": []},
        "stream": {"key": ref.key, "index": stream_index,
                   "cpu_ids_crc": None if final_cache is None else _crc(np.ascontiguousarray(final_cache, np.int64)),
                   **({"global_batches": [int(g) for g in global_batches]} if global_batches is not None else {})},
    }
    figures = {"packed_rows": int(seg_rows.sum()), "packed_bytes": int(part_bytes.sum()),
               "store_read_bytes": int(seg_rows.sum()) * store.row_bytes,    # the rows gathered, as the store holds them
               "gpu_hits": int(routed["gpu_hits"]), "cpu_hits": int(routed["cpu_hits"]),
               "max_batch_rows": max_rows, "batches": ref.num_batches}
    manifest["figures"] = figures
    return make_bundle(ref.key, files, manifest, url, {"figures": figures})


def pack_base(store_path: str | os.PathLike[str], gpu_ids: np.ndarray, cpu_ids: np.ndarray, *,
              url: str | None = None, cpu_rows: bool = True, codec: RowCodec | None = None) -> Bundle:
    """The base bundle: GPU-tier rows, the CPU tier at the stream's start (-1: empty slot), labels (none for a
    row table, `formats.store.table_locator`).

    Built in memory: the files travel as bytes (or are written once under `url`).

    `cpu_ids` is the CPU tier where the stream starts: the round-start tier, or on resume the
    tier a checkpoint saved (its rows are the store's rows of those ids, re-read here).
    `cpu_rows` False: the tier's ids only, its rows left out (``cpu_init.npy`` holds none): a GPU
    worker whose CPU tier another worker fills (``--cache shared``, ranks but 0). `codec`: the rows encoded.
    """
    store = open_table(store_path)
    files: dict[str, np.ndarray] = {}
    width, dtype = (store.feature_dim, store.feature_dtype) if codec is None else (codec.row_bytes, np.dtype(np.uint8))
    for ids_name, rows_name, ids in (("gpu_ids.npy", "gpu_cache.npy", gpu_ids), ("cpu_ids.npy", "cpu_init.npy", cpu_ids)):
        ids = np.asarray(ids, np.int64)
        if rows_name == "cpu_init.npy" and not cpu_rows:
            files[ids_name] = npy_bytes(ids)
            files[rows_name] = aligned_npy_bytes(np.zeros((0, width), dtype))
            continue
        rows = np.zeros((ids.shape[0], width), dtype)
        held = np.flatnonzero(ids >= 0)
        if held.size:
            got = store.gather(ids[held])
            rows[held] = got if codec is None else encode_bytes(codec, got, f"{store.path} rows")
        files[ids_name], files[rows_name] = npy_bytes(ids), aligned_npy_bytes(rows)
    if store.table_of is None:
        files["labels.npy"] = npy_bytes(np.asarray(store.labels, dtype=np.int64))
    return make_bundle("base", files, None, url, {"figures": {"gpu_rows": int(gpu_ids.shape[0]),
                                                              "cpu_rows": int(cpu_ids.shape[0])}})
