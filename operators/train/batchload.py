"""Reading a batch's disk rows: the load stage of a `PackedLoader`, one batch at a time.

`BatchLoad._pieces`: a batch's packed segments (page-aligned requests, one per segment or segment
part), its disk-cache rows (page-merged) and, for the Ginex layout, its store rows (one O_DIRECT
request per row) are read by the native reader into fixed staging buffers; a batch larger than one
buffer becomes several `Piece`s (a segment cut at a row), which the assemble stage
(`assemble.BatchAssembly`) places in the batch's feature matrix.

Kept apart from the assembly because the two stages share only the `Piece` between them: this one
knows the files, offsets, pages and bounce buffers; that one the tiers, the device and the shared
tier's turns.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InputError
from ...native.constants import ALIGN
from ...native.reader import DirectReader
from ..formats.intwidth import byte_offsets
from ..formats.packed import SRC_DCACHE, SRC_PACKED, SRC_STORE, PackedDataset, padded
from ..formats.packedindex import IndexRecord

__all__ = ["BatchLoad", "BatchPlan", "Piece", "make_reader"]


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


@dataclass
class BatchPlan:
    """A batch's reads before any is made (`BatchLoad._plan`): what each piece reads, in order, and where
    its packed rows go in the batch."""

    batch: int
    record: IndexRecord
    yield_it: bool
    specs: list[tuple[str, Any]]    # ("packed", [(shard, first row, end row, offset, length)]) or (kind, positions)
    packed_pos: np.ndarray          # n_id position of the batch's packed row r
    first_row: np.ndarray           # each shard segment's first packed row
    rows_k: np.ndarray              # rows of each shard segment


class BatchLoad:
    """The load stage of a `PackedLoader` (`_pieces`: a batch's disk rows read into staging buffers,
    piece by piece) and the files it reads (`_handle`, `store`).

    A mixin over the loader's state, which `PackedLoader` sets up, owns and closes: the dataset,
    the reader and its open files, the CPU tier (for its bounds), the bounce buffer.
    """

    ds: PackedDataset
    path: Path
    row_dim: int                          # a stored row's width (an encoded row: its bytes)
    dtype: np.dtype
    row_bytes: int
    memory: dict[str, Any]
    check_crc: bool
    reader: Any
    cpu: np.ndarray
    _handles: dict[Path, int]
    _file_sizes: dict[int, int]
    _dcache_rows: list[int]
    _store: Any
    _store_path: str | os.PathLike[str] | None
    _shard_files: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    _bounce: np.ndarray | None

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

    def _pieces(self, g: int, rec: IndexRecord, take: Callable[[], np.ndarray], yield_it: bool) -> Iterator[Piece]:
        """Read batch `g`'s disk rows, piece by piece, each into a staging buffer from `take()`.

        Packed segments first (page-aligned requests, one per segment or segment part; a segment
        that does not fit the rest of a buffer is cut at a row), then disk-cache rows, then store
        rows. However large the batch, the load stage holds at most one buffer's worth of it.
        """
        yield from self._read_planned(self._plan(g, rec, yield_it), take)

    def _plan(self, g: int, rec: IndexRecord, yield_it: bool) -> BatchPlan:
        """Batch `g`'s requests, cut into staging-buffer pieces (`_pieces`' first half: no file is read).

        Apart so that a pipelined loader plans the next batch while this one's reads are in flight.
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
        return BatchPlan(g, rec, yield_it, specs, packed_pos, first_row, rows_k)

    def _read_planned(self, plan: BatchPlan, take: Callable[[], np.ndarray]) -> Iterator[Piece]:
        """A planned batch's pieces (`_plan`), each read into a staging buffer from `take()`."""
        g, rec, yield_it, specs = plan.batch, plan.record, plan.yield_it, plan.specs
        packed_pos, first_row, rows_k = plan.packed_pos, plan.first_row, plan.rows_k
        rb, idx = self.row_bytes, rec.idx
        if not specs:
            yield Piece(g, rec, None, np.zeros((0, self.row_dim), self.dtype), np.zeros(0, np.int64), True, True, yield_it)
            return
        for i, (kind, what) in enumerate(specs):
            buf = take()
            segments: list[tuple[int, int, int, bool]] = []
            if kind == "packed":
                pos, nbytes = self._read_packed(g, rec, what, buf, segments, packed_pos, first_row, rows_k)
            else:
                pos, nbytes = what, what.size * rb
            rows = buf[:nbytes].view(self.dtype).reshape(-1, self.row_dim)
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
        if self.check_crc and store.checks.active:      # the blocks these rows lie in, once per process
            for p in np.unique(shard).tolist():          # a loop per shard touched, not per row
                local = ids[shard == p] - store.shards[p].row_start
                store.check_rows(int(p), local, f"the packed loader's store reads, batch {g}")
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
            out[sel] = elems[first[:, None] + np.arange(self.row_dim)[None, :]]
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
