"""Routing: the final address translation of one superbatch, and who packs which rows.

The planner says, per n_id position, GPU slot / CPU slot / k-th miss; the disk-cache
layout says, per miss, "row r of segment g's cache file" or "j-th packed row in miss
order". Packing writes a batch's packed rows shard-major (shard 0's rows, then shard 1's,
..., each in miss order), one 4096-aligned segment per (batch, shard). `route_superbatch`
turns both into the index's final addresses (src 2 -> packed row in that shard-major
order, src 3 -> dcache row) and writes a small routing file per superbatch that lets the
pack task of shard p read only its share: the packed node ids of shard p for every batch.

Routing file (``.npz``, members read lazily)::

    key, epoch, first_batch, num_shards    scalars
    seg_rows   int64 [b, P]     packed rows of (batch, shard)
    ids_PPPPP  int64 [sum_b seg_rows[:, p]]  shard p's packed node ids, batch-major, packed order
    offsets    int64 [b+1]      batch j's positions in src/idx are [offsets[j], offsets[j+1])
    src, idx   uint8 / int64    translated addresses (0 GPU, 1 CPU, 2 packed, 3 dcache)
    ins_offsets int64 [b+1], insert_pos, insert_slot    the planned CPU inserts
    dcache     int64 [b]        disk-cache segment each batch reads, -1 none

The members from ``offsets`` on are what `write_index` turns into the index file. A route task that
writes the index itself (``index_path``: offsets and checksums patched in after packing) leaves
them out: the routing file is then only what the pack tasks read.
"""
from __future__ import annotations

import functools
import os
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InputError
from ...native import kernels
from ...native.constants import ALIGN
from ..formats.atomic import atomic_path
from ..formats.intwidth import narrow_int
from ..formats.npyio import NpzReader, load_npy
from ..formats.packed import SRC_CPU, SRC_DCACHE, SRC_GPU, SRC_PACKED, epoch_of_key
from ..formats.packedindex import IndexRecord, write_index_draft, write_index_file

__all__ = ["SRC_MISS", "RouteFile", "ids_member", "ids_path", "route_superbatch", "segment_offsets",
           "translate_numpy", "write_index"]

# The planner's code for "a miss" is the index's code for "a packed row" (before translation).
SRC_MISS = SRC_PACKED


_NPZ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)


def ids_member(p: int) -> str:
    """Name of shard p's packed ids inside a routing file of the earlier layout (one member per shard)."""
    return f"ids_{p:05d}"


def ids_path(route_path: str | os.PathLike[str]) -> Path:
    """The packed ids of a routing file (``key.npz`` -> ``key.ids.npy``): every shard's, shard-major, sliced
    by the routing file's ``ids_bounds``."""
    p = Path(route_path)
    return p.with_name(f"{p.stem}.ids.npy")


def _stable_order(shard: np.ndarray, num_shards: int) -> np.ndarray:
    """Stable argsort of shard numbers; as int16 when they fit, so numpy radix-sorts them in O(n)."""
    if num_shards <= np.iinfo(np.int16).max:
        shard = shard.astype(np.int16)
    return np.argsort(shard, kind="stable")


