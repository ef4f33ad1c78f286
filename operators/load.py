"""`PackedLoader`: NeighborLoader-shaped batches from a packed dataset, read with direct I/O.

A stock PyG training loop runs over it unchanged::

    loader = PackedLoader("PACKED")
    for batch in loader:
        out = model(batch.x, batch.edge_index)[:batch.batch_size]
        loss = F.cross_entropy(out, batch.y[:batch.batch_size])

Each batch is `operators.batches.batch_data` of the round's stored sample, with `x` assembled
exactly as the plan says (DiskGNN §5.3, Fig. 7), in three stages joined by bounded queues:

1. **load** — the batch's packed segments (one request per non-empty (batch, shard) segment at
   its 4096-aligned offset, length padded to 4096), its disk-cache rows (page-merged) and, for
   the Ginex layout, its store rows (one O_DIRECT request per row), read by the native reader
   into an aligned staging buffer (GIL released); segment crcs checked.
2. **assemble** — one gather into the batch's feature tensor: GPU tier, CPU tier, staged rows;
   then the planned CPU-tier inserts. On CUDA: pinned staging, one non-blocking copy on the
   stage's own stream, the gather on the device.
3. **graph** — the stored sample (ids, local edges, per-hop counts) and `y = labels[n_id]`.

The consumer (the training loop, stage 4) joins the two paths in batch order. With
``pipelined=False`` the same stages run one after another in the caller's thread.

The CPU tier is state: batch i's rows depend on every earlier batch's inserts, so the loader
tracks the position of its tier (`tier_position`) and fast-forwards (runs load + assemble
without yielding) when asked for a later start, or restarts from ``cpu_init`` for an earlier
one. `tier_state`/`restore_tier` let a checkpoint save and restore it.
"""
from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch_geometric.data import Data

from ..native import _native
from ..native.reader import DirectReader, aligned_empty
from .batches import Sample, batch_data
from .checksum import crc32
from .errors import ConfigError, InputError
from .files import ALIGN, format_bytes
from .packed import (
    SRC_CPU,
    SRC_DCACHE,
    SRC_GPU,
    SRC_PACKED,
    SRC_STORE,
    IndexRecord,
    PackedDataset,
    SuperbatchEntry,
    padded,
)
from .samples import Buffer, SampleRecord
from .tiers import in_flight_batches

# Row reads (store rows of the Ginex layout, disk-cache pages) go through bounce buffers of this size:
# the loader's own for one-request-per-row reads, and the native reader's for page-merged reads.
BOUNCE_BYTES = 1 << 20
# Longest run of adjacent pages the reader merges into one request for disk-cache rows.
MERGE_BYTES = 256 << 10
# How often a blocked stage looks up from its queue to see whether the pipeline was stopped.
_POLL_S = 0.05
SOURCES = ("gpu", "cpu", "packed", "dcache", "store")


# ---------------------------------------------------------------------------- the reader

def make_reader(queue_depth: int = 64, threads: int = 4, direct: bool = True) -> DirectReader:
    """The native direct-I/O reader (io_uring, else a pread pool), its row-read buffer bounded.

    Its bounce buffer for page-merged row reads is `BOUNCE_BYTES`, which the memory budget counts.
    """
    return DirectReader(queue_depth=queue_depth, threads=threads, backend="auto", direct=direct,
                        merge_bytes=MERGE_BYTES, bounce_bytes=BOUNCE_BYTES)


def _open(reader: Any, path: Path) -> int:
    """Open `path` with the reader; a missing file is an InputError naming it."""
    try:
        return int(reader.open(str(path)))
    except OSError as e:
        raise InputError(path, f"cannot open for reading ({e.strerror or e})") from e


# ---------------------------------------------------------------------------- memory budget

def staging_buffers(queue_depth: int, sequential: bool = False) -> int:
    """Aligned staging buffers the load stage cycles through."""
    return 1 if sequential else queue_depth + 2


def io_buffer_bytes(num_shards: int, queue_depth: int, sequential: bool = False, row_reads: bool = True) -> int:
    """Host bytes beyond whole batches: segment padding in the staging buffers and bounce buffers."""
    return staging_buffers(queue_depth, sequential) * (num_shards + 1) * ALIGN + (2 * BOUNCE_BYTES if row_reads else 0)


