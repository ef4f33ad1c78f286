"""The packed dataset: its names and constants, and a reader that replays the plan (the index files'
encoding is `packedindex`).

A packed dataset (``PACKED/``, see docs/design.md, "Formats") holds everything a training machine needs
and no graph topology: the GPU tier rows, the CPU tier at round start, per shard p one
``round-0/part-PPPPP.bin`` of 4096-aligned packed segments in batch order, the segmented
disk caches ``round-0/dcache-GGGGG.bin``, and per superbatch an index
``round-0/index/{key}.arrow`` with one single-row record batch per minibatch:

=============== ================= ==========================================================
column          type              meaning
=============== ================= ==========================================================
batch           int64             global batch index in the round (epoch-major)
epoch           int64             epoch of the batch
src             large_list<uint8> per n_id position: 0 GPU slot, 1 CPU slot, 2 packed row,
                                  3 disk-cache row, 4 store row (no packing: Ginex)
idx             large_list<int32> GPU slot / CPU slot / packed row r / row in the dcache file /
                or <int64>        node id (src 4); int64 only when an address needs it
insert_pos      large_list<int64> CPU inserts applied AFTER the batch: slot <- assembled
insert_slot     large_list<int64> row at n_id position ``insert_pos``
seg_offset      list<int64> [P]   byte offset of the batch's segment in part-p.bin
seg_rows        list<int64> [P]   rows of that segment (packed row order is shard-major)
seg_crc         list<uint32> [P]  zlib.crc32 of the segment's row bytes (padding excluded)
dcache          int64             disk-cache segment g the batch reads, -1 none
=============== ================= ==========================================================

`PackedDataset` reads it back with plain numpy reads; `replay` executes the plan (GPU
tier, a CPU tier held in RAM that starts at ``cpu_init`` and takes every batch's inserts,
packed rows, disk-cache rows) and yields every batch's features in order. It is the
reference the verifier and the CPU training loader use.
"""
from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InputError
from ...native.closing import Closing
from ...native.constants import ALIGN
from .atomic import atomic_path, preallocate
from .checksum import crc32
from .manifest import read_manifest
from .npyio import load_npy
from .outputs import OutputKind
from .packedindex import IndexRecord, read_index_file
from .rowcodec import RowCodec
from .samples import Buffer, SampleRecord, read_samples

__all__ = ["ALIGN", "EDGE_IDS", "EDGE_ROWS", "PACKED_FORMAT", "PACKED_KIND", "PACKED_VERSION", "ROUND_DIR", "SRC_CPU", "SRC_DCACHE",
           "SRC_GPU", "SRC_PACKED", "SRC_STORE", "PackedDataset", "SuperbatchEntry", "apply_inserts", "assemble",
           "budget_bytes", "create_row_file", "dcache_ids_name", "dcache_name", "epoch_of_key", "file_crc",
           "index_name", "padded", "part_name", "samples_name"]

PACKED_FORMAT = "diskflow-packed"
PACKED_KIND = OutputKind("a diskflow packed dataset", formats=(PACKED_FORMAT,))   # what `prepare` may replace
PACKED_VERSION = 1

# Where a row of an assembled batch comes from (the `src` column of the index).
SRC_GPU, SRC_CPU, SRC_PACKED, SRC_DCACHE = 0, 1, 2, 3
# Ginex layout (no packing): the row is read from the store itself, idx = node id.
SRC_STORE = 4

ROUND_DIR = "round-0"
EDGE_ROWS = "edges"     # the edge rows' packed dataset, inside a packed dataset (and a streamed base's tiers)
EDGE_IDS = "edge_cpu_ids.npy"   # a streamed run's checkpoint array: the edge rows' CPU tier (edge ids)
_CRC_CHUNK = 64 << 20
_KEY = re.compile(r"e(\d+)-s(\d+)")

# ---------------------------------------------------------------------------- file names

