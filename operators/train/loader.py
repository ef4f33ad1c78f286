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

Here: the loader's life (setup, tiers, epochs, streaming, statistics). Elsewhere, one job each:
a batch's reads (`batchload.BatchLoad`) and its assembly (`assemble.BatchAssembly`), which the
loader inherits, the stages' order and threads (`stages`), the pool of batch matrices
(`pool.MatrixPool`), the tiers' memory and the check of a saved tier (`cputier`), the memory
figures, budget check and re-plan when following a streamed directory (`memory`), the stage pipe
(`pipe`).
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch_geometric.data import Data

from ...errors import ConfigError, InputError
from ...native.closing import Closing
from ...native.constants import DEFAULT_BOUNCE_BYTES
from ...native.reader import aligned_empty
from ..formats.hetero import HeteroLayout
from ..formats.npyio import read_into
from ..formats.packed import PackedDataset
from ..formats.packedindex import IndexRecord
from ..formats.samples import Buffer, SampleRecord
from ..trainbuffers import staging_buffers
from .assemble import SOURCES, BatchAssembly, SourceCounts
from .batches import Sample, batch_data
from .batchload import BatchLoad, make_reader
from .cputier import check_follows, check_saved_tier, cpu_tier, gpu_tier, stream_batches
from .heterobatch import hetero_batch
from .memory import check_memory, follow_plan, memory_plan
from .pipe import StageClock
from .pool import MatrixPool
from .stages import load_labels, pipelined, records, samples, sequential
from .staging import PinnedBuffers

__all__ = ["PackedLoader"]


def _nested(held: Mapping[str, Buffer] | None, sub: str) -> dict[str, Buffer] | None:
    """The held files of the dataset nested in subdirectory `sub` (the edge rows'), relative to it."""
    if held is None:
        return None
    head = f"{sub.rstrip('/')}/"
    return {rel[len(head):]: v for rel, v in held.items() if rel.startswith(head)}


def _less(budget: int | None, part: int) -> int | None:
    """A byte budget (None: unchecked) less the `part` of it another loader takes."""
    return None if budget is None else max(0, budget - part)


def _most(budget: int | None, part: int) -> int | None:
    """The `part` of a byte budget (None: unchecked) a nested loader takes, at most the whole."""
    return None if budget is None else min(budget, part)


