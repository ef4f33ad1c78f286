"""Reading a batch's disk rows and assembling its feature matrix: the load and assemble stages of a
`PackedLoader`, one batch at a time.

Load (`BatchAssembly._pieces`): a batch's packed segments (page-aligned requests, one per segment
or segment part), its disk-cache rows (page-merged) and, for the Ginex layout, its store rows
(one O_DIRECT request per row) are read by the native reader into fixed staging buffers; a batch
larger than one buffer becomes several `Piece`s (a segment cut at a row). Assemble
(`BatchAssembly._assemble`): the first piece of a batch gathers its GPU- and CPU-tier rows into its
matrix, every piece places its rows (segment crcs checked), the last applies the planned CPU-tier
inserts; on CUDA through pinned buffers and gathers on the device.

Kept apart from the loader so that what a batch *is* (ids, pieces, rows per source) reads on its
own, away from the loader's life cycle (setup, epochs, streaming, the pool, the stage threads).
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...errors import InputError
from ...native.constants import ALIGN
from ...native.kernels import copy_rows
from ...native.reader import DirectReader
from ..formats.checksum import crc32
from ..formats.intwidth import byte_offsets
from ..formats.packed import (
    SRC_CPU,
    SRC_DCACHE,
    SRC_GPU,
    SRC_PACKED,
    SRC_STORE,
    IndexRecord,
    PackedDataset,
    padded,
)

__all__ = ["SOURCES", "BatchAssembly", "Piece", "SourceCounts", "make_reader"]


# Row reads (store rows of the Ginex layout, disk-cache pages) go through bounce buffers of the
# engine's DEFAULT_BOUNCE_BYTES (native/constants.h): the loader's own for one-request-per-row reads,
# and the native reader's for page-merged reads (the reader's defaults, merge size included).
def make_reader(direct: bool = True) -> DirectReader:
    """The native direct-I/O reader (io_uring, else a pread pool) with the engine's defaults.

    Its bounce buffer for page-merged row reads is `DEFAULT_BOUNCE_BYTES`, which the memory budget
    counts (`memory.io_buffer_bytes`).
    """
    return DirectReader(backend="auto", direct=direct)


def _open(reader: Any, path: Path) -> int:
    """Open `path` with the reader; a missing file is an InputError naming it."""
    try:
        return int(reader.open(str(path)))
    except OSError as e:
        raise InputError(path, f"cannot open for reading ({e.strerror or e})") from e


@dataclass
class Piece:
    """Some of a batch's disk rows after the load stage, in one staging buffer.

    A batch is one or more pieces, in order: the first opens it (the assemble stage gathers its
    GPU- and CPU-tier rows), the last closes it (checksums complete, CPU-tier inserts). A batch
    with no disk rows is one piece with no buffer.
    """

    batch: int
    record: IndexRecord
    buffer: np.ndarray | None   # the staging buffer (back to the pool after assembly), None: no disk rows
    rows: np.ndarray            # [m, dim] view into the buffer
    pos: np.ndarray             # int64 [m]: the n_id position of each row
    first: bool
    last: bool
    yield_it: bool              # False while fast-forwarding the CPU tier
    segments: list[tuple[int, int, int, bool]] = field(default_factory=list)
    """(shard, byte in buffer, bytes, the segment ends here) of each packed segment part: crc due."""


SOURCES = ("gpu", "cpu", "packed", "dcache", "store")


@dataclass
class SourceCounts:
    """Rows per source (GPU, CPU, packed, disk cache, store) over the yielded batches."""

    rows: np.ndarray = field(default_factory=lambda: np.zeros(5, np.int64))
    useful_bytes: int = 0


class BatchAssembly:
    """The per-batch work of a `PackedLoader`: its load stage (`_pieces`: a batch's disk rows read
    into staging buffers, piece by piece) and its assemble stage (`_assemble`: the pieces placed,
    with the tiers' rows, in the batch's feature matrix, on the host or the device).

    A mixin over the loader's state, which `PackedLoader` sets up, owns and closes: the dataset,
    the reader and its open files, the tiers, the staging, bounce and tier buffers. The loader
    also lends the batch matrices (`_batch_matrix`) and takes back a fast-forwarded batch's
    (`_reclaim`), from its pool.
    """

    ds: PackedDataset
    path: Path
    device: torch.device
    dim: int
    dtype: np.dtype
    row_bytes: int
    memory: dict[str, Any]
    check_crc: bool
    reader: Any
    gpu: Any
    cpu: np.ndarray
    counts: SourceCounts
    _handles: dict[Path, int]
    _file_sizes: dict[int, int]
    _dcache_rows: list[int]
    _store: Any
    _store_path: str | os.PathLike[str] | None
    _shard_files: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    _bounce: np.ndarray | None
    _tier_buffer: np.ndarray | None
    _shared: Any                          # a `shared_tier.SharedTier` (--cache shared), or None
    _shared_published: bool               # rank 0 has marked the shared tier ready
    _global: dict[int, int]               # with a shared tier: this loader's batch -> the stream's batch
    _stream: Any
    _device_path: bool
    _open_batch: tuple[Any, np.ndarray | None, dict[int, int]] | None
    _tier_next: int
    _batch_matrix: Callable[[int], np.ndarray]
    _reclaim: Callable[[np.ndarray], None]

    # ------------------------------------------------------------------ files
    def _handle(self, path: Path) -> int:
        h = self._handles.get(path)
        if h is None:
            h = self._handles[path] = _open(self.reader, path)
            try:
                self._file_sizes[h] = path.stat().st_size
            except OSError as e:
                raise InputError(path, f"cannot stat ({e.strerror or e})") from e
        return h

    @property
    def store(self) -> Any:
        """The store (opened and checked against the manifest on first use: Ginex rows, evaluation)."""
        if self._store is None:
            from ..formats.verify import open_store
            self._store = open_store(self.ds, self._store_path)
        return self._store

    # ------------------------------------------------------------------ stage 1: load
    def _pieces(self, g: int, rec: IndexRecord, take: Callable[[], np.ndarray], yield_it: bool) -> Iterator[Piece]:
        """Read batch `g`'s disk rows, piece by piece, each into a staging buffer from `take()`.

        Packed segments first (page-aligned requests, one per segment or segment part; a segment
        that does not fit the rest of a buffer is cut at a row), then disk-cache rows, then store
        rows. However large the batch, the load stage holds at most one buffer's worth of it.
        """
        rb = self.row_bytes
        src, idx = rec.src, rec.idx
        self.ds._check_bounds(rec, int(self.ds.gpu_ids.shape[0]), int(self.cpu.shape[0]), rec.packed_rows,
                              self._dcache_rows[rec.dcache] if 0 <= rec.dcache < len(self._dcache_rows) else None)
        rows_k = rec.seg_rows.astype(np.int64)
        first_row = np.r_[0, np.cumsum(rows_k)].astype(np.int64)     # packed rows are shard-major
        ppos = np.flatnonzero(src == SRC_PACKED)
        if ppos.size != int(first_row[-1]):
            raise InputError(self.ds.round_dir / "index", f"batch {g}: {ppos.size} packed positions, the segments "
                                                          f"hold {int(first_row[-1])} rows")
        packed_pos = np.empty(ppos.size, np.int64)
        packed_pos[idx[ppos]] = ppos                    # n_id position of the batch's packed row r
        dpos = np.flatnonzero(src == SRC_DCACHE)
        spos = np.flatnonzero(src == SRC_STORE)
        cap = int(self.memory["staging_piece_bytes"])
        per_piece = max(1, (cap - 2 * ALIGN) // rb)     # rows of a row-read piece
        specs: list[tuple[str, Any]] = []
        parts: list[tuple[int, int, int, int, int]] = []    # (shard, first row, end row, file offset, length)
        used = 0
        for p in np.flatnonzero(rows_k).tolist():
            off, n, r0 = int(rec.seg_offset[p]), int(rows_k[p]), 0
            while r0 < n:
                start = (off + r0 * rb) // ALIGN * ALIGN
                r1 = min(n, (start + (cap - used) // ALIGN * ALIGN - off) // rb)
                if r1 <= r0:
                    if not parts:
                        raise InputError(self.path / "manifest.json", f"batch {g}: a {rb}-byte row does not fit a "
                                                                      f"{cap}-byte staging buffer")
                    specs.append(("packed", parts))
                    parts, used = [], 0
                    continue
                length = int(padded(off + r1 * rb)) - start
                parts.append((p, r0, r1, start, length))
                used += length
                r0 = r1
        if parts:
            specs.append(("packed", parts))
        specs += [("dcache", dpos[a:a + per_piece]) for a in range(0, dpos.size, per_piece)]
        specs += [("store", spos[a:a + per_piece]) for a in range(0, spos.size, per_piece)]
        if not specs:
            yield Piece(g, rec, None, np.zeros((0, self.dim), self.dtype), np.zeros(0, np.int64), True, True, yield_it)
            return
        for i, (kind, what) in enumerate(specs):
            buf = take()
            segments: list[tuple[int, int, int, bool]] = []
            if kind == "packed":
                pos, nbytes = self._read_packed(g, rec, what, buf, segments, packed_pos, first_row, rows_k)
            else:
                pos, nbytes = what, what.size * rb
            rows = buf[:nbytes].view(self.dtype).reshape(-1, self.dim)
            if kind == "dcache":
                path = self.ds.dcache_path(rec.dcache)
                try:
                    self.reader.read_rows(self._handle(path), byte_offsets(idx[pos], rb), rb, buf[:nbytes])
                except OSError as e:
                    raise InputError(path, f"batch {g}: disk-cache read failed ({e.strerror or e})") from e
            elif kind == "store":
                self._read_store_rows(g, idx[pos], rows)
            yield Piece(g, rec, buf, rows, pos, i == 0, i == len(specs) - 1, yield_it, segments)

    def _read_packed(self, g: int, rec: IndexRecord, parts: list[tuple[int, int, int, int, int]], buf: np.ndarray,
                     segments: list[tuple[int, int, int, bool]], packed_pos: np.ndarray, first_row: np.ndarray,
                     rows_k: np.ndarray) -> tuple[np.ndarray, int]:
        """Read segment parts into `buf` with one batch of requests, then close the padding gaps so the
        rows lie back to back; returns their n_id positions and their bytes."""
        rb = self.row_bytes
        lengths = np.array([x[4] for x in parts], np.int64)
        out_off = np.r_[0, np.cumsum(lengths)[:-1]].astype(np.int64)
        handles = np.array([self._handle(self.ds.part_paths[x[0]]) for x in parts], np.int64)
        try:
            self.reader.read(handles, np.array([x[3] for x in parts], np.int64), lengths, buf, out_off)
        except OSError as e:
            p = next((x[0] for x in parts if str(self.ds.part_paths[x[0]]) == str(e.filename)), parts[0][0])
            raise InputError(self.ds.part_paths[p], f"truncated or unreadable: batch {g}, shard {p} needs bytes "
                                                    f"[{int(rec.seg_offset[p])}, "
                                                    f"{int(rec.seg_offset[p] + padded(rows_k[p] * rb))}) "
                                                    f"({e.strerror or e})") from e
        dst = 0
        pos = []
        for (p, r0, r1, start, _), at in zip(parts, out_off.tolist(), strict=True):
            s, n = at + int(rec.seg_offset[p]) + r0 * rb - start, (r1 - r0) * rb
            if dst != s:
                buf[dst:dst + n] = buf[s:s + n]
            if self.check_crc:                 # checked by the assemble stage, while this one reads on
                segments.append((p, dst, n, r1 == int(rows_k[p])))
            pos.append(packed_pos[int(first_row[p]) + r0:int(first_row[p]) + r1])
            dst += n
        return np.concatenate(pos), dst

    def _read_store_rows(self, g: int, ids: np.ndarray, out: np.ndarray) -> None:
        """The Ginex baseline: one O_DIRECT request per row, at shard data offset + local row x row_bytes.

        A row whose last page runs past the end of its shard file (the file is not padded) is
        read with `read_rows`, which allows that; all others through the loader's bounce buffer.
        """
        store, rb, isz = self.store, self.row_bytes, self.dtype.itemsize
        if self._shard_files is None:    # per shard: handle, byte offset of row 0, file size
            hs = [self._handle(s.path) for s in store.shards]
            self._shard_files = (np.array(hs, np.int64),
                                 np.array([s.offset - s.row_start * rb for s in store.shards], np.int64),
                                 np.array([self._file_sizes[h] for h in hs], np.int64))
        shard_handle, shard_base, shard_size = self._shard_files
        shard = ids // store.shard_rows
        handles, sizes = shard_handle[shard], shard_size[shard]
        offsets = byte_offsets(ids, rb, shard_base[shard])
        start = offsets - offsets % ALIGN
        length = padded(offsets + rb) - start
        tail = start + length > sizes
        bounce = self._bounce
        if bounce is None:
            raise RuntimeError("the loader's bounce buffer is not allocated (is the loader closed?)")
        flat_out = out.reshape(-1).view(np.uint8)
        body = np.flatnonzero(~tail)
        cum = np.cumsum(length[body])
        i = 0
        while i < body.size:     # rounds of whole requests that fit the bounce buffer
            base = cum[i - 1] if i else 0
            j = max(i + 1, int(np.searchsorted(cum, base + bounce.nbytes, side="right")))
            sel = body[i:j]
            dst = np.concatenate([[0], np.cumsum(length[sel])[:-1]]).astype(np.int64)
            self._read(handles[sel], start[sel], length[sel], bounce, dst, g)
            first = (dst + offsets[sel] - start[sel]) // isz
            elems = bounce.view(self.dtype)
            out[sel] = elems[first[:, None] + np.arange(self.dim)[None, :]]
            i = j
        for h in np.unique(handles[tail]).tolist():     # per shard: the rows in its last, partial page
            sel = np.flatnonzero(tail & (handles == h))
            tmp = np.empty(sel.size * rb, np.uint8)
            try:
                self.reader.read_rows(h, offsets[sel], rb, tmp)
            except OSError as e:
                raise InputError(e.filename or self.path, f"batch {g}: store row read failed ({e.strerror or e})") from e
            flat_out.reshape(-1, rb)[sel] = tmp.reshape(-1, rb)

    def _read(self, handles: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, out: np.ndarray,
              out_offsets: np.ndarray, g: int) -> None:
        try:
            self.reader.read(handles, offsets, lengths, out, out_offsets)
        except OSError as e:
            raise InputError(e.filename or self.path, f"batch {g}: read failed ({e.strerror or e})") from e

    # ------------------------------------------------------------------ stage 2: assemble
    def _verify(self, pc: Piece, crcs: dict[int, int]) -> None:
        """Fold piece `pc`'s packed bytes into their segments' crc32; check each segment it completes (an
        InputError names the file and the batch)."""
        rec, buf = pc.record, pc.buffer
        if not pc.segments:
            return
        if buf is None:
            raise RuntimeError(f"batch {pc.batch}: a piece with packed segments but no staging buffer")
        for p, start, n, ends in pc.segments:
            crc = crc32(buf[start:start + n].data, crcs.pop(p, 0))
            if not ends:
                crcs[p] = crc
            elif crc != int(rec.seg_crc[p]):
                raise InputError(self.ds.part_paths[p], f"checksum mismatch in batch {pc.batch}, shard {p} (segment "
                                                        f"at byte {int(rec.seg_offset[p])}, {int(rec.seg_rows[p])} rows)")

    def _assemble(self, pc: Piece) -> torch.Tensor | None:
        """Place piece `pc`'s rows in its batch's feature matrix; the batch's matrix once `pc` is its last.

        The first piece of a batch gathers its GPU- and CPU-tier rows; the last checks the
        remaining checksums and applies the batch's CPU-tier inserts (after every read of the tier).
        """
        rec = pc.record
        if pc.first:
            if self._shared is not None:      # the merged stream's order: wait for this batch's turn at the tier
                self._take_turn(pc.batch)
            self._open_batch = (self._begin_device(rec) if self._device_path else self._begin_host(rec),
                                self._insert_slots(rec), {})
        if self._open_batch is None:
            raise RuntimeError(f"batch {pc.batch}: a later piece reached the assemble stage before its first")
        x, slots, crcs = self._open_batch
        self._verify(pc, crcs)
        if pc.rows.shape[0]:
            if self._device_path:
                self._place_device(x, slots, pc)
            else:
                copy_rows(x, pc.pos, pc.rows, np.arange(pc.rows.shape[0], dtype=np.int64))
        if not pc.last:
            return None
        self._open_batch = None
        if crcs:
            raise InputError(self.path / "manifest.json", f"batch {pc.batch}: segments of shards {sorted(crcs)} "
                                                          "were not read to their end")
        if self._device_path:
            self._finish_device(x, rec)
            x_t = x
        else:
            if rec.insert_pos.size:
                copy_rows(self.cpu, np.ascontiguousarray(rec.insert_slot, np.int64), x,
                                  np.ascontiguousarray(rec.insert_pos, np.int64))
            x_t = torch.from_numpy(x)
            if not pc.yield_it:
                self._reclaim(x)        # a fast-forwarded batch: its matrix is free again at once
        self._tier_next = pc.batch + 1
        if self._shared is not None:
            self._shared.pass_turn(self._global[pc.batch])
        if pc.yield_it:
            self.counts.rows += np.bincount(rec.src, minlength=5)[:5]
            self.counts.useful_bytes += int(np.count_nonzero(rec.src >= SRC_PACKED)) * self.row_bytes
        return x_t if pc.yield_it else None

    def _take_turn(self, batch: int) -> None:
        """Wait for `batch`'s turn at the shared CPU tier (rank 0 first marks the tier ready: its first batch
        is the stream's next, and its tier holds the content the stream starts from)."""
        g = self._global.get(batch)
        if g is None:
            raise InputError(self.path / "manifest.json", f"batch {batch} has no place in the merged stream "
                                                          "(a shared CPU tier needs the stream's batch numbers)")
        if not self._shared_published:      # rank 0 marks the tier ready; the others check its shape once
            if self._shared.rank == 0:
                self._shared.publish(g)
            else:
                self._shared.wait_ready()
            self._shared_published = True
        self._shared.wait_turn(g)

    def _begin_host(self, rec: IndexRecord) -> np.ndarray:
        """A batch matrix with the batch's GPU- and CPU-tier rows in place (native row copies)."""
        x = self._batch_matrix(rec.src.shape[0])
        for code, tier in ((SRC_GPU, self.gpu), (SRC_CPU, self.cpu)):
            pos = np.flatnonzero(rec.src == code)
            if pos.size:
                copy_rows(x, pos, tier, np.ascontiguousarray(rec.idx[pos], np.int64))
        return x

    def _insert_slots(self, rec: IndexRecord) -> np.ndarray | None:
        """Per n_id position, the CPU-tier slot its row is inserted into (-1: none); only on the device path,
        where inserts of disk rows are applied from host memory as the rows pass."""
        if not self._device_path or not rec.insert_pos.size:
            return None
        slots = np.full(rec.src.shape[0], -1, np.int64)
        slots[rec.insert_pos] = rec.insert_slot
        return slots

    def _to_device(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(self.device, non_blocking=True)

    def _begin_device(self, rec: IndexRecord) -> torch.Tensor:
        """The batch's matrix on the device, its GPU-tier rows gathered there and its CPU-tier rows copied in
        through the pinned tier buffer (a piece at a time).

        The device work is gathers and index copies to distinct rows, deterministic: ``x[gpos] =
        gpu_tier[idx]``, then ``x[pos] = rows`` for every host piece.
        """
        n = rec.src.shape[0]
        gpos = np.flatnonzero(rec.src == SRC_GPU)
        cpos = np.flatnonzero(rec.src == SRC_CPU)
        dtype = torch.from_numpy(np.zeros(0, self.dtype)).dtype
        gpu = self.gpu if isinstance(self.gpu, torch.Tensor) else torch.from_numpy(self.gpu)
        tier = self._tier_buffer
        if tier is None:
            raise RuntimeError("the loader's CPU-tier buffer is not allocated (is the loader closed?)")
        per = max(1, tier.nbytes // self.row_bytes)
        with torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext():
            x = torch.empty((n, self.dim), dtype=dtype, device=self.device)
            if gpos.size:
                x.index_copy_(0, self._to_device(gpos), gpu.index_select(0, self._to_device(rec.idx[gpos])))
            for a in range(0, cpos.size, per):
                sel = cpos[a:a + per]
                host = tier[:sel.size * self.row_bytes].view(self.dtype).reshape(-1, self.dim)
                copy_rows(host, np.arange(sel.size, dtype=np.int64), self.cpu,
                                  np.ascontiguousarray(rec.idx[sel], np.int64))
                x.index_copy_(0, self._to_device(sel), self._to_device(host))
                if self._stream is not None:
                    self._stream.synchronize()     # the tier buffer is refilled next
        return x

    def _place_device(self, x: torch.Tensor, slots: np.ndarray | None, pc: Piece) -> None:
        """Copy a piece's host rows to their positions in the device matrix; apply the inserts of those rows
        from host memory (every CPU-tier read of the batch is done: its first piece did them)."""
        with torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext():
            x.index_copy_(0, self._to_device(pc.pos), self._to_device(pc.rows))
        if slots is not None:
            to = slots[pc.pos]
            sel = np.flatnonzero(to >= 0)
            if sel.size:
                copy_rows(self.cpu, np.ascontiguousarray(to[sel]), pc.rows, sel.astype(np.int64))
        if self._stream is not None:
            self._stream.synchronize()    # the staging buffer goes back to the pool

    def _finish_device(self, x: torch.Tensor, rec: IndexRecord) -> None:
        """Inserts of rows that came from the tiers, not the disk (rare): read back from the device matrix."""
        if not rec.insert_pos.size:
            return
        tiered = rec.src[rec.insert_pos] < SRC_PACKED
        if tiered.any():
            sel = torch.from_numpy(np.ascontiguousarray(rec.insert_pos[tiered], np.int64)).to(self.device)
            self.cpu[rec.insert_slot[tiered]] = x.index_select(0, sel).cpu().numpy()