def part_name(p: int) -> str:
    """File name of shard p's packed segments (inside the round directory)."""
    return f"part-{p:05d}.bin"


def dcache_name(g: int) -> str:
    """File name of disk-cache segment g's rows (inside the round directory)."""
    return f"dcache-{g:05d}.bin"


def dcache_ids_name(g: int) -> str:
    """File name of the node ids of disk-cache segment g (inside the round directory)."""
    return f"dcache-{g:05d}.ids.npy"


def index_name(key: str) -> str:
    """Index file of superbatch `key`, relative to the round directory."""
    return f"index/{key}.arrow"


def samples_name(key: str) -> str:
    """Samples file of superbatch `key`, relative to the round directory."""
    return f"samples/{key}.arrow"


def epoch_of_key(key: str) -> int:
    """The epoch encoded in a superbatch key ``e{e}-s{k:05d}``."""
    m = _KEY.fullmatch(key)
    if m is None:
        raise ValueError(f"not a superbatch key: {key!r} (expected e{{epoch}}-s{{index:05d}})")
    return int(m.group(1))


def budget_bytes(manifest: dict[str, Any]) -> int:
    """The bytes of every row a packed dataset's batches read (node rows, and its edge rows where it has
    them): what a budget given as a share of the features (``"10%"``) is a share of."""
    edges = manifest.get("edges") or {}
    return (int(manifest.get("num_nodes", 0)) * int(manifest.get("row_bytes", 0))
            + int(edges.get("rows", 0)) * int(edges.get("row_bytes", 0)))


