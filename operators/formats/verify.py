"""Verify a store against its checksums, or a packed dataset against its store: checksums, file sizes,
and a bit-exact replay.

A store (`verify_store`): every block of every file against the crc32 ingest recorded as it wrote it
(`storecheck`). A packed dataset (`verify`), in order:

0. with ``full=True``, its store first, as above: a packed dataset cannot pass against a corrupt store;
1. every part file has the size the manifest records, every disk-cache file its rows and crc;
2. the whole plan is replayed (the CPU tier's state depends on every earlier batch), which
   reads every packed segment and checks its crc;
3. for a random sample of batches (all with ``full=True``) the assembled rows are compared
   bit for bit with ``features[n_id]`` read from the store; with ``full=True`` the GPU tier,
   the CPU tier's initial rows and every disk-cache row are compared with the store too.

Any mismatch raises `InputError` naming the file, the batch and the shard (or tier).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InputError
from .hashing import config_hash
from .manifest import read_manifest
from .packed import SRC_CPU, SRC_DCACHE, SRC_GPU, SRC_PACKED, PackedDataset, file_crc
from .rowcodec import encode_bytes
from .store import STORE_FORMAT, Store
from .storecheck import UNCHECKED
from .storecheck import verify_store as check_store_files

__all__ = ["open_store", "verify", "verify_store"]

_SOURCE = {SRC_GPU: "GPU tier (gpu_cache.npy)", SRC_CPU: "CPU tier (cpu_init.npy + planned inserts)",
           SRC_PACKED: "packed rows", SRC_DCACHE: "disk cache"}


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-row bitwise equality (NaN payloads included)."""
    if a.shape != b.shape:
        return np.zeros(max(a.shape[0], b.shape[0]), dtype=bool)
    if a.size == 0:
        return np.ones(a.shape[0], dtype=bool)
    return (a.reshape(a.shape[0], -1).view(np.uint8) == b.reshape(b.shape[0], -1).view(np.uint8)).all(axis=1)


def open_store(ds: PackedDataset, store_path: str | os.PathLike[str] | None = None) -> Store:
    """The store a packed dataset was built from, checked against the manifest's record of it."""
    rec = ds.manifest.get("store", {})
    path = Path(store_path) if store_path is not None else Path(rec.get("path", ""))
    if not str(path) or not path.is_dir():
        raise InputError(ds.path / "manifest.json", f"its store {str(path)!r} is not a directory (pass the store path)")
    store = Store(path)
    want = rec.get("manifest_hash")
    if want is not None and want != config_hash(store.manifest):
        raise InputError(path, "the store changed since this dataset was packed (its manifest hash differs); "
                               "re-run `diskflow prepare`")
    if rec.get("table") == "edge_features":     # the edge rows' dataset: rows are the store's edges
        store = store.edge_table()
    codec = ds.codec
    dim, dtype = (ds.dim, ds.dtype) if codec is None else (codec.dim, codec.dtype)
    if store.feature_dim != dim or store.feature_dtype != dtype or store.num_nodes != ds.num_nodes:
        raise InputError(path, f"store holds {store.num_nodes} x {store.feature_dim} {store.feature_dtype}, the "
                               f"packed dataset {ds.num_nodes} x {dim} {dtype}")
    if len(store.shards) != ds.num_shards:
        raise InputError(path, f"store has {len(store.shards)} shards, the packed dataset {ds.num_shards}")
    return store


def _reference(ds: PackedDataset, store: Store) -> Callable[[np.ndarray], np.ndarray]:
    """The rows the dataset must hold for some ids: the store's, encoded as the dataset's are (the encoding is
    deterministic, so an encoded pack is compared bit for bit too)."""
    codec = ds.codec
    if codec is None:
        return store.gather
    return lambda ids: encode_bytes(codec, store.gather(ids), f"{store.path} rows")


def _check_files(ds: PackedDataset, store: Callable[[np.ndarray], np.ndarray]) -> int:
    """Part file sizes and disk-cache crcs; returns the disk-cache bytes checked."""
    for path, want in zip(ds.part_paths, ds.part_bytes):
        try:
            size = path.stat().st_size
        except OSError as e:
            raise InputError(path, f"missing part file ({e.strerror or e})") from e
        if size != want:
            raise InputError(path, f"{'truncated' if size < want else 'oversized'}: {size} bytes, the manifest "
                                   f"records {want}")
    checked = 0
    for g, f in enumerate(ds.dcache_files):
        path, rows = ds.dcache_path(g), int(f["rows"])
        crc = file_crc(path, 0, rows * ds.row_bytes)
        if crc != int(f["crc"]):
            raise InputError(path, f"checksum mismatch in disk-cache segment {g} ({rows} rows)" + _locate(ds, store, g))
        checked += rows * ds.row_bytes
    return checked