def memory_plan(ds: PackedDataset, device: torch.device, queue_depth: int, sequential: bool) -> dict[str, int]:
    """The host and device bytes a loader over `ds` uses, from the manifest (nothing is read).

    ``host_bytes`` = CPU tier + in-flight batches x largest batch + I/O buffers (+ the GPU tier
    itself when training on the CPU, where it is host memory too).
    """
    rb = ds.row_bytes
    max_rows = int(ds.manifest["round"].get("max_batch_rows", 0))
    row_reads = bool(ds.dcache_files) or not ds.manifest.get("config", {}).get("packing", True)
    plan = {
        "row_bytes": rb,
        "max_batch_rows": max_rows,
        "in_flight_batches": in_flight_batches(queue_depth, sequential),
        "gpu_tier_bytes": int(ds.gpu_ids.shape[0]) * rb,
        "cpu_tier_bytes": int(ds.cpu_ids.shape[0]) * rb,
        "batch_bytes": in_flight_batches(queue_depth, sequential) * max_rows * rb,
        "io_buffer_bytes": io_buffer_bytes(ds.num_shards, queue_depth, sequential, row_reads),
    }
    plan["host_bytes"] = plan["cpu_tier_bytes"] + plan["batch_bytes"] + plan["io_buffer_bytes"] + (
        plan["gpu_tier_bytes"] if device.type != "cuda" else 0)
    plan["device_bytes"] = plan["gpu_tier_bytes"] if device.type == "cuda" else 0
    return plan


def check_memory(plan: dict[str, int], cpu_memory: int | None, gpu_memory: int | None) -> None:
    """Refuse, before anything is allocated, a run that cannot fit its budgets (naming the option).

    Raises:
        ConfigError: ``--cpu-memory`` below ``host_bytes``, or ``--gpu-memory`` below the GPU tier.
    """
    if cpu_memory is not None and plan["host_bytes"] > cpu_memory:
        raise ConfigError("--cpu-memory", (
            f"{format_bytes(cpu_memory)} ({cpu_memory:,} bytes) is too small: the CPU tier "
            f"({format_bytes(plan['cpu_tier_bytes'])}) + {plan['in_flight_batches']} batches in flight x "
            f"{plan['max_batch_rows']:,} rows x {plan['row_bytes']} bytes ({format_bytes(plan['batch_bytes'])}) + I/O "
            f"buffers ({format_bytes(plan['io_buffer_bytes'])})"
            + (f" + the GPU tier held in host memory ({format_bytes(plan['gpu_tier_bytes'])})"
               if plan["device_bytes"] == 0 and plan["gpu_tier_bytes"] else "")
            + f" need at least {plan['host_bytes']:,} bytes ({format_bytes(plan['host_bytes'])}); raise it, lower "
              "--queue-depth, or prepare with a smaller CPU tier"))
    if gpu_memory is not None and plan["device_bytes"] > gpu_memory:
        raise ConfigError("--gpu-memory", (
            f"{format_bytes(gpu_memory)} cannot hold the GPU tier of {format_bytes(plan['device_bytes'])} "
            f"({plan['device_bytes']:,} bytes); raise it or prepare with a smaller --gpu-memory"))


# ---------------------------------------------------------------------------- pipeline plumbing

class _Stopped(Exception):
    """Raised inside a stage when the pipeline was asked to stop (never escapes the loader)."""


@dataclass
class StageClock:
    """Seconds a stage spent working (`busy`), waiting for input (`starved`) and for room (`blocked`)."""

    busy: float = 0.0
    starved: float = 0.0
    blocked: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {"busy_s": self.busy, "starved_s": self.starved, "blocked_s": self.blocked}