def _translate(n_id: np.ndarray, src: np.ndarray, idx: np.ndarray, layout: tuple[np.ndarray, np.ndarray] | None,
               shard_rows: int, num_shards: int, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One batch: (src, idx) in index form, its per-shard packed row counts, its packed ids in packed order
    (`kernels.route_batch`, one native pass; `translate_numpy` is the same in numpy).

    `layout`: the batch's (in_cache, row) from the disk-cache layout, per miss; None: no layout.
    """
    n = np.asarray(n_id)
    if n.dtype not in (np.int32, np.int64) or not n.flags.c_contiguous:
        n = np.ascontiguousarray(n, dtype=np.int64)
    in_cache = row = None
    if layout is not None:
        in_cache = np.ascontiguousarray(layout[0], dtype=bool).view(np.uint8)
        row = np.ascontiguousarray(layout[1], dtype=np.int64)
    try:
        return kernels.route_batch(n, np.ascontiguousarray(src, dtype=np.uint8), np.ascontiguousarray(idx, dtype=np.int64),
                                   in_cache, row, shard_rows, num_shards)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def translate_numpy(n_id: np.ndarray, src: np.ndarray, idx: np.ndarray, layout: tuple[np.ndarray, np.ndarray] | None,
               shard_rows: int, num_shards: int, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`_translate` in numpy (a dozen vector passes a batch): the reference the native kernel is tested against."""
    miss_pos = np.flatnonzero(src == SRC_MISS)
    if miss_pos.size and not np.array_equal(idx[miss_pos], np.arange(miss_pos.size)):
        raise ValueError(f"{where}: the plan's miss numbers are not 0..k-1 in n_id order")
    m = miss_pos.size
    if layout is None:                               # every miss is packed, in miss order
        in_cache, row = np.zeros(m, dtype=bool), np.arange(m, dtype=np.int64)
    else:
        in_cache, row = layout
    if in_cache.shape[0] != m or row.shape[0] != m:
        raise ValueError(f"{where}: the layout lists {in_cache.shape[0]} misses, the plan {m}")
    packed_pos = miss_pos[~in_cache]                  # n_id positions of the packed rows
    k = packed_pos.size
    miss_rank = row[~in_cache]                        # index among the packed rows in miss order
    if k and (miss_rank.min() < 0 or miss_rank.max() >= k or np.bincount(miss_rank, minlength=k).max() != 1):
        raise ValueError(f"{where}: the layout's packed rows are not numbered 0..{k - 1}")
    by_rank = np.empty(k, dtype=np.int64)
    by_rank[miss_rank] = packed_pos                   # packed rows in miss order
    ids = n_id[by_rank]
    shard = ids // shard_rows
    if k and (ids.min() < 0 or shard.max() >= num_shards):
        raise ValueError(f"{where}: packed node id outside the store's {num_shards} shards")
    order = _stable_order(shard, num_shards)          # shard-major, miss order within a shard
    r = np.empty(k, dtype=np.int64)
    r[order] = np.arange(k, dtype=np.int64)           # miss rank -> packed row
    out_src = src.astype(np.uint8, copy=True)
    out_idx = idx.astype(np.int64, copy=True)
    out_idx[by_rank] = r
    cached_pos = miss_pos[in_cache]
    out_src[cached_pos] = SRC_DCACHE
    out_idx[cached_pos] = row[in_cache]
    counts = np.bincount(shard, minlength=num_shards).astype(np.int64)
    return out_src, out_idx, counts, ids[order]


def route_superbatch(key: str, n_ids: Sequence[np.ndarray], plans: Sequence[Any], layout: Any, first_batch: int,
                     shard_rows: int, num_shards: int, out_path: str | os.PathLike[str],
                     epoch: int | None = None, parents: bool = True,
                     index_path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Translate every batch of one superbatch to final addresses and write its routing file.

    Args:
        key: the superbatch key ``e{e}-s{k:05d}``.
        n_ids: per batch, its node ids (seeds first).
        plans: per batch, a `BatchPlan` (src 0 GPU / 1 CPU / 2 miss, idx, insert_pos, insert_slot).
        layout: the round's `DiskCacheLayout` (indexed by global batch), or None for packed only.
        first_batch: global index of the superbatch's first batch in the round.
        shard_rows: rows per feature shard of the store.
        num_shards: P, the store's shard count.
        out_path: where to write the routing file (atomically).
        epoch: the epoch; parsed from `key` when None.
        parents: create `out_path`'s directory when missing (False: a task outliving its failed
            run must not resurrect the directory the run removed; see `atomic.atomic_path`).
        index_path: also write the superbatch's index file there now, its segments' offsets and
            checksums left zero for `formats.packedindex.patch_segments` once packing knows them; the
            routing file then holds only what the pack tasks read (segment rows, packed ids).

    Returns:
        ``{"key", "path", "first_batch", "batches", "seg_rows" (int64 [b, P]), "packed_rows",
        "dcache_rows", "gpu_hits", "cpu_hits"}``; with `index_path` also ``"index_path"`` and
        ``"index_at"`` (`formats.packedindex.segment_fields_at`).
    """
    if len(n_ids) != len(plans):
        raise ValueError(f"superbatch {key}: {len(n_ids)} samples but {len(plans)} plans")
    b = len(n_ids)
    ep = epoch_of_key(key) if epoch is None else epoch
    segmented = layout is not None and getattr(layout, "segment_size", None) is not None
    srcs, idxs, ins_pos, ins_slot, seg_rows = [], [], [], [], np.zeros((b, num_shards), dtype=np.int64)
    packed_ids: list[np.ndarray] = []
    dcache = np.full(b, -1, dtype=np.int64)
    for j in range(b):
        i = first_batch + j
        where = f"superbatch {key}, batch {i}"
        n_id = np.asarray(n_ids[j])
        plan = plans[j]
        src, idx = np.asarray(plan.src), np.asarray(plan.idx)
        if src.shape != n_id.shape or idx.shape != n_id.shape:
            raise ValueError(f"{where}: plan covers {src.shape[0]} positions, the sample has {n_id.shape[0]}")
        cached = None if layout is None else (np.asarray(layout.in_cache[i], dtype=bool),
                                              np.asarray(layout.row[i], dtype=np.int64))
        s, x, counts, ids = _translate(n_id, src, idx, cached, shard_rows, num_shards, where)
        if segmented and (s == SRC_DCACHE).any():
            dcache[j] = int(layout.segment_of_batch[i])
        srcs.append(s)
        idxs.append(x)
        ins_pos.append(np.asarray(plan.insert_pos, dtype=np.int64))
        ins_slot.append(np.asarray(plan.insert_slot, dtype=np.int64))
        seg_rows[j] = counts
        packed_ids.append(ids)

    src_all = np.concatenate(srcs) if srcs else np.zeros(0, np.uint8)
    members: dict[str, np.ndarray] = {
        "key": np.array(key), "epoch": np.array(ep, dtype=np.int64),
        "first_batch": np.array(first_batch, dtype=np.int64), "num_shards": np.array(num_shards, dtype=np.int64),
        "seg_rows": seg_rows,
    }
    draft: dict[str, Any] = {}
    if index_path is None:      # the index is written later, from this file
        members.update({
            "offsets": np.r_[0, np.cumsum([s.shape[0] for s in srcs])].astype(np.int64), "src": src_all.astype(np.uint8),
            "idx": np.concatenate(idxs) if idxs else np.zeros(0, np.int64),
            "ins_offsets": np.r_[0, np.cumsum([s.shape[0] for s in ins_pos])].astype(np.int64),
            "insert_pos": np.concatenate(ins_pos) if ins_pos else np.zeros(0, np.int64),
            "insert_slot": np.concatenate(ins_slot) if ins_slot else np.zeros(0, np.int64),
            "dcache": dcache,
        })
    else:                       # the index now, its segment fields to be patched after packing
        zeros, none = np.zeros(num_shards, np.int64), np.zeros(num_shards, np.uint32)
        records = [IndexRecord(first_batch + j, ep, srcs[j], idxs[j], ins_pos[j], ins_slot[j], zeros, seg_rows[j],
                               none, int(dcache[j])) for j in range(b)]
        at = write_index_draft(index_path, records, {"key": key, "epoch": ep, "first_batch": first_batch},
                               parents=parents)    # made durable by the patch
        draft = {"index_path": str(Path(index_path)), "index_at": at}
    # Group every batch's packed ids by shard (batch-major, packed order within a batch): each batch's
    # ids are already shard-major, so shard p takes segment p of every batch in turn.
    starts = np.zeros((b, num_shards + 1), dtype=np.int64)
    np.cumsum(seg_rows, axis=1, out=starts[:, 1:])
    # They go to a plain .npy beside the routing file (written first: the routing file's presence implies
    # it), so a pack task reads its shard's slice without parsing a zip of P members and checking its CRCs.
    parts = [packed_ids[j][starts[j, p]:starts[j, p + 1]] for p in range(num_shards) for j in range(b)]
    by_shard = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    members["ids_bounds"] = np.r_[0, np.cumsum(seg_rows.sum(axis=0))].astype(np.int64)
    with atomic_path(ids_path(out_path), durable=False, parents=parents) as tmp, open(tmp, "wb") as f:
        # route_batch checked every id against shard_rows x num_shards: below 2**31, int32 without a scan
        small = by_shard.dtype.itemsize > 4 and shard_rows * num_shards <= 1 << 31
        np.save(f, by_shard.astype(np.int32) if small else narrow_int(by_shard))
    with atomic_path(out_path, durable=False, parents=parents) as tmp, open(tmp, "wb") as f:   # scratch of this run
        np.savez(f, **members)  # type: ignore[arg-type]
    return {
        "key": key, "path": str(Path(out_path)), "first_batch": first_batch, "batches": b, "seg_rows": seg_rows,
        "packed_rows": int(seg_rows.sum()), "dcache_rows": int(np.count_nonzero(src_all == SRC_DCACHE)),
        "gpu_hits": int(np.count_nonzero(src_all == SRC_GPU)), "cpu_hits": int(np.count_nonzero(src_all == SRC_CPU)),
        **draft,
    }


def _stamp(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=1024)
def _route_head(path: str, stamp: tuple[int, int, int]) -> tuple[str, int, int, int, np.ndarray, np.ndarray | None]:
    """(key, epoch, first_batch, num_shards, seg_rows, ids_bounds or None) of a routing file, read once per
    process and file version: every pack task opens every routing file, and parsing a zip's directory and
    each member's header again cost more than the shard's ids themselves."""
    z = NpzReader(path)
    try:
        head = (str(z["key"]), int(z["epoch"]), int(z["first_batch"]), int(z["num_shards"]), z["seg_rows"],
                z["ids_bounds"] if "ids_bounds" in z.files else None)
    finally:
        z.close()
    for a in head[4:]:
        if a is not None:
            a.flags.writeable = False          # shared by every RouteFile of this version of the file
    return head


@functools.lru_cache(maxsize=1024)
def _npy_layout(path: str, stamp: tuple[int, int, int]) -> tuple[np.dtype, int, int]:
    """(dtype, length, data offset) of a 1-D .npy file, its header parsed once per process and file version."""
    mm = load_npy(path, mmap_mode="r")
    if not isinstance(mm, np.memmap):       # np.load maps every .npy it is asked to map; kept for the offset
        raise ValueError("expected a memory-mappable array")  # noqa: TRY004  (the caller reports ValueErrors)
    dtype, shape, offset = mm.dtype, mm.shape, int(mm.offset)
    del mm
    if len(shape) != 1 or dtype.kind not in "iu":
        raise ValueError(f"expected a 1-D integer array, got shape {shape} of {dtype}")
    return dtype, int(shape[0]), offset


class RouteFile:
    """Lazy reader of a routing file: loads only the members asked for.

    Raises:
        InputError: the file is missing, truncated or lacks a member.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._npz: NpzReader | None = None
        try:
            head = _route_head(str(self.path), _stamp(self.path))
        except (KeyError, *_NPZ_ERRORS) as e:
            raise InputError(self.path, f"unreadable routing file ({e})") from e
        self.key, self.epoch, self.first_batch, self.num_shards, self.seg_rows, self._bounds = head
        self.num_batches = int(self.seg_rows.shape[0])

    def get(self, name: str) -> np.ndarray:
        try:
            if self._npz is None:
                self._npz = NpzReader(self.path)
            return self._npz[name]
        except (KeyError, *_NPZ_ERRORS) as e:
            raise InputError(self.path, f"routing file lacks a readable {name!r} ({e})") from e

    def shard_ids(self, p: int) -> np.ndarray:
        """Shard p's packed node ids for all batches (batch-major, packed order)."""
        if not 0 <= p < self.num_shards:
            raise ValueError(f"{self.path}: shard {p} out of range [0, {self.num_shards})")
        expect = int(self.seg_rows[:, p].sum())
        if self._bounds is None:                 # the earlier layout: one member per shard
            ids = self.get(ids_member(p))
        else:
            where = ids_path(self.path)
            bounds = self._bounds
            try:
                dtype, length, offset = _npy_layout(str(where), _stamp(where))
                if bounds.shape != (self.num_shards + 1,) or int(bounds[-1]) != length:
                    raise ValueError(f"{length} packed ids, the routing file's bounds say {int(bounds[-1])}")
                lo, hi = int(bounds[p]), int(bounds[p + 1])
                ids = np.fromfile(where, dtype=dtype, count=hi - lo, offset=offset + lo * dtype.itemsize)
            except (OSError, ValueError) as e:
                raise InputError(where, f"unreadable packed ids of {self.path.name} ({e})") from e
        if ids.shape[0] != expect:
            raise InputError(self.path, f"shard {p}: {ids.shape[0]} ids, the counts say {expect}")
        return ids

    def records(self, seg_offsets: np.ndarray, seg_crc: np.ndarray) -> list[IndexRecord]:
        """Index records of the superbatch, given its rows of the round's offsets and crcs [b, P]."""
        off, src, idx = self.get("offsets"), self.get("src"), self.get("idx")
        ins_off, ins_pos, ins_slot = self.get("ins_offsets"), self.get("insert_pos"), self.get("insert_slot")
        dcache = self.get("dcache")
        out = []
        for j in range(self.num_batches):
            out.append(IndexRecord(
                batch=self.first_batch + j, epoch=self.epoch,
                src=src[off[j]:off[j + 1]], idx=idx[off[j]:off[j + 1]],
                insert_pos=ins_pos[ins_off[j]:ins_off[j + 1]], insert_slot=ins_slot[ins_off[j]:ins_off[j + 1]],
                seg_offset=np.asarray(seg_offsets[j], dtype=np.int64), seg_rows=self.seg_rows[j],
                seg_crc=np.asarray(seg_crc[j]).astype(np.uint32), dcache=int(dcache[j])))
        return out

    def close(self) -> None:
        if self._npz is not None:
            self._npz.close()
            self._npz = None


def segment_offsets(seg_rows: np.ndarray, row_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Byte offsets of every (batch, shard) segment in its part file, and each part file's size.

    Args:
        seg_rows: int64 [n, P] packed rows of every batch of the round in every shard.
        row_bytes: bytes of one feature row.

    Returns:
        (offsets int64 [n, P], part_bytes int64 [P]): segment (i, p) starts at
        ``offsets[i, p]`` of part-p.bin, a multiple of 4096; segments follow each other in
        batch order, each padded to 4096, so ``part_bytes[p]`` is the file's size.
    """
    rows = np.asarray(seg_rows, dtype=np.int64)
    if rows.ndim != 2:
        raise ValueError(f"seg_rows must be [batches, shards], got shape {rows.shape}")
    nbytes = -(-(rows * row_bytes) // ALIGN) * ALIGN
    ends = np.cumsum(nbytes, axis=0)
    return (ends - nbytes).astype(np.int64), (ends[-1] if rows.shape[0] else np.zeros(rows.shape[1], np.int64)).astype(np.int64)


def write_index(key: str, route_path: str | os.PathLike[str], seg_offsets_rows: np.ndarray, crc_rows: np.ndarray,
                out_path: str | os.PathLike[str]) -> None:
    """Write superbatch `key`'s index file from its routing file and its segments' offsets and crcs.

    Args:
        key: the superbatch key (checked against the routing file).
        route_path: the routing file written by `route_superbatch`.
        seg_offsets_rows: int64 [b, P], the superbatch's rows of `segment_offsets`.
        crc_rows: [b, P], the superbatch's rows of the pack tasks' crcs (column p from shard p).
        out_path: the index file (Arrow IPC, written atomically).
    """
    route = RouteFile(route_path)
    try:
        if route.key != key:
            raise InputError(route.path, f"routes superbatch {route.key!r}, expected {key!r}")
        shape = (route.num_batches, route.num_shards)
        if np.shape(seg_offsets_rows) != shape or np.shape(crc_rows) != shape:
            raise ValueError(f"superbatch {key}: offsets {np.shape(seg_offsets_rows)} / crcs {np.shape(crc_rows)} "
                             f"do not match the routing file's {shape}")
        records = route.records(np.asarray(seg_offsets_rows), np.asarray(crc_rows))
        write_index_file(out_path, records, {"key": key, "epoch": route.epoch, "first_batch": route.first_batch})
    finally:
        route.close()