def _locate(ds: PackedDataset, store: Callable[[np.ndarray], np.ndarray], g: int) -> str:
    """For a corrupt disk-cache file: which row differs from the store, and the first batch reading it."""
    ids = ds.dcache_ids(g)
    same = _same(np.asarray(ds.dcache_rows(g)), store(ids))
    if same.all():
        return " (rows equal the store's: the recorded crc is wrong)"
    row = int(np.flatnonzero(~same)[0])
    text = f": row {row} (node {int(ids[row])}) differs from the store"
    for _, r in ds.batches():
        if r.dcache == g and bool(((r.src == SRC_DCACHE) & (r.idx == row)).any()):
            return text + f", first read by batch {r.batch}"
    return text


def _explain(ds: PackedDataset, batch: int, src: np.ndarray, idx: np.ndarray, seg_rows: np.ndarray,
             dcache: int, bad: np.ndarray, n_id: np.ndarray) -> InputError:
    """An error naming where the first wrong row of a batch came from."""
    pos = int(bad[0])
    code, at = int(src[pos]), int(idx[pos])
    if code == SRC_PACKED:
        p = int(np.searchsorted(np.cumsum(seg_rows), at, side="right"))
        return InputError(ds.part_paths[p], f"content mismatch in batch {batch}, shard {p}: node {int(n_id[pos])} "
                                           f"(packed row {at}) differs from the store ({bad.size} rows wrong)")
    if code == SRC_DCACHE:
        return InputError(ds.dcache_path(dcache), f"content mismatch in batch {batch}: node {int(n_id[pos])} "
                                                  f"(disk-cache row {at}) differs from the store ({bad.size} rows wrong)")
    where = ds.path / ("gpu_cache.npy" if code == SRC_GPU else "cpu_init.npy")
    return InputError(where, f"content mismatch in batch {batch}: node {int(n_id[pos])} from the {_SOURCE[code]} "
                             f"slot {at} differs from the store ({bad.size} rows wrong)")


def _check_tier_rows(store: Callable[[np.ndarray], np.ndarray], rows: np.ndarray, ids: np.ndarray, path: Path,
                     what: str) -> None:
    live = np.flatnonzero(ids >= 0)
    if not live.size:
        return
    same = _same(np.asarray(rows[live]), store(ids[live]))
    if not same.all():
        k = live[np.flatnonzero(~same)[0]]
        raise InputError(path, f"content mismatch in {what}: row {int(k)} (node {int(ids[k])}) differs from the store")


