"""Training with no preparation: a fixed host feature buffer filled by asynchronous direct-I/O extractors.

Two systems of the field read features online, and both are this one loader over a planned
`RowCache` (`operators.train.rowcache`) with a different policy (`OnlineLoader`):

* **GNNDrive** (``policy="lru"``, §4.2): a feature buffer of a fixed number of row slots, a mapping
  table node -> slot, a reverse map slot -> node, reference counts and a standby list of released
  slots taken in least-recently-used order. Rows already in the buffer are reused; a batch's
  other rows are read from the store's shards by the native reader (O_DIRECT, io_uring) straight
  into the slots it was given, by several extractors at once (the paper's give each a batch; here
  each takes a contiguous chunk of a batch's misses, so one batch's reads spread over all of them
  when the buffer holds only one batch in flight), and batches complete out of order but are
  handed to training in order.
* **LSM-GNN** (``policy="hybrid"``, §4.2–4.3, one device): the slots are a cache evicted by the
  hybrid policy, with a lookahead window of `window` batches sampled ahead. A candidate's level
  is decided by its next use in the window (none; beyond the threshold, 1/8 of the window by
  default; within it, kept longest), and within a level the lowest static score (in-degree) goes
  first. The window is scanned for every batch (one vectorised pass of the window's node lists),
  so no line lacks dynamic information and the paper's "recently inserted" level is empty. Its
  prefetcher is the extractors: the misses of the next batches are read while this one trains.

How the loader stays exact without locks around the data: slots are *planned* in batch order
by one thread (`RowCache.plan`: which rows hit, which slots the misses go to; a batch's
slots are pinned until its matrix is gathered), extractors only ever write slots that no
unfinished batch reads (a slot is chosen as a victim only with reference count 0), and matrices
are gathered in batch order, each after its own reads and every earlier batch's are done. So a
batch that hits a row another batch is still reading (GNNDrive's wait list) waits for it, and
no batch can be handed a row that was overwritten.

Memory is fixed when the loader is made and reported by `OnlineLoader.memory`: the slots, the
tables (a slot per node, a few per slot), and per extractor its staging rows and its reader's
bounce buffer. The topology is memory-mapped and sampled on the fly; the features never enter
the page cache, so whatever a memory limit leaves beyond these is the topology's.
"""
from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data

from ...errors import ConfigError
from ..formats.sizes import format_bytes
from ..prepare.seeds import BatchOrder
from ..prepare.task import BatchSeeds, SeedSource, attach_labels
from .batches import Sample, Sampler, batch_data, epoch_batches
from .config import DEFAULT_EXTRACTORS, DEFAULT_WINDOW  # (set there, torch-free, for the CLI)
from .pipe import END, Pipe, StageClock, guard
from .rowcache import NODE_TABLE_BYTES, PLANNED_SLOT_BYTES, SLOT_TABLE_BYTES, RowCache, SlotPlan
from .rowreader import (
    DEFAULT_GAP_BYTES,
    DEFAULT_UNIT_BYTES,
    MAX_STAGING_BYTES,
    RowReader,
    bounce_bytes,
    staging_bytes_for,
)

__all__ = ["DEFAULT_EXTRACTORS", "DEFAULT_WINDOW", "OnlineLoader", "buffer_slots"]


def buffer_slots(budget: int, num_nodes: int, row_bytes: int, extractors: int,
                 staging_bytes: int | None = None) -> int:
    """Row slots that fit `budget` host bytes beside the tables and the extractors' buffers (their staging:
    `staging_bytes_for` the budget unless given).

    Raises:
        ConfigError: (``cpu_memory``) the budget does not even hold those.
    """
    if staging_bytes is None:
        staging_bytes = staging_bytes_for(budget, extractors)
    fixed = num_nodes * NODE_TABLE_BYTES + extractors * (staging_bytes + bounce_bytes(staging_bytes))
    per_slot = row_bytes + SLOT_TABLE_BYTES + PLANNED_SLOT_BYTES
    slots = (int(budget) - fixed) // per_slot
    if slots < 1:
        raise ConfigError("cpu_memory", f"{format_bytes(budget)} does not hold the feature buffer's tables and "
                                        f"staging ({format_bytes(fixed)} for {num_nodes:,} nodes and "
                                        f"{extractors} extractors) and one row")
    return int(slots)


def _named(fn: Any, name: str) -> Any:
    """`fn` as a function called `name` (a stage thread's name)."""
    def run() -> None:
        fn()
    run.__name__ = name
    return run


