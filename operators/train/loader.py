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
   (GIL released) into fixed, aligned staging buffers: a batch larger than one buffer is loaded
   in pieces (a segment cut at a row), so staging never holds more than the buffers' bytes.
2. **assemble** — per batch, one gather of its GPU- and CPU-tier rows into its feature matrix
   (lent from a pool of reused matrices until the consumer calls `release`), then each piece's
   rows to their positions, segment crcs checked; then the planned CPU-tier inserts. On CUDA:
   pinned staging, non-blocking copies on the stage's own stream, gathers and index copies on
   the device.
3. **graph** — the stored sample (ids, local edges, per-hop counts) and `y = labels[n_id]`.

The consumer (the training loop, stage 4) joins the two paths in batch order. With
``pipelined=False`` the same stages run one after another in the caller's thread.

The CPU tier is state: batch i's rows depend on every earlier batch's inserts, so the loader
tracks the position of its tier (`tier_position`) and fast-forwards (runs load + assemble
without yielding) when asked for a later start, or restarts from ``cpu_init`` for an earlier
one. `tier_state`/`restore_tier` let a checkpoint save and restore it.

Here: the loader's life (setup, tiers, epochs, streaming, its pool of batch matrices, the
stages' wiring). Elsewhere: a batch's reads and assembly (`assemble.BatchAssembly`, which the
loader inherits), the memory figures and budget check (`memory`), the stage pipe (`pipe`).
"""
from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch_geometric.data import Data

from ...errors import ConfigError, InputError
from ...native.constants import DEFAULT_BOUNCE_BYTES
from ...native.reader import aligned_empty
from ..formats.npyio import load_npy, read_into
from ..formats.packed import IndexRecord, PackedDataset, SuperbatchEntry
from ..formats.samples import Buffer, SampleRecord
from ..trainbuffers import staging_buffers
from .assemble import SOURCES, BatchAssembly, SourceCounts, make_reader
from .batches import Sample, batch_data
from .memory import check_memory, memory_plan
from .pipe import END, Pipe, StageClock, Stopped, guard

if TYPE_CHECKING:
    from typing_extensions import Self


class PackedLoader(BatchAssembly):
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
        shared: the CPU tier several GPU workers share (`shared_tier.SharedTier`, ``--cache
            shared``): its rows live there, and each batch takes its turn at it in the merged
            stream's order (the staged superbatches' ``stream.global_batches``).

    Iterating yields every batch of the round (all its epochs) in order; `set_epoch` selects
    one epoch (and optionally a first batch within it), as a trainer does.
    """

    def __init__(self, packed_dir: str | os.PathLike[str], device: str | torch.device = "cpu",
                 cpu_memory: int | None = None, queue_depth: int = 2, pipelined: bool = True,
                 check_crc: bool = True, reader: Any = None, *, store: str | os.PathLike[str] | None = None,
                 gpu_memory: int | None = None, held: Mapping[str, Buffer] | None = None,
                 shared: Any = None) -> None:
        if isinstance(queue_depth, bool) or not isinstance(queue_depth, int) or queue_depth < 1:
            raise ConfigError("queue_depth", f"expected an integer >= 1, got {queue_depth!r}")
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ConfigError("device", f"not a torch device: {device!r}") from e
        if self.device.type not in ("cpu", "cuda"):
            raise ConfigError("device", f"expected 'cpu' or 'cuda[:N]', got {device!r}")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device", f"{device!r} requested but CUDA is not available on this machine")
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
        # Pooled batch feature matrices: each lent to one batch until the consumer gives it back (`release`).
        self._matrices: list[np.ndarray] = []
        self._free: list[np.ndarray] = []                           # pooled and not lent
        self._lent: dict[int, tuple[np.ndarray, torch.Tensor]] = {}  # data pointer -> (matrix, the batch's x)
        self._pool_lock = threading.Lock()                          # the assemble thread lends, the consumer releases
        self._bounce: np.ndarray | None = None
        self._tier_buffer: np.ndarray | None = None
        self._open_batch: tuple[Any, np.ndarray | None, dict[int, int]] | None = None   # x, insert slots, crcs
        self._shard_files: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._shared = shared
        self._shared_published = False
        self._global = self._global_batches(self.ds)
        self._init_tiers()
        self.counts = SourceCounts()
        self.clocks: dict[str, StageClock] = {k: StageClock() for k in ("load", "assemble", "graph", "train")}
        self.stage_s: dict[str, float] = {}
        self._closed = False

    # ------------------------------------------------------------------ setup
    def _labels(self) -> np.ndarray:
        name = self.ds.manifest.get("labels")
        if not name:
            raise InputError(self.path / "manifest.json", "no labels (prepared by an older version; re-run "
                                                          "prepare with force=True)")
        p = self.path / str(name)
        try:
            labels = load_npy(p)
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
        c = self.ds.cpu_ids.shape[0]
        if self._shared is not None:
            if self._shared.rows.shape != (c, self.dim) or self._shared.rows.dtype != self.dtype:
                raise InputError(self.path, f"the shared CPU tier holds {self._shared.rows.dtype}"
                                            f"{list(self._shared.rows.shape)}, the dataset's is {self.dtype}[{c}, {self.dim}]")
            self.cpu = self._shared.rows
        elif self.device.type == "cuda":
            dtype = torch.from_numpy(np.zeros(0, self.dtype)).dtype
            self.cpu = torch.empty((c, self.dim), dtype=dtype, pin_memory=True).numpy()
        else:
            self.cpu = np.empty((c, self.dim), dtype=self.dtype)
        self.cpu_ids = np.empty(c, np.int64)
        self._reset_tier()

    def _reset_tier(self) -> None:
        """The CPU tier as at round start (``cpu_init``), positioned before batch 0 (a shared tier: rank 0 fills it)."""
        if self._shared is None or self._shared.rank == 0:     # (the others are shipped no rows)
            read_into(self.ds.cpu_init, self.cpu)     # pread: the file's pages are not mapped in as well
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
        """Set the CPU tier to a saved state at `position` (None rows: the round-start tier, position 0; a shared
        tier's ranks but 0, with `ids`: only the position, rank 0 restores the rows)."""
        if rows is None and (ids is None or self._shared is None or self._shared.rank == 0):
            self._reset_tier()
            return
        if rows is None:        # a shared tier's other ranks: rank 0 restores the rows
            if ids is None or ids.shape != self.cpu_ids.shape:
                raise InputError(self.path, "saved CPU tier ids do not fit this dataset's tier")
            rows = self.cpu
        if rows.shape != self.cpu.shape or rows.dtype != self.cpu.dtype or ids is None or ids.shape != self.cpu_ids.shape:
            raise InputError(self.path, f"saved CPU tier {rows.dtype}{list(rows.shape)} does not fit this dataset's "
                                        f"{self.cpu.dtype}{list(self.cpu.shape)}")
        if not 0 <= position <= self.num_batches:
            raise InputError(self.path, f"saved CPU tier position {position} is outside the round")
        if self._shared is None or self._shared.rank == 0:
            self.cpu[:] = rows
        self.cpu_ids[:] = ids
        self._tier_next = int(position)

    @staticmethod
    def _global_batches(ds: PackedDataset) -> dict[int, int]:
        """A streamed superbatch's batches -> their numbers in the merged stream of every GPU worker
        (``stream.global_batches``; empty when the manifest has none)."""
        order = (ds.manifest.get("stream") or {}).get("global_batches")
        if not order:
            return {}
        sb = min(ds.superbatches, key=lambda s: s.first_batch)
        return {sb.first_batch + j: int(g) for j, g in enumerate(order)}

    def _alloc(self) -> None:
        """Staging buffers (pinned on CUDA) and the row-read bounce buffer, sized from the manifest."""
        if self._buffers:
            return
        cap = int(self.memory["staging_piece_bytes"])
        for _ in range(staging_buffers(self.queue_depth, not self.pipelined)):
            buf = aligned_empty(cap)
            self._pin(buf)
            self._buffers.append(buf)
        if self._device_path:      # CPU-tier rows reach the device through a pinned buffer of their own
            self._tier_buffer = aligned_empty(cap)
            self._pin(self._tier_buffer)
        self._bounce = aligned_empty(DEFAULT_BOUNCE_BYTES)
        if self.device.type == "cuda" and self._stream is None:
            self._stream = torch.cuda.Stream(self.device)

    def _pin(self, buf: np.ndarray) -> None:
        if self.device.type != "cuda" or buf.nbytes == 0:
            return
        torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(buf.ctypes.data, buf.nbytes, 0))
        self._pinned.append(buf.ctypes.data)

    def _free_staging(self) -> None:
        """Drop the staging and tier buffers, unpinning what was pinned (they are allocated again on demand)."""
        for ptr in self._pinned:
            with contextlib.suppress(Exception):
                torch.cuda.cudart().cudaHostUnregister(ptr)
        self._pinned.clear()
        self._buffers.clear()
        self._tier_buffer = None

    def close(self) -> None:
        """Release the buffers and files (the loader cannot be iterated afterwards)."""
        if self._closed:
            return
        self._closed = True
        self._free_staging()
        self._drop_pool()
        if self._own_reader:
            with contextlib.suppress(Exception):
                self.reader.close()
        self.ds.close()

    def __enter__(self) -> Self:
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
        grow = memory["staging_piece_bytes"] > self.memory["staging_piece_bytes"]
        if not grow:        # the staging buffers stay as large as they are
            memory["host_bytes"] += self.memory["staging_bytes"] - memory["staging_bytes"]
            memory.update(staging_piece_bytes=self.memory["staging_piece_bytes"],
                          staging_bytes=self.memory["staging_bytes"])
        taller = memory["max_batch_rows"] > self.memory["max_batch_rows"]
        if not taller:      # and so do the pooled batch matrices
            memory.update(max_batch_rows=self.memory["max_batch_rows"], assembled_bytes=self.memory["assembled_bytes"])
        check_memory(memory, self._cpu_memory, None)
        self.close_files()
        if grow:            # larger pieces: new staging buffers
            self._free_staging()
        if taller:
            self._drop_pool()
        self.ds, self.path, self.memory = ds, ds.path, memory
        self._global = self._global_batches(ds)
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

    # ------------------------------------------------------------------ the pool of batch matrices
    def _batch_matrix(self, n: int) -> np.ndarray:
        """An [n, dim] matrix for a batch's features: a pooled one not lent to any batch, else a fresh one.

        A fresh matrix per batch costs the kernel zeroing its pages every time. A pooled matrix is
        lent to the batch it is yielded in (`_lend`) and handed out again only after the consumer
        gave it back (`release`), so a batch the caller keeps is never written again; without
        releases every batch gets a matrix of its own. The pool holds at most the assembled batches
        in flight (`assembled_batches`, which the memory plan reports).
        """
        rows = int(self.memory["max_batch_rows"])
        with self._pool_lock:
            if n <= rows and self._free:
                return self._free.pop()[:n]
            m = np.empty((max(n, rows), self.dim), dtype=self.dtype)
            if n <= rows and len(self._matrices) < int(self.memory["assembled_batches"]):
                self._matrices.append(m)
            return m[:n]

    def _lend(self, x: torch.Tensor) -> None:
        """Record that the batch about to be yielded holds `x`'s matrix (if pooled) until `release`."""
        if x.device.type == "cpu":
            with self._pool_lock:
                m = next((m for m in self._matrices if m.ctypes.data == x.data_ptr()), None)
                if m is not None:
                    self._lent[x.data_ptr()] = (m, x)

    def release(self, batch: Data | torch.Tensor) -> None:
        """Give `batch`'s feature matrix back to the loader: later batches may be written into it.

        A training loop calls it once it is done with a batch (after the step), so batch matrices
        are reused instead of allocated; after it, `batch.x` must not be read. A batch never
        released keeps its features for as long as the caller holds it. Releasing a batch whose
        matrix is not pooled (a device batch, one beyond the pool) or was released already does
        nothing.
        """
        x = batch.x if isinstance(batch, Data) else batch
        if not isinstance(x, torch.Tensor) or x.device.type != "cpu":
            return
        with self._pool_lock:
            lease = self._lent.get(x.data_ptr())
            if lease is not None and lease[1] is x:     # this batch's own lease, not a later batch's
                del self._lent[x.data_ptr()]
                self._free.append(lease[0])

    def _reclaim(self, x: np.ndarray | None = None) -> None:
        """Put back in the pool `x`'s matrix (a batch assembled but not yielded), or with None, once no
        stage runs, every pooled matrix that is neither free nor lent (batches a stopped pipeline dropped)."""
        with self._pool_lock:
            out = [m for m in self._matrices if not any(m is f for f in self._free)
                   and not any(m is lent for lent, _ in self._lent.values())]
            self._free += [m for m in out if x is None or m.ctypes.data == x.ctypes.data]

    def _drop_pool(self) -> None:
        """Forget the pooled matrices (batches still lent keep theirs)."""
        with self._pool_lock:
            self._matrices.clear()
            self._free.clear()
            self._lent.clear()

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
        self._lend(x)
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
            self._reclaim()          # every stage has stopped: matrices of batches never yielded are free
            for k in ("load", "assemble", "graph"):
                self.stage_s[k] = self.clocks[k].busy - before[k].busy

    def _sequential(self, lo: int, begin: int, end: int) -> Iterator[Data]:
        buf = self._buffers[0]
        ck = self.clocks
        samples = self._samples(begin, end)
        for g, rec in self._records(lo, end):
            pieces = self._pieces(g, rec, lambda: buf, g >= begin)
            x = None
            while True:         # each piece is assembled before the next one reuses the buffer
                t0 = time.perf_counter()
                pc = next(pieces, None)
                t1 = time.perf_counter()
                ck["load"].busy += t1 - t0
                if pc is None:
                    break
                x = self._assemble(pc)
                ck["assemble"].busy += time.perf_counter() - t1
            if x is None:
                continue
            t2 = time.perf_counter()
            got = next(samples, None)
            if got is None or got[0] != g:
                raise InputError(self.path, "the index and the samples hold different numbers of batches" if got is None
                                 else f"batch order broken: features of {g}, graph of {got[0]}")
            s = got[1]
            y = self._graph(s)
            ck["graph"].busy += time.perf_counter() - t2
            yield self._join(g, rec, x, s, y)

    def _pipelined(self, lo: int, begin: int, end: int) -> Iterator[Data]:
        pipe = Pipe()
        q = self.queue_depth
        free: queue.Queue = queue.Queue()
        for b in self._buffers:
            free.put(b)
        loaded: queue.Queue = queue.Queue(q)
        assembled: queue.Queue = queue.Queue(q)
        graphs: queue.Queue = queue.Queue(q)
        ck = self.clocks

        def load() -> None:
            clock = ck["load"]
            for g, rec in self._records(lo, end):
                pieces = self._pieces(g, rec, lambda: pipe.get(free, clock), g >= begin)
                while True:
                    waited, t = clock.starved, time.perf_counter()
                    pc = next(pieces, None)
                    clock.busy += time.perf_counter() - t - (clock.starved - waited)   # not the wait for a buffer
                    if pc is None:
                        break
                    pipe.put(loaded, pc, clock)
            pipe.put(loaded, END, clock)

        def assemble() -> None:
            while (pc := pipe.get(loaded, ck["assemble"])) is not END:
                t = time.perf_counter()
                x = self._assemble(pc)
                if pc.buffer is not None:
                    free.put(pc.buffer)
                ck["assemble"].busy += time.perf_counter() - t
                if x is not None:
                    pipe.put(assembled, (pc.batch, pc.record, x), ck["assemble"])
            pipe.put(assembled, END, ck["assemble"])

        def graph() -> None:
            for g, s in self._samples(begin, end):
                t = time.perf_counter()
                y = self._graph(s)
                ck["graph"].busy += time.perf_counter() - t
                pipe.put(graphs, (g, s, y), ck["graph"])
            pipe.put(graphs, END, ck["graph"])

        threads = [threading.Thread(target=guard(pipe, fn), name=f"diskflow-{fn.__name__}", daemon=True)
                   for fn in (load, assemble, graph)]
        for t in threads:
            t.start()
        try:
            expect = begin
            while True:
                item = pipe.get(assembled, ck["train"])
                gitem = pipe.get(graphs, ck["train"])
                if item is END or gitem is END:
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
        except Stopped:
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