def padded(nbytes: int | np.ndarray) -> Any:
    """`nbytes` rounded up to a multiple of ALIGN (4096)."""
    return -(-nbytes // ALIGN) * ALIGN


def file_crc(path: str | os.PathLike[str], offset: int, nbytes: int) -> int:
    """zlib.crc32 of bytes [offset, offset + nbytes) of a file, read in large chunks.

    Raises:
        InputError: the file is missing or shorter than offset + nbytes.
    """
    crc = 0
    done = 0
    try:
        with open(path, "rb", buffering=0) as f:
            f.seek(offset)
            while done < nbytes:
                chunk = f.read(min(_CRC_CHUNK, nbytes - done))
                if not chunk:
                    raise InputError(path, f"truncated: expected {offset + nbytes} bytes, file ends at "
                                           f"{offset + done}")
                crc = crc32(chunk, crc)
                done += len(chunk)
    except OSError as e:
        raise InputError(path, f"unreadable file ({e.strerror or e})") from e
    return crc


def create_row_file(path: str | os.PathLike[str], rows: int, row_bytes: int) -> None:
    """Preallocate (zero-filled, blocks reserved: `atomic.preallocate`) a rows file of ``padded(rows * row_bytes)`` bytes.

    Disk-cache files take rows from every shard's pack task, so they must exist, at their
    full size, before packing starts; the pack tasks fill them through a memory map, which
    must not meet a full disk (SIGBUS).
    """
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        preallocate(f.fileno(), int(padded(rows * row_bytes)))


# ---------------------------------------------------------------------------- assembly

def assemble(record: IndexRecord, gpu: np.ndarray, cpu: np.ndarray, packed: np.ndarray,
             dcache: np.ndarray | None, out: np.ndarray | None = None,
             store_rows: np.ndarray | None = None) -> np.ndarray:
    """The features of one batch, gathered from the four tiers as the index says.

    Args:
        record: the batch's index record.
        gpu: GPU tier rows [G, dim].
        cpu: CPU tier rows [C, dim] as they stand before this batch.
        packed: the batch's packed rows [sum(seg_rows), dim] in packed (shard-major) order.
        dcache: rows [rows, dim] of disk-cache segment ``record.dcache`` (None when -1).
        out: optional output buffer [n, dim].
        store_rows: the rows of the batch's `SRC_STORE` positions, in position order (Ginex layout).
    """
    n = record.src.shape[0]
    if out is None:
        out = np.empty((n, gpu.shape[1]), dtype=gpu.dtype)
    tiers: tuple[np.ndarray | None, ...] = (gpu, cpu, packed, dcache)
    for code, tier in enumerate(tiers):
        pos = np.flatnonzero(record.src == code)
        if pos.size:
            if tier is None:
                raise ValueError(f"batch {record.batch}: {pos.size} rows from the disk cache but dcache is -1")
            out[pos] = tier[record.idx[pos]]
    pos = np.flatnonzero(record.src == SRC_STORE)
    if pos.size:
        if store_rows is None or store_rows.shape[0] != pos.size:
            raise ValueError(f"batch {record.batch}: {pos.size} rows come from the store but were not read")
        out[pos] = store_rows
    return out


def apply_inserts(record: IndexRecord, cpu: np.ndarray, features: np.ndarray) -> None:
    """Apply the batch's planned CPU-tier inserts (after the batch): cpu[slot] <- features[pos]."""
    if record.insert_pos.size:
        cpu[record.insert_slot] = features[record.insert_pos]


# ---------------------------------------------------------------------------- the reader

@dataclass(frozen=True)
class SuperbatchEntry:
    """A superbatch of the round as the manifest lists it."""

    key: str
    epoch: int
    index: int
    batches: int
    first_batch: int


class PackedDataset(Closing):
    """Read access to a finished packed dataset (its manifest must exist).

    Attributes come from the manifest: ``dtype``, ``dim``, ``row_bytes``, ``num_nodes``,
    ``num_shards``, ``num_batches``, ``superbatches``; the tiers are memory-mapped
    (``gpu_ids``/``gpu_cache``, ``cpu_ids``/``cpu_init``). Part files are read with
    ``os.preadv`` at the segment offsets; every read segment's crc is checked.

    Args:
        path: the dataset's directory.
        held: the content of some of its index and samples files, held in memory instead of on
            disk, by path relative to `path` (a streamed superbatch on the training machine: the
            loader reads those whole and once, so they skip the scratch disk); files named here
            need not exist on disk.
    """

    def __init__(self, path: str | os.PathLike[str], held: Mapping[str, Buffer] | None = None) -> None:
        self.path = Path(path)
        self.held: dict[str, Buffer] = dict(held or {})
        manifest = read_manifest(self.path)
        if manifest is None:
            raise InputError(self.path, "not a finished packed dataset (no manifest.json; run `diskflow prepare`)")
        if manifest.get("format") != PACKED_FORMAT:
            raise InputError(self.path / "manifest.json",
                             f"format is {manifest.get('format')!r}, expected {PACKED_FORMAT!r}")
        self.manifest: dict[str, Any] = manifest
        try:
            self.dtype = np.dtype(manifest["dtype"])
            self.dim = int(manifest["dim"])
            self.row_bytes = int(manifest["row_bytes"])
            self.num_nodes = int(manifest["num_nodes"])
            self.num_shards = int(manifest["num_shards"])
            rnd = manifest["round"]
            self.superbatches = [SuperbatchEntry(str(s["key"]), int(s["epoch"]), int(s["index"]), int(s["batches"]),
                                                 int(s["first_batch"])) for s in rnd["superbatches"]]
            self.num_batches = int(rnd["batches"])
            files = manifest["files"]
            self.part_paths = [self.path / f["path"] for f in files["parts"]]
            self.part_bytes = [int(f["bytes"]) for f in files["parts"]]
            self.dcache_files: list[dict[str, Any]] = list(files.get("dcache", []))
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(self.path / "manifest.json", f"malformed packed manifest ({type(e).__name__}: {e})") from e
        if self.row_bytes != self.dim * self.dtype.itemsize:
            raise InputError(self.path / "manifest.json", f"row_bytes {self.row_bytes} != dim x itemsize")
        if len(self.part_paths) != self.num_shards:
            raise InputError(self.path / "manifest.json",
                             f"lists {len(self.part_paths)} part files for {self.num_shards} shards")
        self._fds: dict[int, int] = {}
        self._dcache_key = -1
        self._dcache_map: np.ndarray | None = None

    def __repr__(self) -> str:
        return (f"PackedDataset({str(self.path)!r}, batches={self.num_batches}, shards={self.num_shards}, "
                f"dim={self.dim}, dtype={self.dtype}, gpu_rows={self.gpu_ids.shape[0]}, "
                f"cpu_rows={self.cpu_ids.shape[0]}, dcache_segments={len(self.dcache_files)})")

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the part files opened by `read_packed_rows`."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._dcache_key, self._dcache_map = -1, None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.close()

    @property
    def round_dir(self) -> Path:
        return self.path / ROUND_DIR

    # ------------------------------------------------------------------ tiers
    def _rows_npy(self, name: str, ids: np.ndarray) -> np.ndarray:
        p = self.path / name
        try:
            arr = load_npy(p, "r")
        except (OSError, ValueError) as e:
            raise InputError(p, f"unreadable array ({e})") from e
        if arr.dtype != self.dtype or arr.shape != (ids.shape[0], self.dim):
            raise InputError(p, f"holds {arr.dtype}{list(arr.shape)}, expected {self.dtype}[{ids.shape[0]}, {self.dim}]")
        return arr

    def _ids_npy(self, p: Path) -> np.ndarray:
        try:
            arr = load_npy(p, "r")
        except (OSError, ValueError) as e:
            raise InputError(p, f"unreadable array ({e})") from e
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise InputError(p, f"expected a 1-d integer array, found {arr.dtype}{list(arr.shape)}")
        return np.asarray(arr, dtype=np.int64)

    @cached_property
    def codec(self) -> RowCodec | None:
        """The encoding of the rows (the manifest's ``rows``: `dtype`/`dim` are then raw bytes), or None for the
        store's rows, exact."""
        rows = self.manifest.get("rows")
        return None if rows is None else RowCodec.from_manifest(rows, f"{self.path}/manifest.json rows")

    @cached_property
    def gpu_ids(self) -> np.ndarray:
        """Node id of every GPU-tier slot (int64 [G])."""
        return self._ids_npy(self.path / "gpu_ids.npy")

    @cached_property
    def gpu_cache(self) -> np.ndarray:
        """GPU-tier rows [G, dim] (memory-mapped)."""
        return self._rows_npy("gpu_cache.npy", self.gpu_ids)

    @cached_property
    def cpu_ids(self) -> np.ndarray:
        """Node id of every CPU-tier slot at round start (int64 [C], -1 = empty)."""
        return self._ids_npy(self.path / "cpu_ids.npy")

    @cached_property
    def cpu_init(self) -> np.ndarray:
        """CPU-tier rows at round start [C, dim] (memory-mapped; zeros in empty slots)."""
        return self._rows_npy("cpu_init.npy", self.cpu_ids)

    # ------------------------------------------------------------------ per superbatch
    def index(self, key: str) -> list[IndexRecord]:
        """The index records of superbatch `key`, checked against the manifest."""
        entry = self._entry(key)
        rel = f"{ROUND_DIR}/{index_name(key)}"
        path = self.path / rel
        records = read_index_file(path, self.held.get(rel))
        if len(records) != entry.batches:
            raise InputError(path, f"holds {len(records)} batches, the manifest says {entry.batches}")
        for j, r in enumerate(records):
            if r.batch != entry.first_batch + j:
                raise InputError(path, f"record {j} is batch {r.batch}, expected {entry.first_batch + j}")
            if r.seg_rows.shape[0] != self.num_shards or r.seg_offset.shape[0] != self.num_shards \
                    or r.seg_crc.shape[0] != self.num_shards:
                raise InputError(path, f"batch {r.batch}: segment columns do not have {self.num_shards} entries")
            if r.src.shape != r.idx.shape:
                raise InputError(path, f"batch {r.batch}: src and idx lengths differ")
        return records

    def samples(self, key: str) -> Iterator[SampleRecord]:
        """The graph samples of superbatch `key` (ids and local edges, in batch order)."""
        self._entry(key)
        rel = f"{ROUND_DIR}/{samples_name(key)}"
        return read_samples(self.path / rel, self.held.get(rel))

    def _entry(self, key: str) -> SuperbatchEntry:
        for s in self.superbatches:
            if s.key == key:
                return s
        raise KeyError(f"no superbatch {key!r} in {self.path}")

    def batches(self) -> Iterator[tuple[SuperbatchEntry, IndexRecord]]:
        """Every batch's index record in round order, with the superbatch it belongs to."""
        for sb in self.superbatches:
            for r in self.index(sb.key):
                yield sb, r

    # ------------------------------------------------------------------ reads
    def _fd(self, p: int) -> int:
        fd = self._fds.get(p)
        if fd is None:
            try:
                fd = os.open(self.part_paths[p], os.O_RDONLY)
            except OSError as e:
                raise InputError(self.part_paths[p], f"cannot open part file ({e.strerror or e})") from e
            self._fds[p] = fd
        return fd

    def read_packed_rows(self, record: IndexRecord, check_crc: bool = True) -> np.ndarray:
        """The batch's packed rows [sum(seg_rows), dim] in packed order, read from the part files.

        Raises:
            InputError: a segment lies beyond the end of its part file, or its crc does not match
                (the message names the file, the batch and the shard).
        """
        rows = record.seg_rows.astype(np.int64)
        out = np.empty((int(rows.sum()), self.dim), dtype=self.dtype)
        flat = out.reshape(-1).view(np.uint8)
        start = 0
        for p in np.flatnonzero(rows):
            nbytes = int(rows[p]) * self.row_bytes
            off = int(record.seg_offset[p])
            view = flat[start:start + nbytes]
            try:
                got = os.preadv(self._fd(int(p)), [view.data], off)
            except OSError as e:
                raise InputError(self.part_paths[p], f"batch {record.batch}, shard {p}: read failed at byte {off} "
                                                     f"({e.strerror or e})") from e
            if got != nbytes:
                raise InputError(self.part_paths[p], f"truncated: batch {record.batch}, shard {p} needs bytes "
                                                     f"[{off}, {off + nbytes}), file ends at {off + got}")
            if check_crc and crc32(view.data) != int(record.seg_crc[p]):
                raise InputError(self.part_paths[p], f"checksum mismatch in batch {record.batch}, shard {p} "
                                                     f"(segment at byte {off}, {int(rows[p])} rows)")
            start += nbytes
        return out

    def dcache_path(self, g: int) -> Path:
        return self.path / self.dcache_files[g]["path"]

    def dcache_rows(self, g: int) -> np.ndarray:
        """Rows of disk-cache segment g [rows, dim] (memory-mapped, crc not checked here)."""
        if not 0 <= g < len(self.dcache_files):
            raise InputError(self.path / "manifest.json", f"no disk-cache segment {g} "
                                                          f"({len(self.dcache_files)} listed)")
        rows = int(self.dcache_files[g]["rows"])
        p = self.dcache_path(g)
        if rows == 0:
            return np.zeros((0, self.dim), dtype=self.dtype)
        try:
            size = p.stat().st_size
        except OSError as e:
            raise InputError(p, f"missing disk-cache file ({e.strerror or e})") from e
        if size < rows * self.row_bytes:
            raise InputError(p, f"truncated: {rows} rows need {rows * self.row_bytes} bytes, file has {size}")
        return np.memmap(p, dtype=self.dtype, mode="r", shape=(rows, self.dim))

    def dcache_ids(self, g: int) -> np.ndarray:
        """Node id of every row of disk-cache segment g."""
        return self._ids_npy(self.round_dir / dcache_ids_name(g))

    # ------------------------------------------------------------------ replay
    def replay(self, check_crc: bool = True) -> Iterator[tuple[int, np.ndarray]]:
        """Execute the plan over the whole round: yield (global batch, features of n_id) in order.

        The CPU tier is held in RAM, starts as ``cpu_init`` and takes every batch's inserts
        after the batch, exactly as the trainer does, so batch i's rows depend on every
        earlier batch. The yielded array is the caller's (a fresh array per batch).
        """
        for r, feats in self.replay_records(check_crc):
            yield r.batch, feats

    def replay_records(self, check_crc: bool = True) -> Iterator[tuple[IndexRecord, np.ndarray]]:
        """As `replay`, yielding each batch's index record with its features."""
        cpu = np.array(self.cpu_init)
        for _, r in self.batches():
            feats = self.assemble(r, cpu, check_crc=check_crc)
            apply_inserts(r, cpu, feats)
            yield r, feats

    def assemble(self, record: IndexRecord, cpu: np.ndarray, check_crc: bool = True) -> np.ndarray:
        """One batch's features [n, dim], given the CPU tier's rows as they stand before the batch.

        Reads the batch's packed segments (crc-checked) and disk-cache rows, checks every
        address against its tier, and gathers. The caller applies `apply_inserts` afterwards
        (`replay` does both, in order, for the whole round).
        """
        packed = self.read_packed_rows(record, check_crc=check_crc)
        dc = None
        if record.dcache >= 0:
            if self._dcache_key != record.dcache:   # a segment's batches are consecutive: keep one mapped
                self._dcache_map = self.dcache_rows(record.dcache)
                self._dcache_key = record.dcache
            dc = self._dcache_map
        gpu = self.gpu_cache
        self._check_bounds(record, gpu.shape[0], cpu.shape[0], packed.shape[0], None if dc is None else dc.shape[0])
        store_ids = record.idx[record.src == SRC_STORE]
        store_rows = self.store.gather(store_ids) if store_ids.size else None
        return assemble(record, gpu, cpu, packed, dc, store_rows=store_rows)

    @cached_property
    def store(self) -> Any:
        """The store the dataset was prepared from (the Ginex layout reads its misses there)."""
        from .store import Store

        return Store(self.manifest["store"]["path"])

    def _check_bounds(self, r: IndexRecord, g: int, c: int, k: int, d: int | None) -> None:
        """Reject an index whose addresses fall outside their tier (a clear error, not an IndexError).

        One pass over the batch's addresses against its sources' sizes (the plan stage's, every batch); the
        tier at fault is looked up only once one is found."""
        where = self.round_dir / "index"
        if r.src.size and r.src.max() > SRC_STORE:
            raise InputError(where, f"batch {r.batch}: unknown source code {int(r.src.max())}")
        sizes = np.array([g, c, k, -1 if d is None else d, self.num_nodes], np.int64)    # by source code
        if r.src.size and bool(((r.idx < 0) | (r.idx >= sizes[r.src])).any()):
            for code, name in ((SRC_GPU, "GPU tier"), (SRC_CPU, "CPU tier"), (SRC_PACKED, "packed rows"),
                               (SRC_DCACHE, "disk cache"), (SRC_STORE, "store row")):
                sel = r.idx[r.src == code]
                size = int(sizes[code])
                if not sel.size or (sel.min() >= 0 and sel.max() < size):
                    continue
                if code == SRC_STORE:
                    raise InputError(where, f"batch {r.batch}: store row out of range (max {int(sel.max())}, "
                                            f"{self.num_nodes} nodes)")
                raise InputError(where, f"batch {r.batch}: {name} address out of range "
                                        f"(max {int(sel.max())}, size {max(size, 0)})")
        if r.insert_pos.size and (r.insert_slot.min() < 0 or r.insert_slot.max() >= c
                                  or r.insert_pos.min() < 0 or r.insert_pos.max() >= r.src.shape[0]):
            raise InputError(where, f"batch {r.batch}: CPU insert out of range")
