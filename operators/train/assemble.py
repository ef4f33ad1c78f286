"""Assembling a batch's feature matrix: the assemble stage of a `PackedLoader`, one batch at a time.

`BatchAssembly._assemble`: the first piece of a batch (`batchload.Piece`, read by the load stage)
gathers its GPU- and CPU-tier rows into its matrix, every piece places its rows (segment crcs
checked), the last applies the planned CPU-tier inserts; on CUDA through pinned buffers and gathers
on the device. With a shared CPU tier, each batch takes its turn at the tier in the merged stream's order.

Kept apart from the loader so that what a batch *is* (ids, pieces, rows per source) reads on its
own, away from the loader's life cycle (setup, epochs, streaming, the pool, the stage threads), and
apart from the load stage (`batchload`), which knows the files and pages this one never touches.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...errors import InputError
from ...native.kernels import copy_rows
from ..formats.checksum import crc32
from ..formats.packed import SRC_CPU, SRC_GPU, SRC_PACKED, PackedDataset
from ..formats.packedindex import IndexRecord
from .batchload import Piece

__all__ = ["SOURCES", "BatchAssembly", "SourceCounts"]


SOURCES = ("gpu", "cpu", "packed", "dcache", "store")


@dataclass
class SourceCounts:
    """Rows per source (GPU, CPU, packed, disk cache, store) over the yielded batches."""

    rows: np.ndarray = field(default_factory=lambda: np.zeros(5, np.int64))
    useful_bytes: int = 0


class BatchAssembly:
    """The assemble stage of a `PackedLoader` (`_assemble`: a batch's pieces placed, with the tiers'
    rows, in its feature matrix, on the host or the device).

    A mixin over the loader's state, which `PackedLoader` sets up, owns and closes: the dataset,
    the tiers, the tier buffer, the shared tier and the CUDA stream. The loader also lends the
    batch matrices (`_batch_matrix`) and takes back a fast-forwarded batch's (`_reclaim`), from
    its pool.
    """

    ds: PackedDataset
    path: Path
    device: torch.device
    row_dim: int                          # a stored row's width: the features', or an encoded row's bytes
    dtype: np.dtype
    row_bytes: int
    gpu: Any
    cpu: np.ndarray
    counts: SourceCounts
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
            x = torch.empty((n, self.row_dim), dtype=dtype, device=self.device)
            if gpos.size:
                x.index_copy_(0, self._to_device(gpos), gpu.index_select(0, self._to_device(rec.idx[gpos])))
            for a in range(0, cpos.size, per):
                sel = cpos[a:a + per]
                host = tier[:sel.size * self.row_bytes].view(self.dtype).reshape(-1, self.row_dim)
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