class OnlineLoader:
    """Training batches sampled on the fly, their features extracted into a planned `RowCache` as they go.

    The same batches as `batches.InMemoryLoader` (same seed order, same sampling seeds, same `Data`),
    so losses equal the in-memory pipeline's. Stages, each a thread joined by bounded queues: sample
    (`window` + `extractors` batches ahead), plan (slots, in batch order; a batch's misses, sorted by
    node, cut into up to `extractors` contiguous chunks), extract (`extractors` threads, a chunk each:
    several batches' reads, and one batch's chunks, in flight at once; batches finish out of order),
    gather (in batch order: the matrix from the buffer, the batch's slots released).

    Attributes after an iteration: `stage_s` (``sample``, ``plan``, ``slots``: planning waiting for slots
    that batches in flight hold, ``extract`` busy seconds summed over extractors, ``gather``, ``wait``:
    the trainer waiting for a batch), `counts` (rows, hits, misses,
    evictions, rows_read, bytes_read, requests), `first_batch_s` (iteration start to first batch).
    """

    def __init__(self, store: Any, buffer: RowCache, labels: torch.Tensor, sampler: Sampler,
                 seeds: np.ndarray, batch_size: int, seed: int, *, order: BatchOrder | None = None,
                 extractors: int = DEFAULT_EXTRACTORS, window: int = 0,
                 staging_bytes: int = MAX_STAGING_BYTES, gap_bytes: int = DEFAULT_GAP_BYTES,
                 unit_bytes: int = DEFAULT_UNIT_BYTES, source: SeedSource | None = None) -> None:
        if extractors < 1:
            raise ConfigError("extractors", f"expected an integer >= 1, got {extractors}")
        if window < 0:
            raise ConfigError("window", f"expected an integer >= 0, got {window}")
        self.store, self.buffer, self.labels, self.sampler = store, buffer, labels, sampler
        self.seeds = np.asarray(seeds, np.int64)
        self.batch_size, self.seed, self.order = batch_size, seed, order
        self.source = source        # a link task's batches (`prepare.task.SeedSource`); None: `seeds`
        self.extractors, self.window, self.staging_bytes = extractors, window, staging_bytes
        self.readers = [RowReader(store, staging_bytes, gap_bytes, unit_bytes) for _ in range(extractors)]
        self.epoch = 0
        self.stage_s: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.first_batch_s: float | None = None
        self.order_seen: list[int] = []          # batch indices in the order extraction finished (tests)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        if self.source is not None:
            return len(self.source)
        return (int(self.seeds.shape[0]) + self.batch_size - 1) // self.batch_size

    def memory(self) -> dict[str, int]:
        """The loader's fixed host memory: slots, tables, and per extractor its staging and bounce buffers."""
        rows = self.buffer.slots * self.buffer.row_bytes
        staging = self.extractors * (self.staging_bytes + bounce_bytes(self.staging_bytes))
        return {"buffer_bytes": rows, "table_bytes": self.buffer.table_bytes, "staging_bytes": staging,
                "total_bytes": rows + self.buffer.table_bytes + staging}

    def _chunks(self, misses: int) -> list[tuple[int, int]]:
        """A batch's misses (sorted by node) cut into contiguous ranges, one per extractor, each at least a
        staging piece: the extractors read one batch together when the buffer holds only one in flight."""
        per = max(self.readers[0].piece, -(-misses // self.extractors))
        return [(lo, min(misses, lo + per)) for lo in range(0, misses, per)] or [(0, 0)]

    def close(self) -> None:
        for r in self.readers:
            r.close()

    def __iter__(self) -> Iterator[Data]:
        pipe = Pipe()
        clocks = {k: StageClock() for k in ("sample", "plan", "gather")}
        extract_clocks = [StageClock() for _ in range(self.extractors)]
        samples: queue.Queue = queue.Queue(maxsize=self.window + self.extractors)
        planned: queue.Queue = queue.Queue(maxsize=2 * self.extractors)
        ready: queue.Queue = queue.Queue(maxsize=1)
        done: dict[int, tuple[Sample, SlotPlan]] = {}
        pending: dict[int, int] = {}          # chunks of a batch not yet read
        done_cond = threading.Condition()
        before = [r.reader.counters() for r in self.readers]
        counts0 = dict(self.buffer.counts)
        wait0 = self.buffer.wait_s
        if self.source is not None:
            batches = self.source.epoch(self.epoch)
        else:
            batches = [BatchSeeds(ids, sampling_seed) for ids, sampling_seed in
                       epoch_batches(self.seeds, self.batch_size, self.epoch, self.seed, order=self.order)]
        self.order_seen = []

        def sample() -> None:
            for i, b in enumerate(batches):
                t = time.perf_counter()
                s = attach_labels(self.sampler.sample(b.seeds, b.sampling_seed), b)
                clocks["sample"].busy += time.perf_counter() - t
                pipe.put(samples, (i, s), clocks["sample"])
            pipe.put(samples, END, clocks["sample"])

        def plan() -> None:
            ahead: list[Any] = []
            ended = False
            while True:
                while not ended and len(ahead) <= self.window:
                    item = pipe.get(samples, clocks["plan"])
                    if item is END:
                        ended = True
                    else:
                        ahead.append(item)
                if not ahead:
                    break
                i, s = ahead.pop(0)
                t = time.perf_counter()
                window = [np.asarray(x.n_id) for _, x in ahead] if self.window else None
                p = self.buffer.plan(i, s.n_id, window, pipe.stop)
                clocks["plan"].busy += time.perf_counter() - t
                pipe.check()
                t = time.perf_counter()
                ids = np.asarray(s.n_id, np.int64)[p.miss]
                order = np.argsort(ids, kind="stable")
                ids, slots = ids[order], p.slots[order]
                cuts = self._chunks(ids.shape[0])
                with done_cond:
                    pending[i] = len(cuts)
                clocks["plan"].busy += time.perf_counter() - t
                for lo, hi in cuts:
                    pipe.put(planned, (i, s, p, ids[lo:hi], slots[lo:hi]), clocks["plan"])
            for _ in range(self.extractors):
                pipe.put(planned, END, clocks["plan"])

        def extract(k: int) -> None:
            reader, clock = self.readers[k], extract_clocks[k]
            while True:
                item = pipe.get(planned, clock)
                if item is END:
                    return
                i, s, p, ids, slots = item
                t = time.perf_counter()
                reader.read(ids, slots, self.buffer, i)
                clock.busy += time.perf_counter() - t
                with done_cond:
                    pending[i] -= 1
                    if pending[i] == 0:       # the batch's last chunk
                        del pending[i]
                        done[i] = (s, p)
                        self.order_seen.append(i)
                        done_cond.notify_all()

        def gather() -> None:
            rows = torch.from_numpy(self.buffer.rows)
            edge_table = getattr(self.store, "edge_features", None)
            for i in range(len(batches)):
                t = time.perf_counter()
                with done_cond:
                    while i not in done:
                        pipe.check()
                        done_cond.wait(0.05)
                    s, p = done.pop(i)
                clocks["gather"].starved += time.perf_counter() - t
                t = time.perf_counter()
                x = rows.index_select(0, torch.from_numpy(p.aliases))
                self.buffer.release(p.aliases)
                n_id = torch.from_numpy(np.ascontiguousarray(s.n_id, dtype=np.int64))
                # e_id and the edge rows at it only where the graph has edge features (read through the
                # page cache: an online pipeline plans no reads ahead)
                e_id = getattr(s, "e_id", None)
                edge_attr = None if edge_table is None or e_id is None else \
                    torch.from_numpy(edge_table.gather(np.asarray(e_id)))
                data = batch_data(s, x, self.labels.index_select(0, n_id), edge_attr,
                                  edge_ids=edge_table is not None or bool(getattr(s, "typed", False)))
                clocks["gather"].busy += time.perf_counter() - t
                pipe.put(ready, data, clocks["gather"])
            pipe.put(ready, END, clocks["gather"])

        stages = [guard(pipe, sample), guard(pipe, plan), guard(pipe, gather)]
        stages += [guard(pipe, _named(functools.partial(extract, k), f"extract{k}")) for k in range(self.extractors)]
        threads = [threading.Thread(target=fn, name=f"online-{j}", daemon=True) for j, fn in enumerate(stages)]
        start = time.perf_counter()
        self.first_batch_s = None
        wait = StageClock()
        for th in threads:
            th.start()
        try:
            while True:
                item = pipe.get(ready, wait)
                if item is END:
                    break
                if self.first_batch_s is None:
                    self.first_batch_s = time.perf_counter() - start
                yield item
        finally:
            pipe.stop.set()
            for th in threads:
                th.join()
            self._tally(clocks, extract_clocks, wait, before, counts0, self.buffer.wait_s - wait0)
        if pipe.error is not None:
            raise pipe.error

    def _tally(self, clocks: dict[str, StageClock], extract_clocks: list[StageClock], wait: StageClock,
               before: list[dict[str, float]], counts0: dict[str, int], slot_wait: float) -> None:
        self.stage_s = {"sample": clocks["sample"].busy, "plan": clocks["plan"].busy - slot_wait, "slots": slot_wait,
                        "extract": sum(c.busy for c in extract_clocks), "gather": clocks["gather"].busy,
                        "wait": wait.starved}
        after = [r.reader.counters() for r in self.readers]
        c = {k: self.buffer.counts[k] - counts0[k] for k in self.buffer.counts}
        self.counts = {"rows": c["rows"], "hits": c["hits"], "misses": c["misses"], "evictions": c["evicted"],
                       "waits": c["waits"]}
        self.counts["rows_read"] = self.counts["misses"]
        self.counts["bytes_read"] = int(sum(a["bytes_read"] - b["bytes_read"] for a, b in zip(after, before)))
        self.counts["requests"] = int(sum(a["requests"] - b["requests"] for a, b in zip(after, before)))
