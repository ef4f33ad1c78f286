"""Batched feature packing (DiskGNN §5.2): one task per feature shard, each raw byte read once.

`pack_shard` reads shard p of the store with large sequential reads, then, for every batch
of the round in order, gathers that batch's packed rows living in shard p (numpy fancy
indexing into a large write buffer) and appends them to ``part-p.bin`` as one 4096-aligned
segment; the file is written sequentially under a temporary name and renamed when complete,
so a killed task never leaves a part file that looks finished. The same task writes the
rows of the disk caches, the GPU tier and the CPU tier's initial state that live in its
shard, into files preallocated before packing (`prepare_targets`); rows of one such file
come from every shard, so they are scattered through a shared memory map, never one write
per row.

The part files' and tier files' writers are `operators.prepare.writers`; the benchmark's baseline,
DiskGNN's "individual packing", is `bench.naivepack.pack_naive` (byte-identical part files).
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InputError
from ...native import kernels
from ...native.constants import ALIGN
from ..formats.atomic import atomic_path
from ..formats.directwrite import open_direct
from ..formats.npyio import create_aligned_npy, load_npy, save_npy
from ..formats.packed import ROUND_DIR, create_row_file, dcache_ids_name, dcache_name, padded, part_name
from ..formats.rowcodec import RowCodec, encode_bytes
from ..formats.store import FeatureShard, Store, map_shard
from ..formats.storecheck import StoreChecks
from ..formats.threadbuffers import thread_buffer
from .pagecache import cached_share
from .route import RouteFile
from .writers import WRITE_BUFFER, SegmentWriter, open_new, write_rows_at

__all__ = ["READ_CHUNK", "RESIDENT", "EarlyPart", "RowTarget", "local_rows", "pack_early", "pack_shard",
           "prepare_targets", "read_routes", "release_early_maps", "warm_shard_ids", "warm_shards",
           "write_tier_rows"]

READ_CHUNK = 64 << 20     # bytes per sequential read of a shard


@dataclass(frozen=True)
class RowTarget:
    """A preallocated rows file that takes row ``k`` = features[ids[k]] at ``offset + k * row_bytes``.

    ``ids`` is an int array or the path of an ``.npy`` holding it; ids < 0 are empty rows
    (left zero).
    """

    path: str | os.PathLike[str]
    ids: np.ndarray | str | os.PathLike[str]
    offset: int = 0

    def load_ids(self) -> np.ndarray:
        if isinstance(self.ids, np.ndarray):
            return self.ids.astype(np.int64, copy=False)
        try:
            return np.asarray(load_npy(self.ids, "r"), dtype=np.int64)
        except (OSError, ValueError) as e:
            raise InputError(self.ids, f"unreadable ids array ({e})") from e


def prepare_targets(packed_dir: str | os.PathLike[str], gpu_ids: np.ndarray, cpu_ids: np.ndarray,
                    cache_nodes: Sequence[np.ndarray], dtype: np.dtype | str, dim: int
                    ) -> tuple[list[RowTarget], list[RowTarget]]:
    """Write the tier and disk-cache id files and preallocate their rows files, before packing.

    Creates ``gpu_ids.npy``/``gpu_cache.npy``, ``cpu_ids.npy``/``cpu_init.npy`` (aligned .npy,
    rows at byte 4096) and per segment g ``round-0/dcache-g.ids.npy``/``dcache-g.bin``.

    Returns:
        (tier_targets, dcache_targets) to pass to every `pack_shard` task.
    """
    root = Path(packed_dir)
    dt = np.dtype(dtype)
    tiers = []
    for name, ids in (("gpu", gpu_ids), ("cpu", cpu_ids)):
        ids = np.asarray(ids, dtype=np.int64)
        ids_path, rows_path = root / f"{name}_ids.npy", root / ("gpu_cache.npy" if name == "gpu" else "cpu_init.npy")
        save_npy(ids_path, ids)
        with atomic_path(rows_path) as tmp:
            mm = create_aligned_npy(tmp, dt, (ids.shape[0], dim))
            del mm
        tiers.append(RowTarget(rows_path, ids_path, ALIGN))
    caches = []
    rnd = root / ROUND_DIR
    for g, nodes in enumerate(cache_nodes):
        ids_path, rows_path = rnd / dcache_ids_name(g), rnd / dcache_name(g)
        save_npy(ids_path, np.asarray(nodes, dtype=np.int64))
        create_row_file(rows_path, len(nodes), dim * dt.itemsize)
        caches.append(RowTarget(rows_path, ids_path, 0))
    return tiers, caches


# ---------------------------------------------------------------------------- helpers

def _shard_buffer(nbytes: int) -> np.ndarray:
    """A page-aligned byte buffer of `nbytes` reused by this thread's pack tasks.

    A fresh 64 MiB array per shard costs the kernel zeroing every page of it again; the
    buffer is only ever live inside one task, and a thread runs one task at a time. Page
    alignment lets the shard be read with O_DIRECT straight into it.
    """
    return thread_buffer("shard", nbytes)[:nbytes]



def _read_span(fd: int, direct_fd: int | None, buf: np.ndarray, start: int, pos: int, end: int, chunk: int,
               path: Path) -> int:
    """Fill ``buf[pos - start:end - start]`` with file bytes [pos, end) (`start`: the file offset of buf[0],
    a multiple of ALIGN, as is buf's address); return how far it got (< end: the file ended). A failed read
    is an InputError naming `path` and the byte.

    A chunk the page cache mostly holds (the read-ahead's shards) is copied from it; any other is read
    with O_DIRECT where `direct_fd` is given: straight from the disk into `buf`, with no copy through the
    page cache and none of its bookkeeping, the cost that dominated the kernel's share of packing.
    """
    view = buf.data
    while pos < end:
        stop = min(end, pos + chunk)
        try:
            if direct_fd is not None and cached_share(fd, pos, stop - pos) < 0.5:
                lo = pos - (pos - start) % ALIGN                  # aligned in the file and in buf alike
                hi = min(start + buf.shape[0], -(-stop // ALIGN) * ALIGN)
                try:
                    n = os.preadv(direct_fd, [view[lo - start:hi - start]], lo)
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                    direct_fd = None                              # e.g. a device whose blocks are larger
                    continue
                if n <= pos - lo:
                    return pos                                    # end of file
                pos = min(end, lo + n)
            else:
                n = os.preadv(fd, [view[pos - start:stop - start]], pos)
                if n <= 0:
                    return pos
                pos += n
        except OSError as e:
            raise InputError(path, f"read failed at byte {pos} ({e.strerror or e})") from e
    return pos


def _read_shard(shard: FeatureShard, dtype: np.dtype, dim: int, chunk: int) -> tuple[np.ndarray, int]:
    """Shard rows [rows, dim] in RAM, read with large sequential reads (O_DIRECT where the page cache does
    not already hold them); also the bytes read."""
    nbytes = shard.rows * dim * dtype.itemsize
    start = shard.offset - shard.offset % ALIGN
    head = shard.offset - start
    buf = _shard_buffer(-(-(head + nbytes) // ALIGN) * ALIGN)
    try:
        fd = os.open(shard.path, os.O_RDONLY)
    except OSError as e:
        raise InputError(shard.path, f"cannot open feature shard ({e.strerror or e})") from e
    direct_fd = open_direct(shard.path, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError, AttributeError):     # with O_DIRECT at hand, the buffered reads
            os.posix_fadvise(fd, shard.offset, nbytes,           # copy cached chunks and read no further
                             os.POSIX_FADV_SEQUENTIAL if direct_fd is None else os.POSIX_FADV_RANDOM)
        pos = _read_span(fd, direct_fd, buf, start, shard.offset, shard.offset + nbytes, chunk, shard.path)
    finally:
        os.close(fd)
        if direct_fd is not None:
            os.close(direct_fd)
    if pos < shard.offset + nbytes:
        raise InputError(shard.path, f"truncated feature shard: {nbytes} bytes expected from byte "
                                     f"{shard.offset}, file ends after {pos - shard.offset}")
    return buf[head:head + nbytes].view(dtype).reshape(shard.rows, dim), nbytes


RESIDENT = 0.99   # share of a read-ahead shard's pages that must still be cached for it to be mapped, not read


def _shard_cached_share(shard: FeatureShard, nbytes: int) -> float:
    """`cached_share` of a shard's `nbytes` bytes of features."""
    try:
        fd = os.open(shard.path, os.O_RDONLY)
    except OSError as e:
        raise InputError(shard.path, f"cannot open feature shard ({e.strerror or e})") from e
    try:
        return cached_share(fd, shard.offset, nbytes)
    finally:
        os.close(fd)


def _shard_rows(shard: FeatureShard, dtype: np.dtype, dim: int, chunk: int, resident: bool) -> tuple[np.ndarray, int]:
    """A pack task's one take of a shard's rows, and its bytes: mapped from the page cache when `resident`
    (a read-ahead shard, still cached: no copy), else read into memory (`_read_shard`)."""
    nbytes = shard.rows * dim * dtype.itemsize
    if resident and _shard_cached_share(shard, nbytes) >= RESIDENT:
        return map_shard(shard, dtype, dim, populate=True), nbytes
    return _read_shard(shard, dtype, dim, chunk)


class _LazyShard:
    """A shard's rows, read (once, sequentially) on first use.

    A shard that no batch misses and no tier or disk cache holds is never read: on a graph
    whose hot rows sit in a few shards, the packing pass reads only those. `resident`: the
    shard was read ahead, so its rows are mapped from the page cache if all still there.
    """

    def __init__(self, shard: FeatureShard, dtype: np.dtype, dim: int, chunk: int, resident: bool = False,
                 checks: StoreChecks | None = None, codec: RowCodec | None = None) -> None:
        self.shard, self.dtype, self.dim, self.chunk, self.resident = shard, dtype, dim, chunk, resident
        self.checks, self.codec = checks, codec
        self.bytes_read = 0
        self._rows: np.ndarray | None = None

    def rows(self) -> np.ndarray:
        """The shard's rows: as stored, or with a `codec`, encoded (raw bytes, `rowcodec.encode_bytes`), encoded
        once for every segment and tier row the pass writes."""
        if self._rows is None:
            rows, self.bytes_read = _shard_rows(self.shard, self.dtype, self.dim, self.chunk, self.resident)
            if self.checks is not None:     # from the bytes just read (or mapped): checked as they are read
                self.checks.check_view(self.shard.path, self.shard.offset, rows,
                                       f"prepare's pack pass, shard {self.shard.index}")
            if self.codec is not None:
                rows = encode_bytes(self.codec, rows, str(self.shard.path), self.shard.row_start)
            self._rows = rows
        return self._rows


def warm_shard_ids(store: Store, budget_bytes: int) -> list[int]:
    """The shards `warm_shards` reads ahead with `budget_bytes`: the store's first whole shards within it."""
    sizes = np.array([sh.rows for sh in store.shards], dtype=np.int64) * store.row_bytes
    return list(range(int(np.searchsorted(np.cumsum(sizes), budget_bytes, side="right"))))


def warm_shards(store_path: str | os.PathLike[str], budget_bytes: int, stop: threading.Event | None = None,
                chunk: int = 8 << 20) -> int:
    """Read the store's first shards into the page cache, up to `budget_bytes`; return the bytes read.

    Meant for a background thread while preparation is busy with sampling and planning and the
    disk is otherwise idle: the pack tasks of those shards then find their bytes cached, so
    part of the one pass over the features overlaps the CPU-bound phases. Every byte is still
    read from the disk once. The kernel reads each chunk into the page cache itself
    (POSIX_FADV_WILLNEED) and the thread only waits for its last page, so the warm-up copies
    nothing and takes almost no CPU from the phases it overlaps. Whole shards only (stops before
    one that would pass the budget); returns early when `stop` is set; I/O errors end the
    warm-up quietly (packing reports them).
    """
    store = Store(store_path)
    probe = np.empty(1, dtype=np.uint8)
    done = 0
    for p in warm_shard_ids(store, budget_bytes):
        shard = store.shards[p]
        nbytes = shard.rows * store.row_bytes
        if stop is not None and stop.is_set():
            break
        try:
            fd = os.open(shard.path, os.O_RDONLY)
        except OSError:
            break
        try:
            off = 0
            while off < nbytes and not (stop is not None and stop.is_set()):
                n = min(chunk, nbytes - off)
                with contextlib.suppress(AttributeError):
                    os.posix_fadvise(fd, shard.offset + off, n, os.POSIX_FADV_WILLNEED)
                if os.preadv(fd, [probe.data], shard.offset + off + n - 1) <= 0:     # waits for the chunk's end
                    break
                off += n
            done += off
        except OSError:
            break
        finally:
            os.close(fd)
    return done



def read_routes(route_paths: Sequence[str | os.PathLike[str]], num_batches: int) -> Iterator[RouteFile]:
    """The routing files in order, checked to cover batches 0..num_batches-1 exactly once."""
    nxt = 0
    for rp in route_paths:
        route = RouteFile(rp)
        try:
            if route.first_batch != nxt:
                raise InputError(route.path, f"starts at batch {route.first_batch}, expected {nxt} "
                                             "(routing files must be passed in round order)")
            nxt += route.num_batches
            if nxt > num_batches:
                raise InputError(route.path, f"routes batches up to {nxt - 1}, the offsets cover {num_batches}")
            yield route
        finally:
            route.close()
    if nxt != num_batches:
        raise ValueError(f"routing files cover {nxt} batches, the segment offsets {num_batches}")


def local_rows(route: RouteFile, p: int, shard: FeatureShard) -> np.ndarray:
    """The rows of shard p (`shard`) that `route` packs, as row numbers within the shard (checked in range)."""
    ids = route.shard_ids(p)
    local = ids - shard.row_start
    if local.size and (local.min() < 0 or local.max() >= shard.rows):
        raise InputError(route.path, f"shard {p}: packed node id outside rows [{shard.row_start}, {shard.row_stop})")
    return local


def _write_targets(targets: Sequence[RowTarget], shard_rows: _LazyShard, shard: FeatureShard, row_bytes: int) -> int:
    """Write the shard's rows of every target file; return the row bytes written.

    Where a target's ids ascend (the tiers: `policies.choose_cpu_tier` lays the CPU tier out in
    node order, the GPU tier is sorted), the shard's rows are one contiguous range of the file:
    gathered and written with one `pwrite`, then `fdatasync`. Elsewhere (a disk-cache segment, a
    resumed stream's tier) they are scattered into a shared memory map, then `msync`. Either way a
    finished task's rows are on disk, as its part file is.
    """
    written = 0
    for t in targets:
        ids = t.load_ids()
        filled = ids[:int(np.count_nonzero(ids >= 0))]     # ascending layouts put the empty slots last
        ascending = bool((filled >= 0).all() and (filled[1:] > filled[:-1]).all())
        if ascending:
            lo, hi = (int(x) for x in np.searchsorted(filled, [shard.row_start, shard.row_stop]))
            sel = None
            if lo == hi:
                continue
        else:
            sel = np.flatnonzero((ids >= shard.row_start) & (ids < shard.row_stop))
            if not sel.size:
                continue
        feats = shard_rows.rows()
        need = t.offset + ids.shape[0] * row_bytes
        try:
            size = os.stat(t.path).st_size
        except OSError as e:
            raise InputError(t.path, f"target rows file missing ({e.strerror or e}); preallocate it before packing") from e
        if size < need:
            raise InputError(t.path, f"target rows file has {size} bytes, {ids.shape[0]} rows need {need}")
        if sel is None:
            write_rows_at(Path(t.path), feats, (filled[lo:hi] - shard.row_start).astype(np.int64, copy=False),
                           t.offset + lo * row_bytes)
            written += (hi - lo) * row_bytes
            continue
        mm = np.memmap(t.path, dtype=feats.dtype, mode="r+", offset=t.offset, shape=(ids.shape[0], feats.shape[1]))
        try:    # one pass, no gathered temporary (numpy's mm[sel] = feats[rows] makes one), GIL released
            kernels.copy_rows(mm, sel.astype(np.int64, copy=False), feats,
                              (ids[sel] - shard.row_start).astype(np.int64, copy=False))
            mm.flush()
        finally:
            del mm
        written += sel.size * row_bytes
    return written


# ---------------------------------------------------------------------------- batched packing

@dataclass(frozen=True)
class EarlyPart:
    """Shard p's part file begun while the round was still being planned (`pack_early`).

    Batches ``[0, batches)`` are written, ``position`` bytes of the file; ``crc`` (int64
    [batches]) are their segments' crc32s and ``rows`` their packed rows. `pack_shard` appends
    the rest of the round to ``path`` and moves it into place.
    """

    path: str
    batches: int
    position: int
    rows: int
    crc: np.ndarray


def _open_part(path: Path, position: int) -> tuple[int, bool]:
    """An existing part file opened for appending at `position` (O_DIRECT where the file system takes it)."""
    fd = open_direct(path, os.O_WRONLY)
    direct = fd is not None
    if fd is None:
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError as e:
            raise InputError(path, f"cannot reopen the part file begun while planning ({e.strerror or e})") from e
    try:
        size = os.fstat(fd).st_size
        if size < position:
            raise InputError(path, f"part file begun while planning has {size} bytes, its record says {position}")
        os.lseek(fd, position, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd, direct


def _append_segments(w: SegmentWriter, route: RouteFile, p: int, shard: FeatureShard, feats: Any, col: np.ndarray,
                     crc: np.ndarray) -> int:
    """Append every batch of `route` for shard p (each segment padded to ALIGN), checking each lands at its
    offset in `col`; their crcs go to `crc`; return the rows written. `feats()` gives the shard's rows."""
    local = local_rows(route, p, shard)
    counts = route.seg_rows[:, p]
    bounds = np.r_[0, np.cumsum(counts)]
    rb = w.row_bytes
    for j in range(route.num_batches):
        i = route.first_batch + j
        if w.position != col[i]:
            raise ValueError(f"batch {i}, shard {p}: segment offset {col[i]} does not follow the "
                             f"previous segment (at {w.position}); offsets and routes disagree")
        seg = local[bounds[j]:bounds[j + 1]]
        if seg.size:
            crc[i] = w.rows(feats(), seg)
        nbytes = seg.shape[0] * rb
        w.zeros(int(padded(nbytes)) - nbytes)
    return int(local.shape[0])


def pack_shard(store_path: str | os.PathLike[str], p: int, route_paths: Sequence[str | os.PathLike[str]],
               seg_offsets: np.ndarray, part_path: str | os.PathLike[str], *,
               dcache_targets: Sequence[RowTarget] | None = None, tier_targets: Sequence[RowTarget] | None = None,
               row_bytes: int | None = None, read_chunk: int = READ_CHUNK, write_buffer: int = WRITE_BUFFER,
               early: EarlyPart | None = None, check_crc: bool | None = None,
               codec: RowCodec | None = None) -> dict[str, Any]:
    """The batched packing task of shard p: read the shard once, write part-p.bin and its target rows.

    Args:
        store_path: the ingested store.
        p: the shard index.
        route_paths: the round's routing files, in round order.
        seg_offsets: int64 [n, P] (or shard p's column [n]) from `route.segment_offsets`.
        part_path: where part-p.bin goes (written under a temporary name, renamed at the end).
        dcache_targets: disk-cache rows files (from `prepare_targets`); rows of shard p are written.
        tier_targets: GPU-tier and CPU-init rows files (from `prepare_targets`).
        row_bytes: expected row size (checked against the store), optional.
        read_chunk: bytes per sequential read of the shard.
        write_buffer: bytes gathered before each write to the part file.
        early: the part file's first batches, written by `pack_early` while planning: the rest is
            appended to that file, which is then moved to `part_path` (same file system).
        check_crc: check the shard's bytes against the store's checksums as they are read (default: on,
            unless ``DISKFLOW_STORE_CRC=0``).
        codec: write the rows encoded (`rowcodec.RowCodec`: segments and target rows of its `row_bytes`);
            None: as stored.

    Returns:
        ``{"shard", "crc" (int64 [n], crc32 per segment), "rows", "bytes_read" (raw shard bytes),
        "bytes_written" (packed row bytes), "file_bytes" (part file size, padding included),
        "target_bytes_written", "seconds"}``.
    """
    t0 = time.perf_counter()
    store = Store(store_path, check_crc=check_crc)
    if not 0 <= p < len(store.shards):
        raise ValueError(f"shard {p} out of range: the store has {len(store.shards)} shards")
    rb = store.row_bytes if codec is None else codec.row_bytes
    if row_bytes is not None and row_bytes != rb:
        raise ValueError(f"row_bytes {row_bytes} does not match the store's {rb}")
    if codec is not None and early is not None:
        raise ValueError(f"shard {p}: encoded rows are packed in one pass, not appended to a part begun early")
    offsets = np.asarray(seg_offsets, dtype=np.int64)
    col = offsets[:, p] if offsets.ndim == 2 else offsets
    n = col.shape[0]
    shard = store.shards[p]
    if early is not None:
        release_early_maps(Path(early.path).parent, p)     # this process's map of it from `pack_early`
    feats = _LazyShard(shard, store.feature_dtype, store.feature_dim, read_chunk, resident=early is not None,
                       checks=store.checks, codec=codec)

    crc = np.zeros(n, dtype=np.int64)
    part = Path(part_path)
    if early is None:
        rows_total = 0
        with atomic_path(part) as tmp:
            fd, direct = open_new(tmp)
            w = SegmentWriter(fd, part, write_buffer, rb, direct)
            try:
                for route in read_routes(route_paths, n):
                    rows_total += _append_segments(w, route, p, shard, feats.rows, col, crc)
                w.finish()
            finally:
                w.close()
                os.close(fd)
    else:
        if not 0 <= early.batches <= n or early.crc.shape != (early.batches,):
            raise ValueError(f"shard {p}: early part covers {early.batches} batches with {early.crc.shape} crcs, "
                             f"the round has {n}")
        crc[:early.batches] = early.crc
        rows_total = early.rows
        src = Path(early.path)
        fd, direct = _open_part(src, early.position)
        w = SegmentWriter(fd, part, write_buffer, rb, direct, start=early.position)
        try:
            for route in read_routes(route_paths, n):
                if route.first_batch + route.num_batches <= early.batches:
                    continue
                if route.first_batch < early.batches:
                    raise ValueError(f"shard {p}: the early part ends at batch {early.batches}, inside "
                                     f"{route.path} (batches {route.first_batch}..)")
                rows_total += _append_segments(w, route, p, shard, feats.rows, col, crc)
            w.finish()
            os.ftruncate(fd, w.written)
            os.fsync(fd)
        finally:
            w.close()
            os.close(fd)
        part.parent.mkdir(parents=True, exist_ok=True)      # as `atomic_path` does for a fresh part file
        try:
            os.replace(src, part)
        except OSError as e:            # another file system: copy it under a temporary name instead
            if e.errno != errno.EXDEV:
                raise InputError(part, f"cannot move the part file begun while planning into place ({e})") from e
            with atomic_path(part) as tmp:
                shutil.copyfile(src, tmp)
            src.unlink()
    target_bytes = _write_targets(list(tier_targets or []) + list(dcache_targets or []), feats, shard, rb)
    return {"shard": p, "crc": crc, "rows": rows_total, "bytes_read": feats.bytes_read, "bytes_written": rows_total * rb,
            "file_bytes": w.written, "target_bytes_written": target_bytes, "seconds": time.perf_counter() - t0}


# (early_dir, shard) -> (the shard file's identity, its memory map)
_EARLY_MAPS: dict[tuple[str, int], tuple[tuple[Any, ...], np.ndarray]] = {}
_EARLY_MAPS_LOCK = threading.Lock()


def _early_map(early_dir: str, p: int, shard: FeatureShard, store: Store) -> np.ndarray:
    """Shard `p` mapped for `pack_early`, kept between its tasks of one run: mapping and unmapping the
    read-ahead shards afresh for every superbatch took a fifth of each task. Maps kept for another
    run's directory (a run that failed, or whose last early task ran in another process) are dropped;
    a map is reused only for the same file, unchanged (path, place, inode, size, mtime)."""
    try:
        st = os.stat(shard.path)
    except OSError as e:
        raise InputError(shard.path, f"cannot open feature shard ({e.strerror or e})") from e
    ident = (str(shard.path), shard.offset, shard.rows, st.st_ino, st.st_size, st.st_mtime_ns)
    key = (early_dir, p)
    with _EARLY_MAPS_LOCK:
        for k in [k for k in _EARLY_MAPS if k[0] != early_dir]:
            del _EARLY_MAPS[k]
        kept = _EARLY_MAPS.get(key)
    if kept is not None and kept[0] == ident:
        return kept[1]
    mapped = map_shard(shard, store.feature_dtype, store.feature_dim, populate=True)
    store.checks.check_view(shard.path, shard.offset, mapped, f"prepare's pack pass, shard {p}")
    with _EARLY_MAPS_LOCK:
        _EARLY_MAPS[key] = (ident, mapped)
    return mapped


def release_early_maps(early_dir: str | os.PathLike[str] | None = None, shard: int | None = None) -> None:
    """Unmap what `pack_early` kept in this process: for `early_dir` (None: every run), shard `shard` (None:
    all). Mapped pages are not dropped from the page cache (``POSIX_FADV_DONTNEED``), so every run ends with
    this: its last early task, each shard's pack task and a failed run's clean-up call it."""
    with _EARLY_MAPS_LOCK:
        for k in [k for k in _EARLY_MAPS
                  if (early_dir is None or k[0] == str(early_dir)) and (shard is None or k[1] == shard)]:
            del _EARLY_MAPS[k]


def pack_early(store_path: str | os.PathLike[str], shards: Sequence[int], route: dict[str, Any],
               early_dir: str | os.PathLike[str], previous: dict[int, EarlyPart] | None = None, *,
               final: bool = False, min_cached: float = RESIDENT, write_buffer: int = WRITE_BUFFER,
               check_crc: bool | None = None) -> dict[int, EarlyPart]:
    """Begin the part files of read-ahead shards while later superbatches are still being planned.

    Batched packing must wait for the last route before it reads a shard, since a shard is read
    once for the whole round; the disk meanwhile sits idle while the plan chain runs. A shard the
    read-ahead (`warm_shards`) already holds in the page cache costs no disk read, so its segments
    for a superbatch can be written as soon as that superbatch is routed. This task appends the
    segments of `route` (one superbatch's routing result) to ``early_dir/part-p.bin`` for every
    shard in `shards` that is still resident and whose part file ends where this superbatch
    begins, gathering rows from a memory map of the shard (no copy, no read). The writes overlap
    the chain instead of the pack phase; `pack_shard` appends the rest of the round (`EarlyPart`).

    A shard mostly evicted (less than `min_cached` of its pages in the page cache) is left where
    it stands: it would cost random reads here, and the pack phase reads it whole. The shards' maps
    are kept for the run's next early task (`release_early_maps`); `final`: the run's last early task,
    which lets them go (so does any task that fails). Returns the shards' states (`previous` updated;
    shards never begun are absent).
    """
    store = Store(store_path, check_crc=check_crc)
    states = dict(previous or {})
    first, rb = int(route["first_batch"]), store.row_bytes
    out = Path(early_dir)
    out.mkdir(parents=True, exist_ok=True)
    rf = RouteFile(route["path"])
    # Shard by shard, each shard's writes left in flight while the next shard is gathered: the task
    # then takes about as long as its writes, not their sum with the gathering. Two writers at most
    # are alive, each on its own set of this thread's buffers (`SegmentWriter._thread_buffers`).
    open_: tuple[SegmentWriter, int, int, EarlyPart | None, np.ndarray, int] | None = None

    def close_previous(ok: bool) -> None:
        nonlocal open_
        if open_ is None:
            return
        w, fd, p, prev, crc, rows = open_
        open_ = None
        try:
            if ok:
                w.finish()
        finally:
            w.close()
            os.close(fd)
        states[p] = EarlyPart(str(out / part_name(p)), first + rf.num_batches, w.written,
                              (prev.rows if prev else 0) + rows,
                              np.concatenate([prev.crc if prev else np.zeros(0, np.int64), crc[first:]]))

    ok = False
    try:
        if rf.first_batch != first:
            raise InputError(rf.path, f"starts at batch {rf.first_batch}, the route task said {first}")
        nb = rf.num_batches
        sizes = np.asarray(padded(rf.seg_rows.astype(np.int64) * rb), dtype=np.int64)    # [nb, P]
        buf = int(min(write_buffer, max(int(sizes[:, list(shards)].sum(axis=0).max()) if len(shards) else 0, ALIGN)))
        opened = 0
        for p in shards:
            prev = states.get(p)
            if (prev.batches if prev is not None else 0) != first:
                continue                                   # fell behind: the pack phase carries on from prev
            shard = store.shards[p]
            if _shard_cached_share(shard, shard.rows * rb) < min_cached:
                continue
            path = out / part_name(p)
            fd, direct = open_new(path) if prev is None else _open_part(path, prev.position)
            position = 0 if prev is None else prev.position
            col = np.zeros(first + nb, dtype=np.int64)
            col[first:] = position + np.r_[0, np.cumsum(sizes[:, p])[:-1]]
            crc = np.zeros(first + nb, dtype=np.int64)
            try:
                w = SegmentWriter(fd, path, buf, rb, direct, start=position, tag=("segments", "early")[opened % 2])
                opened += 1
            except BaseException:
                os.close(fd)
                raise
            try:
                mapped = _early_map(str(early_dir), p, shard, store)
                rows = _append_segments(w, rf, p, shard, lambda m=mapped: m, col, crc)
                del mapped
                w.flush()                                  # whole pages (segments are padded): all in flight
            except BaseException:
                w.close()
                os.close(fd)
                raise
            close_previous(True)
            open_ = (w, fd, p, prev, crc, rows)
        ok = True
    finally:
        close_previous(ok)
        rf.close()
        if final or not ok:
            release_early_maps(early_dir)
    return states


def write_tier_rows(store_path: str | os.PathLike[str], p: int, targets: Sequence[RowTarget],
                    read_chunk: int = READ_CHUNK, check_crc: bool | None = None) -> dict[str, Any]:
    """Fill the tier/disk-cache rows that live in shard p, with no packed segments (the Ginex layout).

    Reads shard p once, sequentially, like `pack_shard`.
    """
    store = Store(store_path, check_crc=check_crc)
    shard = store.shards[p]
    feats = _LazyShard(shard, store.feature_dtype, store.feature_dim, read_chunk, checks=store.checks)
    written = _write_targets(list(targets), feats, shard, store.row_bytes)
    return {"shard": p, "bytes_read": feats.bytes_read, "target_bytes_written": written}