def verify_store(store_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Check every block of every file of a store against its checksums; raise `InputError` on the first fault.

    Returns:
        ``{"kind": "store", "checked", "files", "bytes", "blocks", "note"}``: ``checked`` is False (and
        ``note`` says why and how to re-ingest) for a store written before stores had checksums.
    """
    store = Store(store_path)
    out = check_store_files(store.path, store.manifest)
    return {"kind": "store", **out, "note": "" if out["checked"] else f"{store.path}: {UNCHECKED}"}


def verify(packed_path: str | os.PathLike[str], *, full: bool = False, sample_batches: int = 16, seed: int = 0,
           store_path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Check a packed dataset end to end, or a store's checksums (`verify_store`, when `packed_path` is a
    store); raise `InputError` on the first fault.

    Args:
        packed_path: the packed dataset (its manifest must exist), or a store.
        full: compare every batch (and every tier and disk-cache row) with the store.
        sample_batches: batches compared with the store when not `full` (chosen at random).
        seed: seed of that random choice.
        store_path: the store, when it moved since packing (default: the manifest's).

    Returns:
        Counts: ``batches``, ``compared_batches``, ``compared_rows``, ``segments_checked``,
        ``packed_bytes_checked``, ``dcache_bytes_checked``, ``dcache_files``; with `full`, ``store`` (the
        store's `verify_store` result).
    """
    if os.path.isdir(packed_path) and (read_manifest(packed_path) or {}).get("format") == STORE_FORMAT:
        return verify_store(packed_path)
    return _verify(packed_path, full, sample_batches, seed, store_path, check_store=full)


def _verify(packed_path: str | os.PathLike[str], full: bool, sample_batches: int, seed: int,
            store_path: str | os.PathLike[str] | None, check_store: bool) -> dict[str, Any]:
    """`verify` of a packed dataset; `check_store`: check its store's checksums first (not again for the edge
    rows' dataset inside one, whose store the node rows' check has just checked)."""
    ds = PackedDataset(packed_path)
    try:
        store = open_store(ds, store_path)
        store_check = verify_store(store.path) if check_store else None
        reference = _reference(ds, store)
        dcache_bytes = _check_files(ds, reference)
        n = ds.num_batches
        if full or sample_batches >= n:
            chosen = np.ones(n, dtype=bool)
        else:
            chosen = np.zeros(n, dtype=bool)
            chosen[np.random.default_rng(seed).choice(n, size=max(sample_batches, 0), replace=False)] = True
        if full:
            _check_tier_rows(reference, ds.gpu_cache, ds.gpu_ids, ds.path / "gpu_cache.npy", "the GPU tier")
            _check_tier_rows(reference, ds.cpu_init, ds.cpu_ids, ds.path / "cpu_init.npy", "the CPU tier's initial rows")
            for g in range(len(ds.dcache_files)):
                _check_tier_rows(reference, ds.dcache_rows(g), ds.dcache_ids(g), ds.dcache_path(g),
                                 f"disk-cache segment {g}")

        edges = ds.manifest.get("edges")
        n_ids: dict[int, np.ndarray] = {}
        e_ids: dict[int, np.ndarray | None] = {}     # with edge rows: the chosen batches' sampled edges
        for sb in ds.superbatches:     # n_id of the chosen batches only
            want = np.flatnonzero(chosen[sb.first_batch:sb.first_batch + sb.batches])
            if want.size:
                samples = list(ds.samples(sb.key))
                if len(samples) != sb.batches:
                    raise InputError(ds.round_dir / "samples" / f"{sb.key}.arrow",
                                     f"holds {len(samples)} batches, the manifest says {sb.batches}")
                for j in want:
                    n_ids[sb.first_batch + int(j)] = samples[int(j)].n_id
                    if edges is not None:
                        e_ids[sb.first_batch + int(j)] = samples[int(j)].e_id
        segments = packed_bytes = compared_rows = seen = 0
        for r, feats in ds.replay_records(check_crc=True):
            seen += 1
            segments += int((r.seg_rows > 0).sum())
            packed_bytes += int(r.seg_rows.sum()) * ds.row_bytes
            n_id = n_ids.pop(r.batch, None)
            if n_id is None:
                continue
            if n_id.shape[0] != r.src.shape[0]:
                raise InputError(ds.round_dir / "index", f"batch {r.batch}: the index covers {r.src.shape[0]} nodes, "
                                                         f"the sample {n_id.shape[0]}")
            same = _same(feats, reference(n_id))
            if not same.all():
                raise _explain(ds, r.batch, r.src, r.idx, r.seg_rows, r.dcache, np.flatnonzero(~same), n_id)
            compared_rows += n_id.shape[0]
        if seen != n:
            raise InputError(ds.path / "manifest.json", f"the index holds {seen} batches, the manifest says {n}")
        result: dict[str, Any] = {
            "batches": n, "compared_batches": int(chosen.sum()), "compared_rows": compared_rows,
            "segments_checked": segments, "packed_bytes_checked": packed_bytes,
            "dcache_bytes_checked": dcache_bytes, "dcache_files": len(ds.dcache_files),
            **({"store": store_check} if store_check is not None else {})}
        if edges is not None:
            result["edges"] = _verify_edges(ds, edges, e_ids, full, sample_batches, seed, store_path)
        return result
    finally:
        ds.close()


def _verify_edges(ds: PackedDataset, edges: dict[str, Any], e_ids: dict[int, np.ndarray | None], full: bool,
                  sample_batches: int, seed: int, store_path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """Check the edge rows' packed dataset (``edges/``) like the node rows', and that its batches read the
    edges the node batches sampled (`e_ids`: the batches chosen here, by number)."""
    path = ds.path / str(edges["path"])
    result = _verify(path, full, sample_batches, seed, store_path, check_store=False)
    sub = PackedDataset(path)
    try:
        if sub.num_batches != ds.num_batches:
            raise InputError(path / "manifest.json", f"holds {sub.num_batches} batches, the node rows {ds.num_batches}")
        for sb in sub.superbatches:
            for j, s in enumerate(sub.samples(sb.key)):
                if sb.first_batch + j not in e_ids:     # a batch not chosen
                    continue
                want = e_ids[sb.first_batch + j]
                if want is None or not np.array_equal(np.asarray(s.n_id, np.int64), np.asarray(want, np.int64)):
                    raise InputError(sub.round_dir / "samples", f"batch {sb.first_batch + j}: its edge rows are not "
                                                                "the edges the node batch sampled")
    finally:
        sub.close()
    return result