class PackedLoader(BatchLoad, BatchAssembly, Closing):
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
                 shared: Any = None, typed_batches: bool = False) -> None:
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
        # rows as the dataset holds them (`row_dim` wide: encoded rows are raw bytes), and the features' width
        # `dim` once decoded (`codec`, which the assembled batch is decoded with on the device that trains)
        self.row_dim, self.dtype, self.row_bytes = self.ds.dim, self.ds.dtype, self.ds.row_bytes
        self.codec = self.ds.codec
        self.dim = self.row_dim if self.codec is None else self.codec.dim
        self.memory = memory_plan(self.ds, self.device, queue_depth, not self.pipelined)
        # the edge rows' part of the budgets, as prepare split them (`flow.prepare.edges`); the rest is the nodes'
        edges = self.ds.manifest.get("edges")
        edge_cpu, edge_gpu = (0, 0) if edges is None else (int(edges["cpu_memory"]), int(edges["gpu_memory"]))
        check_memory(self.memory, _less(cpu_memory, edge_cpu), _less(gpu_memory, edge_gpu))
        self._cpu_memory = _less(cpu_memory, edge_cpu)
        self.num_classes = int(self.ds.manifest.get("num_classes", 0))
        # a typed graph's layout (`formats.hetero`); `typed_batches`: yield `HeteroData` rather than the flat
        # `Data` the trainer splits at the model (`heterobatch`)
        entry = self.ds.manifest.get("hetero")
        self.hetero = HeteroLayout(entry, str(self.ds.path / "manifest.json")) if entry else None
        self.typed_batches = bool(typed_batches) and self.hetero is not None
        # a table of rows alone (the edge rows' dataset inside a packed dataset): no graph, no labels
        self.rows_only = (self.ds.manifest.get("store") or {}).get("table") is not None
        self.labels = np.empty(0, np.int64) if self.rows_only else load_labels(self.ds)
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
        self._pins = PinnedBuffers(self.device)
        self._buffers: list[np.ndarray] = []
        # Pooled batch feature matrices: each lent to one batch until the consumer gives it back (`release`).
        self.pool = MatrixPool(self.row_dim, self.dtype, self.memory)
        # encoded rows: the batches' decoded float32 matrices, pooled as the encoded ones are (on the CPU a fresh
        # batch-sized matrix per batch cost ten times its decoding)
        self.decoded = None if self.codec is None else MatrixPool(self.dim, np.dtype(np.float32), self.memory)
        self._bounce: np.ndarray | None = None
        self._tier_buffer: np.ndarray | None = None
        self._open_batch: tuple[Any, np.ndarray | None, dict[int, int]] | None = None   # x, insert slots, crcs
        self._shard_files: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._shared = shared
        self._shared_published = False
        self._global = stream_batches(self.ds)
        self._init_tiers()
        self.counts = SourceCounts()
        self.clocks: dict[str, StageClock] = {k: StageClock() for k in ("load", "assemble", "graph", "train")}
        self.stage_s: dict[str, float] = {}
        self._closed = False
        # The edge rows (a store with edge features): a loader of their own over the nested packed dataset,
        # in the same batch order; its rows become each batch's `edge_attr`.
        self.edges: PackedLoader | None = None
        if edges is not None:
            self.edges = PackedLoader(self.path / str(edges["path"]), device, _most(cpu_memory, edge_cpu),
                                      queue_depth, pipelined, check_crc, store=store,
                                      gpu_memory=_most(gpu_memory, edge_gpu), held=_nested(held, str(edges["path"])))

    # ------------------------------------------------------------------ setup
    def _init_tiers(self) -> None:
        self.gpu: Any = gpu_tier(self.ds, self.device)
        self.cpu = cpu_tier(self.ds, self.device, self._shared)
        self.cpu_ids = np.empty(self.ds.cpu_ids.shape[0], np.int64)
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
        ids = check_saved_tier(self.path, self.cpu, self.cpu_ids, rows, ids, position, self.num_batches)
        if self._shared is None or self._shared.rank == 0:
            self.cpu[:] = rows
        self.cpu_ids[:] = ids
        self._tier_next = int(position)

    def _alloc(self) -> None:
        """Staging buffers (pinned on CUDA) and the row-read bounce buffer, sized from the manifest."""
        if self._buffers:
            return
        cap = int(self.memory["staging_piece_bytes"])
        self._buffers += [self._pins.new(cap) for _ in range(staging_buffers(self.queue_depth, not self.pipelined))]
        if self._device_path:      # CPU-tier rows reach the device through a pinned buffer of their own
            self._tier_buffer = self._pins.new(cap)
        self._bounce = aligned_empty(DEFAULT_BOUNCE_BYTES)
        if self.device.type == "cuda" and self._stream is None:
            self._stream = torch.cuda.Stream(self.device)

    def _free_staging(self) -> None:
        """Drop the staging and tier buffers, unpinning what was pinned (they are allocated again on demand)."""
        self._pins.unpin()
        self._buffers.clear()
        self._tier_buffer = None

    def close(self) -> None:
        """Release the buffers and files (the loader cannot be iterated afterwards)."""
        if self._closed:
            return
        self._closed = True
        self._free_staging()
        for pool in self._pools():
            pool.drop()
        if self.edges is not None:
            self.edges.close()
        if self._own_reader:
            with contextlib.suppress(Exception):
                self.reader.close()
        self.ds.close()

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
        if self.edges is not None:
            self.edges.close_files()

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
        edges = ds.manifest.get("edges")
        if (edges is None) != (self.edges is None):
            raise InputError(ds.path, f"{'has' if edges is not None else 'lacks'} the edge rows the superbatches "
                                      f"before it {'lacked' if edges is not None else 'had'}")
        check_follows(ds, self.ds, self.cpu_ids, self._tier_next)
        memory, grow, taller = follow_plan(self.memory, ds, self.device, self.queue_depth, not self.pipelined)
        check_memory(memory, self._cpu_memory, None)
        self.close_files()
        if grow:            # larger pieces: new staging buffers
            self._free_staging()
        for pool in self._pools():
            if taller:
                pool.drop()
            pool.memory = memory
        self.ds, self.path, self.memory = ds, ds.path, memory
        self._global = stream_batches(ds)
        self._dcache_rows = [int(f["rows"]) for f in ds.dcache_files]
        self.superbatches = sorted(ds.superbatches, key=lambda s: s.first_batch)
        self.num_batches = ds.num_batches
        self._epoch, self._start = None, 0
        if self.edges is not None and edges is not None:    # the edge rows' superbatch, beside the nodes'
            self.edges.follow(ds.path / str(edges["path"]), _nested(held, str(edges["path"])))

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
        if self.edges is not None:
            self.edges.set_epoch(epoch, start)

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
        """Global batches [lo, hi)'s index records, in order (`stages.records`)."""
        return records(self.ds, self.superbatches, lo, hi)

    # ------------------------------------------------------------------ the pool of batch matrices
    def _batch_matrix(self, n: int) -> np.ndarray:
        """An [n, dim] matrix for a batch's features, from the pool (`pool.MatrixPool.take`)."""
        return self.pool.take(n)

    def _reclaim(self, x: np.ndarray | None = None) -> None:
        """Back to the pool: `x`'s matrix, or with None every matrix of a batch never yielded (`MatrixPool.reclaim`)."""
        self.pool.reclaim(x)
        if x is None and self.decoded is not None:
            self.decoded.reclaim()

    def _pools(self) -> list[MatrixPool]:
        """The pools of batch matrices: the stored rows' and, for encoded rows, the decoded ones'."""
        decoded = getattr(self, "decoded", None)    # (a loader whose set-up failed closes too)
        return [self.pool] + ([decoded] if decoded is not None else [])

    def release(self, batch: Data | torch.Tensor) -> None:
        """Give `batch`'s feature matrix back to the loader: later batches may be written into it.

        A training loop calls it once it is done with a batch (after the step), so batch matrices
        are reused instead of allocated; after it, `batch.x` must not be read. A batch never
        released keeps its features for as long as the caller holds it. Releasing a batch whose
        matrix is not pooled (a device batch, one beyond the pool) or was released already does
        nothing.
        """
        x = batch.x if isinstance(batch, Data) else batch
        if isinstance(x, torch.Tensor) and x.device.type == "cpu":
            self.pool.release(x)
            if self.decoded is not None:
                self.decoded.release(x)
        if self.edges is not None and isinstance(batch, Data) and "edge_attr" in batch:
            self.edges.release(batch.edge_attr)

    # ------------------------------------------------------------------ stage 3: graph
    def _samples(self, lo: int, hi: int) -> Iterator[tuple[int, SampleRecord]]:
        """Global batches [lo, hi)'s stored samples, in order (`stages.samples`)."""
        return samples(self.ds, self.superbatches, lo, hi)

    def _join(self, g: int, rec: IndexRecord, x: torch.Tensor, s: SampleRecord, y: torch.Tensor | None
              ) -> Data | torch.Tensor:
        if x.shape[0] != s.n_id.shape[0]:
            raise InputError(self.ds.round_dir / "index", f"batch {g}: the index addresses {x.shape[0]} rows, the "
                                                          f"sample has {s.n_id.shape[0]} nodes")
        if rec.insert_pos.size:
            self.cpu_ids[rec.insert_slot] = s.n_id[rec.insert_pos]
        if self.codec is not None and self.decoded is not None:     # decoded where it was assembled, into a
            out = None if x.device.type != "cpu" else torch.from_numpy(self.decoded.take(int(x.shape[0])))  # pooled
            encoded, x = x, self.codec.decode_torch(x, out)       # matrix; the encoded one goes back at once
            self.pool.lend(encoded)
            self.pool.release(encoded)
            self.decoded.lend(x)
        else:
            self.pool.lend(x)
        if self.rows_only:
            return x
        data = batch_data(cast(Sample, s), x, cast(torch.Tensor, y))
        if self.typed_batches and self.hetero is not None:
            return hetero_batch(data, self.hetero, str(self.hetero.target))
        return data

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
            batches = (pipelined if self.pipelined else sequential)(self, lo, begin, end)
            yield from (batches if self.edges is None else self._with_edge_rows(batches))
        finally:
            self._reclaim()          # every stage has stopped: matrices of batches never yielded are free
            for k in ("load", "assemble", "graph"):
                self.stage_s[k] = self.clocks[k].busy - before[k].busy

    def _with_edge_rows(self, batches: Iterator[Data]) -> Iterator[Data]:
        """Each batch with its edge rows (the edge loader's batch of the same number) as `edge_attr`."""
        assert self.edges is not None
        rows = iter(self.edges)
        try:
            for data in batches:
                attr = next(rows, None)
                n = int(data.e_id.shape[0]) if "e_id" in data else -1
                if attr is None or attr.shape[0] != n:
                    raise InputError(self.edges.path, f"batch of {n} edges: the edge rows hold "
                                                      f"{'no batch' if attr is None else attr.shape[0]}")
                data.edge_attr = attr
                yield data
        finally:
            close = getattr(rows, "close", None)
            if close is not None:
                close()

    def stats(self) -> dict[str, Any]:
        """Cumulative figures: stage clocks, reader counters, rows per source."""
        rows = {name: int(n) for name, n in zip(SOURCES, self.counts.rows.tolist())}
        total = sum(rows.values())
        return {
            **({"edges": self.edges.stats()} if self.edges is not None else {}),
            "stages": {k: c.as_dict() for k, c in self.clocks.items()},
            "io": {**{k: float(v) for k, v in dict(self.reader.counters()).items()},
                   "backend": str(getattr(self.reader, "backend", type(self.reader).__name__)),
                   "useful_bytes": self.counts.useful_bytes},
            "tiers": {"rows": rows, "total": total,
                      "rates": {k: (v / total if total else None) for k, v in rows.items()}},
        }