class _Pipe:
    """Bounded queues between stage threads, a stop flag, and the first error of any stage."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._lock = threading.Lock()

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = exc
        self.stop.set()

    def check(self) -> None:
        if self.error is not None:
            raise self.error
        if self.stop.is_set():
            raise _Stopped()

    def put(self, q: queue.Queue, item: Any, clock: StageClock) -> None:
        t = time.perf_counter()
        try:
            while True:
                self.check()
                try:
                    q.put(item, timeout=_POLL_S)
                    return
                except queue.Full:
                    continue
        finally:
            clock.blocked += time.perf_counter() - t

    def get(self, q: queue.Queue, clock: StageClock) -> Any:
        t = time.perf_counter()
        try:
            while True:
                try:
                    return q.get(timeout=_POLL_S)
                except queue.Empty:
                    self.check()
        finally:
            clock.starved += time.perf_counter() - t


_END = object()   # end of a stage's stream


@dataclass
class _Staged:
    """A batch after the load stage: its record and its disk rows in an aligned staging buffer."""

    batch: int
    record: IndexRecord
    buffer: np.ndarray          # the staging buffer (returned to the pool after assembly)
    rows: np.ndarray            # [k + d + s, dim] view: packed rows, disk-cache rows, store rows
    miss_pos: np.ndarray        # n_id positions of those rows
    miss_row: np.ndarray        # row of `rows` for each position
    yield_it: bool              # False while fast-forwarding the CPU tier
    segments: list[tuple[int, int, int]] = field(default_factory=list)   # (shard, byte in buffer, bytes): crc due


@dataclass
class _Counts:
    """Rows per source (GPU, CPU, packed, disk cache, store) over the yielded batches."""

    rows: np.ndarray = field(default_factory=lambda: np.zeros(5, np.int64))
    useful_bytes: int = 0


# ---------------------------------------------------------------------------- the loader

class PackedLoader:
    """Iterate a packed dataset's round as PyG `Data` batches (NeighborLoader's fields).

    Args:
        packed_dir: a finished packed dataset (`diskflow prepare`).
        device: "cpu" or a CUDA device. On CUDA the GPU tier is a device tensor, the CPU tier
            and the staging buffers are pinned, and `batch.x` is assembled on the device.
        cpu_memory: host-memory budget in bytes (CPU tier + in-flight batches + I/O buffers);
            checked before anything is allocated. None: not checked.
        queue_depth: capacity of each queue between stages.
        pipelined: run load / assemble / graph in their own threads (False: one after another).
        check_crc: check every packed segment's crc32 (a mismatch is an InputError naming the
            file, the batch and the shard).
        reader: a reader with the native `DirectReader` interface (default: `make_reader()`).
        store: the store the dataset was prepared from (default: the manifest's); needed only
            by the Ginex layout, which reads its misses from the store's shard files.
        gpu_memory: device budget in bytes for the GPU tier; checked like ``cpu_memory``.
        held: index and samples files held in memory instead of on disk (`PackedDataset`'s
            ``held``; a streamed superbatch).

    Iterating yields every batch of the round (all its epochs) in order; `set_epoch` selects
    one epoch (and optionally a first batch within it), as a trainer does.
    """

    def __init__(self, packed_dir: str | os.PathLike[str], device: str | torch.device = "cpu",
                 cpu_memory: int | None = None, queue_depth: int = 2, pipelined: bool = True,
                 check_crc: bool = True, reader: Any = None, *, store: str | os.PathLike[str] | None = None,
                 gpu_memory: int | None = None, held: Mapping[str, Buffer] | None = None) -> None:
        if isinstance(queue_depth, bool) or not isinstance(queue_depth, int) or queue_depth < 1:
            raise ConfigError("--queue-depth", f"expected an integer >= 1, got {queue_depth!r}")
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ConfigError("--device", f"not a torch device: {device!r}") from e
        if self.device.type not in ("cpu", "cuda"):
            raise ConfigError("--device", f"expected 'cpu' or 'cuda[:N]', got {device!r}")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError("--device", f"{device!r} requested but CUDA is not available on this machine")
        self.ds = PackedDataset(packed_dir, held)
        self.path = self.ds.path
        self.queue_depth = queue_depth
        self.pipelined = bool(pipelined)
        self.check_crc = bool(check_crc)
        self.dim, self.dtype, self.row_bytes = self.ds.dim, self.ds.dtype, self.ds.row_bytes
        self.memory = memory_plan(self.ds, self.device, queue_depth, not self.pipelined)
        check_memory(self.memory, cpu_memory, gpu_memory)
        self._cpu_memory = cpu_memory
        self.num_classes = int(self.ds.manifest.get("num_classes", 0))
        self.labels = self._labels()
        self._store_path = store
        self._store: Any = None
        self._own_reader = reader is None
        self.reader = reader if reader is not None else make_reader()
        self._handles: dict[Path, int] = {}
        self._file_sizes: dict[int, int] = {}
        self._dcache_rows = [int(f["rows"]) for f in self.ds.dcache_files]
        self.superbatches = sorted(self.ds.superbatches, key=lambda s: s.first_batch)
        self.num_batches = self.ds.num_batches
        self._epoch: int | None = None
        self._start = 0
        self._stream: Any = None
        # Assemble with the device path (pinned block + gathers on the device); always on CUDA. Tests
        # switch it on for a CPU loader to check the same index arithmetic without a GPU.
        self._device_path = self.device.type == "cuda"
        self._pinned: list[int] = []
        self._buffers: list[np.ndarray] = []
        self._matrices: list[np.ndarray] = []   # batch feature matrices, reused once no batch holds them
        self._bounce: np.ndarray | None = None
        self._shard_files: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._init_tiers()
        self.counts = _Counts()
        self.clocks: dict[str, StageClock] = {k: StageClock() for k in ("load", "assemble", "graph", "train")}
        self.stage_s: dict[str, float] = {}
        self._closed = False

    # ------------------------------------------------------------------ setup
    def _labels(self) -> np.ndarray:
        name = self.ds.manifest.get("labels")
        if not name:
            raise InputError(self.path / "manifest.json", "no labels (prepared by an older version; re-run "
                                                          "`diskflow prepare --force`)")
        p = self.path / str(name)
        try:
            labels = np.load(p)
        except (OSError, ValueError) as e:
            raise InputError(p, f"unreadable labels ({e})") from e
        if labels.shape != (self.ds.num_nodes,) or labels.dtype.kind not in "iu":
            raise InputError(p, f"expected int labels [{self.ds.num_nodes}], found {labels.dtype}{list(labels.shape)}")
        return labels.astype(np.int64, copy=False)

    def _init_tiers(self) -> None:
        gpu = np.array(self.ds.gpu_cache)
        self.gpu: Any
        if self.device.type == "cuda":
            self.gpu = torch.from_numpy(gpu).to(self.device)
            torch.cuda.synchronize(self.device)      # the assemble stage reads it from its own stream
        else:
            self.gpu = gpu
        self._cpu_init_rows = self.ds.cpu_init
        c = self.ds.cpu_ids.shape[0]
        if self.device.type == "cuda":
            dtype = torch.from_numpy(np.zeros(0, self.dtype)).dtype
            self.cpu = torch.empty((c, self.dim), dtype=dtype, pin_memory=True).numpy()
        else:
            self.cpu = np.empty((c, self.dim), dtype=self.dtype)
        self.cpu_ids = np.empty(c, np.int64)
        self._reset_tier()

    def _reset_tier(self) -> None:
        """The CPU tier as at round start (``cpu_init``), positioned before batch 0."""
        self.cpu[:] = self._cpu_init_rows
        self.cpu_ids[:] = self.ds.cpu_ids
        self._tier_next = 0

    @property
    def tier_position(self) -> int:
        """The global batch whose inserts the CPU tier takes next (all earlier ones are applied)."""
        return self._tier_next

    def tier_state(self) -> tuple[int, np.ndarray, np.ndarray]:
        """(position, rows [C, dim], ids [C]) of the CPU tier: what a checkpoint saves (no copy)."""
        return self._tier_next, self.cpu, self.cpu_ids

    def restore_tier(self, position: int, rows: np.ndarray | None = None, ids: np.ndarray | None = None) -> None:
        """Set the CPU tier to a saved state at `position` (None rows: the round-start tier, position 0)."""
        if rows is None:
            self._reset_tier()
            return
        if rows.shape != self.cpu.shape or rows.dtype != self.cpu.dtype or ids is None or ids.shape != self.cpu_ids.shape:
            raise InputError(self.path, f"saved CPU tier {rows.dtype}{list(rows.shape)} does not fit this dataset's "
                                        f"{self.cpu.dtype}{list(self.cpu.shape)}")
        if not 0 <= position <= self.num_batches:
            raise InputError(self.path, f"saved CPU tier position {position} is outside the round")
        self.cpu[:] = rows
        self.cpu_ids[:] = ids
        self._tier_next = int(position)

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
            from .verify import open_store
            self._store = open_store(self.ds, self._store_path)
        return self._store

    def _alloc(self) -> None:
        """Staging buffers (pinned on CUDA) and the row-read bounce buffer, sized from the manifest."""
        if self._buffers:
            return
        cap = int(padded(self.memory["max_batch_rows"] * self.row_bytes)) + self.ds.num_shards * ALIGN
        for _ in range(staging_buffers(self.queue_depth, not self.pipelined)):
            buf = aligned_empty(cap)
            self._pin(buf)
            self._buffers.append(buf)
        self._bounce = aligned_empty(BOUNCE_BYTES)
        if self.device.type == "cuda" and self._stream is None:
            self._stream = torch.cuda.Stream(self.device)

    def _pin(self, buf: np.ndarray) -> None:
        if self.device.type != "cuda" or buf.nbytes == 0:
            return
        torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(buf.ctypes.data, buf.nbytes, 0))
        self._pinned.append(buf.ctypes.data)

    def close(self) -> None:
        """Release the buffers and files (the loader cannot be iterated afterwards)."""
        if self._closed:
            return
        self._closed = True
        for ptr in self._pinned:
            with contextlib.suppress(Exception):
                torch.cuda.cudart().cudaHostUnregister(ptr)
        self._pinned.clear()
        self._buffers.clear()
        self._matrices.clear()
        if self._own_reader:
            with contextlib.suppress(Exception):
                self.reader.close()
        self.ds.close()

    def __enter__(self) -> PackedLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # ------------------------------------------------------------------ streaming
    def close_files(self) -> None:
        """Close the reader's handles and the dataset's files (a consumed superbatch can then be deleted)."""
        for h in self._handles.values():
            with contextlib.suppress(Exception):
                self.reader.close_file(h)
        self._handles.clear()
        self._file_sizes.clear()
        self._shard_files = None
        self.ds.close()

    def follow(self, packed_dir: str | os.PathLike[str], held: Mapping[str, Buffer] | None = None) -> None:
        """Go on with the round from another packed directory holding its next superbatch(es) (streaming).

        A streamed round reaches the training machine one superbatch at a time, each staged as
        its own packed directory with the same tiers. The loader keeps what it carries across
        them: the CPU tier and its position, the GPU tier (on the device), the reader and the
        staging buffers (re-allocated only when a batch is larger than any before). The new
        directory must continue the round at `tier_position`; the memory budget is re-checked.
        `held`: its index and samples files when they are held in memory (`PackedDataset`).

        Raises:
            InputError: the new directory's features or tiers differ from this loader's, or its
                first batch is not `tier_position`.
            ConfigError: its batches no longer fit the ``cpu_memory`` budget.
        """
        if self._closed:
            raise RuntimeError("the loader is closed")
        ds = PackedDataset(packed_dir, held)
        shape = (ds.dtype, ds.dim, ds.num_shards, ds.num_nodes, ds.gpu_ids.shape[0], ds.cpu_ids.shape[0])
        mine = (self.ds.dtype, self.dim, self.ds.num_shards, self.ds.num_nodes, self.ds.gpu_ids.shape[0],
                self.cpu_ids.shape[0])
        if shape != mine:
            raise InputError(ds.path, f"(dtype, dim, shards, nodes, GPU rows, CPU rows) {shape} differ from the "
                                      f"loader's {mine}")
        first = min((s.first_batch for s in ds.superbatches), default=self._tier_next)
        if first != self._tier_next:
            raise InputError(ds.path, f"starts at batch {first}, but the CPU tier stands before batch {self._tier_next}")
        memory = memory_plan(ds, self.device, self.queue_depth, not self.pipelined)
        grow = memory["max_batch_rows"] > self.memory["max_batch_rows"]
        if not grow:        # the staging buffers stay as large as they are
            extra = (self.memory["max_batch_rows"] - memory["max_batch_rows"]) * memory["in_flight_batches"] \
                * memory["row_bytes"]
            memory.update(max_batch_rows=self.memory["max_batch_rows"], batch_bytes=memory["batch_bytes"] + extra,
                          host_bytes=memory["host_bytes"] + extra)
        check_memory(memory, self._cpu_memory, None)
        self.close_files()
        if grow:            # larger batches: new staging buffers
            for ptr in self._pinned:
                with contextlib.suppress(Exception):
                    torch.cuda.cudart().cudaHostUnregister(ptr)
            self._pinned.clear()
            self._buffers.clear()
            self._matrices.clear()
        self.ds, self.path, self.memory = ds, ds.path, memory
        self._dcache_rows = [int(f["rows"]) for f in ds.dcache_files]
        self.superbatches = sorted(ds.superbatches, key=lambda s: s.first_batch)
        self.num_batches = ds.num_batches
        self._epoch, self._start = None, 0

    # ------------------------------------------------------------------ selection
    def epochs(self) -> list[int]:
        """The epochs of the round, in order."""
        return sorted({s.epoch for s in self.superbatches})

    def set_epoch(self, epoch: int | None, start: int = 0) -> None:
        """Iterate only `epoch`'s batches from its `start`-th (None: the whole round from batch `start`)."""
        if epoch is not None and epoch not in self.epochs():
            raise ConfigError("epoch", f"the round has epochs {self.epochs()}, not {epoch}")
        first, end = self._range(epoch)
        if not 0 <= start <= end - first:
            raise ConfigError("start", f"batch {start} is outside the selection of {end - first} batches")
        self._epoch, self._start = epoch, int(start)

    def _range(self, epoch: int | None) -> tuple[int, int]:
        sbs = [s for s in self.superbatches if epoch is None or s.epoch == epoch]
        return sbs[0].first_batch, sbs[-1].first_batch + sbs[-1].batches

    def epoch_range(self, epoch: int) -> tuple[int, int]:
        """Global batches [first, end) of `epoch` in the round."""
        return self._range(epoch)

    def __len__(self) -> int:
        first, end = self._range(self._epoch)
        return end - first - self._start

    # ------------------------------------------------------------------ stage 1: load
    def _records(self, lo: int, hi: int) -> Iterator[tuple[int, IndexRecord]]:
        for sb in self._superbatches(lo, hi):
            for j, rec in enumerate(self.ds.index(sb.key)):
                g = sb.first_batch + j
                if lo <= g < hi:
                    yield g, rec

    def _superbatches(self, lo: int, hi: int) -> list[SuperbatchEntry]:
        return [s for s in self.superbatches if s.first_batch < hi and s.first_batch + s.batches > lo]

    def _load(self, g: int, rec: IndexRecord, buf: np.ndarray, yield_it: bool) -> _Staged:
        """Read batch `g`'s disk rows into `buf`: packed segments, disk-cache rows, store rows."""
        rb, dim = self.row_bytes, self.dim
        src, idx = rec.src, rec.idx
        self.ds._check_bounds(rec, int(self.ds.gpu_ids.shape[0]), int(self.cpu.shape[0]), rec.packed_rows,
                              self._dcache_rows[rec.dcache] if 0 <= rec.dcache < len(self._dcache_rows) else None)
        rows_k = rec.seg_rows.astype(np.int64)
        nz = np.flatnonzero(rows_k)
        k = int(rows_k.sum())
        nbytes = rows_k[nz] * rb
        lengths = padded(nbytes).astype(np.int64)
        out_off = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        dpos = np.flatnonzero(src == SRC_DCACHE)
        spos = np.flatnonzero(src == SRC_STORE)
        need = max(int(lengths.sum()), (k + dpos.size + spos.size) * rb)
        if need > buf.nbytes:
            raise InputError(self.path / "manifest.json", f"batch {g} needs {need:,} staging bytes, more than the "
                                                          f"{buf.nbytes:,} sized from round.max_batch_rows")
        segments: list[tuple[int, int, int]] = []
        if nz.size:
            handles = np.array([self._handle(self.ds.part_paths[p]) for p in nz], np.int64)
            offsets = rec.seg_offset[nz].astype(np.int64)
            try:
                self.reader.read(handles, offsets, lengths, buf, out_off)
            except OSError as e:
                p = next((int(p) for p in nz if str(self.ds.part_paths[p]) == str(e.filename)), int(nz[0]))
                raise InputError(self.ds.part_paths[p], f"truncated or unreadable: batch {g}, shard {p} needs bytes "
                                                        f"[{int(rec.seg_offset[p])}, "
                                                        f"{int(rec.seg_offset[p] + padded(rows_k[p] * rb))}) "
                                                        f"({e.strerror or e})") from e
            dst = 0
            for j, p in enumerate(nz.tolist()):    # per shard: close the padding gap
                n, s = int(nbytes[j]), int(out_off[j])
                if dst != s:
                    buf[dst:dst + n] = buf[s:s + n]
                if self.check_crc:                 # checked by the assemble stage, while this one reads on
                    segments.append((p, dst, n))
                dst += n
        rows = buf[:(k + dpos.size + spos.size) * rb].view(self.dtype).reshape(-1, dim)
        if dpos.size:
            path = self.ds.dcache_path(rec.dcache)
            try:
                self.reader.read_rows(self._handle(path), idx[dpos] * rb, rb, rows[k:k + dpos.size].reshape(-1).view(np.uint8))
            except OSError as e:
                raise InputError(path, f"batch {g}: disk-cache read failed ({e.strerror or e})") from e
        if spos.size:
            self._read_store_rows(g, idx[spos], rows[k + dpos.size:])
        miss_pos = np.flatnonzero(src >= SRC_PACKED)
        miss_row = np.empty(miss_pos.size, np.int64)
        msrc = src[miss_pos]
        miss_row[msrc == SRC_PACKED] = idx[miss_pos[msrc == SRC_PACKED]]
        miss_row[msrc == SRC_DCACHE] = k + np.arange(dpos.size)
        miss_row[msrc == SRC_STORE] = k + dpos.size + np.arange(spos.size)
        return _Staged(g, rec, buf, rows, miss_pos, miss_row, yield_it, segments)

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
        offsets = shard_base[shard] + ids * rb
        start = offsets - offsets % ALIGN
        length = padded(offsets + rb) - start
        tail = start + length > sizes
        bounce = self._bounce
        assert bounce is not None
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
    def _verify(self, st: _Staged) -> None:
        """Check the crc32 of every packed segment the load stage staged (an InputError names file and batch)."""
        rec = st.record
        for p, start, n in st.segments:
            if crc32(st.buffer[start:start + n].data) != int(rec.seg_crc[p]):
                raise InputError(self.ds.part_paths[p], f"checksum mismatch in batch {st.batch}, shard {p} (segment "
                                                        f"at byte {int(rec.seg_offset[p])}, {int(rec.seg_rows[p])} rows)")

    def _assemble(self, st: _Staged) -> torch.Tensor | None:
        """Verify batch `st.batch`'s staged segments, gather its features, apply its CPU-tier inserts."""
        rec = st.record
        self._verify(st)
        if self._device_path:
            x_t = self._assemble_device(st)
        else:       # every row moved once (native row copies), into a matrix no earlier batch still holds
            x = self._batch_matrix(rec.src.shape[0])
            for code, tier in ((SRC_GPU, self.gpu), (SRC_CPU, self.cpu)):
                pos = np.flatnonzero(rec.src == code)
                if pos.size:
                    _native.copy_rows(x, pos, tier, np.ascontiguousarray(rec.idx[pos], np.int64))
            _native.copy_rows(x, st.miss_pos, st.rows, st.miss_row)
            if rec.insert_pos.size:
                _native.copy_rows(self.cpu, np.ascontiguousarray(rec.insert_slot, np.int64), x,
                                  np.ascontiguousarray(rec.insert_pos, np.int64))
            x_t = torch.from_numpy(x)
        self._tier_next = st.batch + 1
        if st.yield_it:
            self.counts.rows += np.bincount(rec.src, minlength=5)[:5]
            self.counts.useful_bytes += int(st.miss_pos.size) * self.row_bytes
        return x_t if st.yield_it else None

    def _batch_matrix(self, n: int) -> np.ndarray:
        """An [n, dim] matrix for a batch's features: a pooled one that nothing references any more.

        A fresh matrix per batch costs the kernel zeroing its pages every time. A pooled matrix
        is handed out again only when no batch (no tensor, no view) still refers to it, so a
        caller may keep its batches; the pool holds at most the batches in flight, which the
        memory plan already reserves.
        """
        rows = int(self.memory["max_batch_rows"])
        if n <= rows:
            for m in self._matrices:
                if sys.getrefcount(m) <= 3:     # the pool, this loop, getrefcount: nobody else
                    return m[:n]
        m = np.empty((max(n, rows), self.dim), dtype=self.dtype)
        if n <= rows and len(self._matrices) < int(self.memory["in_flight_batches"]):
            self._matrices.append(m)
        return m[:n]

    def _assemble_device(self, st: _Staged) -> torch.Tensor:
        """Host rows (staged + CPU tier) -> one pinned block -> one async copy -> one gather on the device.

        The device work is gathers only (`index_select`), deterministic and free of scatters:
        ``x = cat(gpu_tier[gpu_idx], host_block)[where]``, `where` mapping each n_id position to
        its row of that concatenation.
        """
        rec = st.record
        n = rec.src.shape[0]
        cpos = np.flatnonzero(rec.src == SRC_CPU)
        gpos = np.flatnonzero(rec.src == SRC_GPU)
        m = st.rows.shape[0]
        host = st.buffer[:(m + cpos.size) * self.row_bytes].view(self.dtype).reshape(-1, self.dim)
        host[m:] = self.cpu[rec.idx[cpos]]                 # CPU-tier rows join the staged rows in pinned memory
        host_pos = np.concatenate([st.miss_pos, cpos])
        host_row = np.concatenate([st.miss_row, np.arange(m, m + cpos.size)])
        where = np.empty(n, np.int64)
        where[gpos] = np.arange(gpos.size)
        where[host_pos] = gpos.size + host_row
        dev = self.device
        gpu = self.gpu if isinstance(self.gpu, torch.Tensor) else torch.from_numpy(self.gpu)
        with torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext():
            h = torch.from_numpy(host).to(dev, non_blocking=True)
            g = gpu.index_select(0, torch.from_numpy(rec.idx[gpos]).to(dev, non_blocking=True))
            x = torch.cat([g, h]).index_select(0, torch.from_numpy(where).to(dev, non_blocking=True))
        if self._stream is not None:
            self._stream.synchronize()    # x is complete, and the staging buffer may be reused
        if rec.insert_pos.size:       # inserted rows come from host memory unless the plan inserts GPU-tier rows
            rows = where[rec.insert_pos] - gpos.size
            on_host = rows >= 0
            self.cpu[rec.insert_slot[on_host]] = host[rows[on_host]]
            if not on_host.all():
                sel = torch.from_numpy(rec.insert_pos[~on_host]).to(dev)
                self.cpu[rec.insert_slot[~on_host]] = x.index_select(0, sel).cpu().numpy()
        return x

    # ------------------------------------------------------------------ stage 3: graph
    def _samples(self, lo: int, hi: int) -> Iterator[tuple[int, SampleRecord]]:
        for sb in self._superbatches(lo, hi):
            count = 0
            for j, s in enumerate(self.ds.samples(sb.key)):
                count += 1
                g = sb.first_batch + j
                if lo <= g < hi:
                    yield g, s
            if count != sb.batches:
                raise InputError(self.ds.round_dir / "samples", f"superbatch {sb.key} holds {count} samples, the "
                                                                f"manifest says {sb.batches}")

    def _graph(self, s: SampleRecord) -> torch.Tensor:
        if not s.n_id.flags.writeable or s.n_id.dtype != np.int64:    # memory-mapped from the samples file (torch
            s.n_id = s.n_id.astype(np.int64)                            # wants its own) or int32 there (PyG: int64)
        n_id = s.n_id
        if n_id.size and (int(n_id.min()) < 0 or int(n_id.max()) >= self.labels.shape[0]):
            raise InputError(self.ds.round_dir / "samples", f"batch {s.batch}: node id out of range")
        return torch.from_numpy(self.labels[n_id])

    def _join(self, g: int, rec: IndexRecord, x: torch.Tensor, s: SampleRecord, y: torch.Tensor) -> Data:
        if x.shape[0] != s.n_id.shape[0]:
            raise InputError(self.ds.round_dir / "index", f"batch {g}: the index addresses {x.shape[0]} rows, the "
                                                          f"sample has {s.n_id.shape[0]} nodes")
        if rec.insert_pos.size:
            self.cpu_ids[rec.insert_slot] = s.n_id[rec.insert_pos]
        return batch_data(cast(Sample, s), x, y)

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[Data]:
        if self._closed:
            raise RuntimeError("the loader is closed")
        self._alloc()
        first, end = self._range(self._epoch)
        begin = first + self._start
        if self._tier_next > begin:
            self._reset_tier()       # the tier is past the start: replay from the round's start
        lo = self._tier_next          # batches [lo, begin) only advance the CPU tier
        self.stage_s = {"load": 0.0, "assemble": 0.0, "graph": 0.0}
        before = {k: StageClock(**vars(c)) for k, c in self.clocks.items()}
        try:
            if self.pipelined:
                yield from self._pipelined(lo, begin, end)
            else:
                yield from self._sequential(lo, begin, end)
        finally:
            for k in ("load", "assemble", "graph"):
                self.stage_s[k] = self.clocks[k].busy - before[k].busy

    def _sequential(self, lo: int, begin: int, end: int) -> Iterator[Data]:
        buf = self._buffers[0]
        ck = self.clocks
        samples = self._samples(begin, end)
        for g, rec in self._records(lo, end):
            t0 = time.perf_counter()
            st = self._load(g, rec, buf, g >= begin)
            t1 = time.perf_counter()
            x = self._assemble(st)
            t2 = time.perf_counter()
            ck["load"].busy += t1 - t0
            ck["assemble"].busy += t2 - t1
            if x is None:
                continue
            gs, s = next(samples)
            y = self._graph(s)
            ck["graph"].busy += time.perf_counter() - t2
            assert gs == g
            yield self._join(g, rec, x, s, y)

    def _pipelined(self, lo: int, begin: int, end: int) -> Iterator[Data]:
        pipe = _Pipe()
        q = self.queue_depth
        free: queue.Queue = queue.Queue()
        for b in self._buffers:
            free.put(b)
        loaded: queue.Queue = queue.Queue(q)
        assembled: queue.Queue = queue.Queue(q)
        graphs: queue.Queue = queue.Queue(q)
        ck = self.clocks

        def load() -> None:
            for g, rec in self._records(lo, end):
                buf = pipe.get(free, ck["load"])
                t = time.perf_counter()
                st = self._load(g, rec, buf, g >= begin)
                ck["load"].busy += time.perf_counter() - t
                pipe.put(loaded, st, ck["load"])
            pipe.put(loaded, _END, ck["load"])

        def assemble() -> None:
            while (st := pipe.get(loaded, ck["assemble"])) is not _END:
                t = time.perf_counter()
                x = self._assemble(st)
                free.put(st.buffer)
                ck["assemble"].busy += time.perf_counter() - t
                if x is not None:
                    pipe.put(assembled, (st.batch, st.record, x), ck["assemble"])
            pipe.put(assembled, _END, ck["assemble"])

        def graph() -> None:
            for g, s in self._samples(begin, end):
                t = time.perf_counter()
                y = self._graph(s)
                ck["graph"].busy += time.perf_counter() - t
                pipe.put(graphs, (g, s, y), ck["graph"])
            pipe.put(graphs, _END, ck["graph"])

        threads = [threading.Thread(target=_guard(pipe, fn), name=f"diskflow-{fn.__name__}", daemon=True)
                   for fn in (load, assemble, graph)]
        for t in threads:
            t.start()
        try:
            expect = begin
            while True:
                item = pipe.get(assembled, ck["train"])
                gitem = pipe.get(graphs, ck["train"])
                if item is _END or gitem is _END:
                    if item is not gitem:
                        raise InputError(self.path, "the index and the samples hold different numbers of batches")
                    break
                g, rec, x = item
                gs, s, y = gitem
                if not g == gs == expect:
                    raise InputError(self.path, f"batch order broken: features of {g}, graph of {gs}, expected {expect}")
                if self.device.type == "cuda":
                    x.record_stream(torch.cuda.current_stream(self.device))
                data = self._join(g, rec, x, s, y)
                del item, gitem, x, y
                expect += 1
                yield data
                del data
            if expect != end:
                raise InputError(self.path, f"the round ended after batch {expect}, expected {end}")
        except _Stopped:
            pass
        finally:
            pipe.stop.set()
            for t in threads:
                t.join()
        if pipe.error is not None:
            raise pipe.error

    def stats(self) -> dict[str, Any]:
        """Cumulative figures: stage clocks, reader counters, rows per source."""
        rows = {name: int(n) for name, n in zip(SOURCES, self.counts.rows.tolist())}
        total = sum(rows.values())
        return {
            "stages": {k: c.as_dict() for k, c in self.clocks.items()},
            "io": {**{k: float(v) for k, v in dict(self.reader.counters()).items()},
                   "backend": str(getattr(self.reader, "backend", type(self.reader).__name__)),
                   "useful_bytes": self.counts.useful_bytes},
            "tiers": {"rows": rows, "total": total,
                      "rates": {k: (v / total if total else None) for k, v in rows.items()}},
        }


def _guard(pipe: _Pipe, fn: Callable[[], None]) -> Callable[[], None]:
    """Run a stage; its first exception stops the pipeline and is re-raised to the consumer."""
    def run() -> None:
        try:
            fn()
        except _Stopped:
            pass
        except BaseException as e:   # noqa: BLE001 - handed to the consumer thread
            pipe.fail(e)
    run.__name__ = fn.__name__
    return run
