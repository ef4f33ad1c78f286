"""Training with no preparation: a fixed host feature buffer filled by asynchronous direct-I/O extractors.

Two systems of the field read features online, and both are this one loader with a different
eviction policy (`OnlineLoader`, `FeatureBuffer`):

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
by one thread (`FeatureBuffer.plan`: which rows hit, which slots the misses go to; a batch's
slots are pinned until its matrix is gathered), extractors only ever write slots that no
unfinished batch reads (a slot is chosen as a victim only with reference count 0), and matrices
are gathered in batch order, each after its own reads and every earlier batch's are done. So a
batch that hits a row another batch is still reading (GNNDrive's wait list) waits for it, and
no batch can be handed a row that was overwritten.

Memory is fixed when the loader is made and reported by `FeatureBuffer.memory`: the slots, the
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
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data

from ...errors import ConfigError, InputError
from ...native.constants import ALIGN, DEFAULT_MERGE_BYTES, SECTOR
from ...native.reader import DirectReader, aligned_empty
from ..formats.intwidth import byte_offsets
from ..formats.sizes import format_bytes
from ..prepare.seeds import BatchOrder
from .batches import Sample, Sampler, batch_data, epoch_batches
from .config import DEFAULT_EXTRACTORS, DEFAULT_WINDOW  # noqa: F401  (set there, torch-free, for the CLI)
from .config import ONLINE_TIERS as POLICIES
from .pipe import END, Pipe, StageClock, guard

MAX_STAGING_BYTES = 2 << 20         # each extractor's staging rows (a batch's misses go through in pieces) ...
MIN_STAGING_BYTES = 64 << 10        # ... sized to 1/16 of the budget over the extractors, within these bounds
# Rows are read in 512-byte sectors where the device allows it (GNNDrive's request granularity;
# whole 4 KiB pages elsewhere), and reads go through runs of up to 12 KiB of untouched bytes between
# touched sectors. A request costs ~8 us of a virtio disk's time beside its bytes (fio, 64 in
# flight: 105k 512-byte, 97k 4 KiB, 53k 16 KiB reads/s), so on bench compare's default graph
# (512-byte rows, ~44% of pages touched per batch) the read through short gaps pays: page by page
# took 3.13 s a batch against 2.24 s through 16 KiB gaps (an earlier session); sectors through
# 12 KiB gaps read 2.10 GiB a batch in 129k requests against pages through 16 KiB gaps' 3.53 GiB
# in 47k, 2.85 s against 3.41 s a batch (medians of three alternated runs, on a 1.1 GiB/s day).
DEFAULT_GAP_BYTES = 12 << 10
DEFAULT_UNIT_BYTES = SECTOR
_NO_USE = np.iinfo(np.int64).max
NODE_TABLE_BYTES = 4                # the mapping table: a slot per node (int32)
SLOT_TABLE_BYTES = 8 + 4 + 8 + 8    # per slot: its node, reference count, LRU stamp, static score


@dataclass
class SlotPlan:
    """Where one batch's rows are: `aliases[k]` is the slot of `n_id[k]`; `miss` the positions of the
    rows to read and `slots` the slots they go to (same order)."""

    aliases: np.ndarray
    miss: np.ndarray
    slots: np.ndarray


class FeatureBuffer:
    """A fixed number of row slots and the tables that say which node each holds (see the module docstring).

    Args:
        num_nodes: nodes of the graph (the mapping table has one entry each).
        slots: row slots of the buffer.
        dim, dtype: a row's shape.
        policy: ``"lru"`` (GNNDrive's standby list) or ``"hybrid"`` (LSM-GNN's levels + static score).
        static: ``"hybrid"``: each node's static importance (e.g. its degree), any integer array over
            nodes; read once per inserted row (may be a memory map).
        threshold: ``"hybrid"``: next uses at most this many batches ahead are kept longest.

    Raises:
        ConfigError: (``cpu_memory``) no slot; an unknown policy.
    """

    def __init__(self, num_nodes: int, slots: int, dim: int, dtype: np.dtype | str, policy: str = "lru",
                 static: np.ndarray | None = None, threshold: int = 1) -> None:
        if policy not in POLICIES:
            raise ConfigError("policy", f"expected one of {', '.join(POLICIES)}, got {policy!r}")
        if slots < 1:
            raise ConfigError("cpu_memory", "the feature buffer holds no row")
        if policy == "hybrid" and static is None:
            raise ConfigError("policy", "the hybrid policy needs a static score per node")
        self.policy, self.threshold, self.static = policy, max(1, int(threshold)), static
        self.dim, self.dtype = int(dim), np.dtype(dtype)
        self.row_bytes = self.dim * self.dtype.itemsize
        self.slots = int(slots)
        self._raw = aligned_empty(self.slots * self.row_bytes)
        self.rows = self._raw.view(self.dtype).reshape(self.slots, self.dim)
        self.slot_of = np.full(num_nodes, -1, np.int32 if self.slots < 2**31 else np.int64)
        self.node_of = np.full(self.slots, -1, np.int64)
        self.ref = np.zeros(self.slots, np.int32)
        self.stamp = np.full(self.slots, -1, np.int64)      # the last batch that used the slot (LRU)
        self.score = np.zeros(self.slots, np.int64)         # static score of the slot's node (hybrid)
        self._cond = threading.Condition()
        self.counts = {"rows": 0, "hits": 0, "misses": 0, "evictions": 0, "waits": 0}
        self.wait_s = 0.0           # seconds `plan` waited for batches in flight to release slots

    @property
    def table_bytes(self) -> int:
        """Bytes of the mapping table and the per-slot tables."""
        return int(self.slot_of.nbytes + self.node_of.nbytes + self.ref.nbytes + self.stamp.nbytes + self.score.nbytes)

    @property
    def pinned(self) -> int:
        """Slots held by batches planned and not yet gathered."""
        with self._cond:
            return int(np.count_nonzero(self.ref))

    def plan(self, index: int, n_id: np.ndarray, window: list[np.ndarray] | None = None,
             stop: threading.Event | None = None) -> SlotPlan:
        """Slots for batch `index` (called in batch order): hits pinned, misses given free slots.

        `n_id` holds distinct node ids (a sampler's, seeds first). `window` (``"hybrid"``): the node
        ids of the next batches, nearest first. Waits while the free slots are too few (batches in
        flight release theirs when gathered); returns early if `stop` is set.

        Raises:
            ConfigError: (``cpu_memory``) the batch alone needs more rows than the buffer has.
        """
        n_id = np.asarray(n_id, np.int64)
        if n_id.shape[0] > self.slots:
            raise ConfigError("cpu_memory", f"batch {index} has {n_id.shape[0]:,} distinct rows, the feature buffer "
                                            f"holds {self.slots:,} ({format_bytes(self.slots * self.row_bytes)}); "
                                            f"give at least {format_bytes(n_id.shape[0] * self.row_bytes)} of "
                                            "rows plus the tables")
        with self._cond:
            aliases = self.slot_of[n_id].astype(np.int64)
            hit = aliases >= 0
            self.ref[aliases[hit]] += 1
            miss = np.flatnonzero(~hit)
            k = int(miss.shape[0])
            free = np.flatnonzero(self.ref == 0)
            if free.shape[0] < k:
                self.counts["waits"] += 1
            t_wait = time.perf_counter()
            while free.shape[0] < k:
                self._cond.wait(0.05)
                if stop is not None and stop.is_set():
                    self.ref[aliases[hit]] -= 1
                    return SlotPlan(aliases, miss, np.zeros(0, np.int64))
                free = np.flatnonzero(self.ref == 0)
            self.wait_s += time.perf_counter() - t_wait
            victims = self._victims(index, free, k, window)
            old = self.node_of[victims]
            self.slot_of[old[old >= 0]] = -1
            self.counts["evictions"] += int(np.count_nonzero(old >= 0))
            new = n_id[miss]
            self.node_of[victims] = new
            self.slot_of[new] = victims
            self.ref[victims] += 1
            if self.policy == "hybrid":
                self.score[victims] = self.static[new] if new.size else 0    # type: ignore[index]
            aliases[miss] = victims
            self.stamp[aliases] = index
            self.counts["rows"] += int(n_id.shape[0])
            self.counts["hits"] += int(n_id.shape[0]) - k
            self.counts["misses"] += k
        return SlotPlan(aliases, miss, victims)

    def _victims(self, index: int, free: np.ndarray, k: int, window: list[np.ndarray] | None) -> np.ndarray:
        """`k` of the free slots, the policy's first choices (empty slots before any)."""
        if k == 0:
            return np.zeros(0, np.int64)
        if k == free.shape[0]:
            return free.astype(np.int64)
        if self.policy == "lru":
            key = self.stamp[free]
        else:
            key = self._hybrid_key(index, free, window or [])
        pick = np.argpartition(key, k - 1)[:k]
        return free[pick].astype(np.int64)

    def _hybrid_key(self, index: int, free: np.ndarray, window: list[np.ndarray]) -> np.ndarray:
        """LSM-GNN's order of eviction: level (empty; no use in the window; a use beyond the threshold; a use
        within it), then the lowest static score."""
        next_use = np.full(self.slots, _NO_USE, np.int64)
        for ahead in range(len(window), 0, -1):           # farthest first: the nearest use is written last
            s = self.slot_of[window[ahead - 1]]
            next_use[s[s >= 0]] = ahead
        ahead = next_use[free]
        level = np.where(self.node_of[free] < 0, 0,
                         np.where(ahead == _NO_USE, 1, np.where(ahead > self.threshold, 2, 3))).astype(np.int64)
        return (level << 40) + np.minimum(self.score[free], (1 << 40) - 1)

    def release(self, aliases: np.ndarray) -> None:
        """Unpin a gathered batch's slots (they join the standby list)."""
        with self._cond:
            self.ref[aliases] -= 1
            self._cond.notify_all()

    def memory(self, extractors: int, staging_bytes: int) -> dict[str, int]:
        """The loader's fixed host memory: slots, tables, and per extractor its staging and bounce buffers."""
        staging = extractors * (staging_bytes + bounce_bytes(staging_bytes))
        return {"buffer_bytes": self.slots * self.row_bytes, "table_bytes": self.table_bytes,
                "staging_bytes": staging, "total_bytes": self.slots * self.row_bytes + self.table_bytes + staging}


def staging_bytes_for(budget: int, extractors: int) -> int:
    """Each extractor's staging bytes for a buffer of `budget` bytes: 1/16 of it over the extractors, within
    [`MIN_STAGING_BYTES`, `MAX_STAGING_BYTES`], a multiple of 4 KiB."""
    share = int(budget) // (16 * max(1, extractors))
    return max(MIN_STAGING_BYTES, min(MAX_STAGING_BYTES, share)) // ALIGN * ALIGN


def bounce_bytes(staging_bytes: int) -> int:
    """The page bounce buffer of an extractor's reader: as large as its staging, at least one merged request."""
    return max(int(staging_bytes), DEFAULT_MERGE_BYTES)


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
    per_slot = row_bytes + SLOT_TABLE_BYTES
    slots = (int(budget) - fixed) // per_slot
    if slots < 1:
        raise ConfigError("cpu_memory", f"{format_bytes(budget)} does not hold the feature buffer's tables and "
                                        f"staging ({format_bytes(fixed)} for {num_nodes:,} nodes and "
                                        f"{extractors} extractors) and one row")
    return int(slots)


class StoreRows:
    """Reads store rows into buffer slots with one native direct-I/O reader (one per extractor).

    Rows are read by `DirectReader.read_rows` (each distinct unit once: a 512-byte sector where the device
    allows it, else a 4 KiB page, `unit_bytes`; units merged into one request across gaps of up to
    `gap_bytes`) in pieces of at most `staging_bytes`, and copied into their slots.
    """

    def __init__(self, store: Any, staging_bytes: int = MAX_STAGING_BYTES, gap_bytes: int = DEFAULT_GAP_BYTES,
                 unit_bytes: int = DEFAULT_UNIT_BYTES) -> None:
        self.store = store
        self.reader = DirectReader(backend="auto", bounce_bytes=bounce_bytes(staging_bytes), gap_bytes=gap_bytes,
                                   unit_bytes=unit_bytes)
        self.row_bytes = int(store.row_bytes)
        self.piece = max(1, int(staging_bytes) // self.row_bytes)
        self.staging = np.empty((self.piece, self.row_bytes), np.uint8)
        self._handles: dict[int, int] = {}

    def _handle(self, p: int) -> int:
        h = self._handles.get(p)
        if h is None:
            path = self.store.shards[p].path
            try:
                h = self._handles[p] = int(self.reader.open(str(path)))
            except OSError as e:
                raise InputError(path, f"cannot open feature shard for reading ({e.strerror or e})") from e
        return h

    def read(self, ids: np.ndarray, slots: np.ndarray, buffer: FeatureBuffer, batch: int) -> None:
        """Rows of nodes `ids` into `buffer` slots `slots`.

        Raises:
            InputError: a shard cannot be opened or read (names the shard file and the byte offset).
        """
        if ids.shape[0] == 0:
            return
        if ids.shape[0] > 1 and not bool(np.all(ids[1:] >= ids[:-1])):
            order = np.argsort(ids, kind="stable")
            ids, slots = ids[order], slots[order]
        st, rb = self.store, self.row_bytes
        raw = buffer._raw.reshape(buffer.slots, rb)
        shard = ids // st.shard_rows
        bounds = np.flatnonzero(np.diff(shard)) + 1
        for lo, hi in zip(np.r_[0, bounds].tolist(), np.r_[bounds, ids.shape[0]].tolist(), strict=True):
            s = st.shards[int(shard[lo])]
            h = self._handle(s.index)
            offsets = byte_offsets(ids[lo:hi] - s.row_start, rb, s.offset)
            for a in range(0, hi - lo, self.piece):
                b = min(hi - lo, a + self.piece)
                out = self.staging[: b - a]
                try:
                    self.reader.read_rows(h, offsets[a:b], rb, out)
                except OSError as e:
                    raise InputError(s.path, f"batch {batch}: reading {b - a:,} feature rows from byte offset "
                                             f"{int(offsets[a]):,} failed: {e.strerror or e}") from e
                raw[slots[lo + a: lo + b]] = out

    @property
    def unit(self) -> int:
        """The unit its reader reads the store's shards in (512 bytes, or 4096 where the device needs it)."""
        return self.reader.unit_of(self._handle(self.store.shards[0].index))

    def counters(self) -> dict[str, float]:
        return self.reader.counters()

    def close(self) -> None:
        self.reader.close()


def _named(fn: Any, name: str) -> Any:
    """`fn` as a function called `name` (a stage thread's name)."""
    def run() -> None:
        fn()
    run.__name__ = name
    return run


class OnlineLoader:
    """Training batches sampled on the fly, their features extracted into a `FeatureBuffer` as they go.

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

    def __init__(self, store: Any, buffer: FeatureBuffer, labels: torch.Tensor, sampler: Sampler,
                 seeds: np.ndarray, batch_size: int, seed: int, *, order: BatchOrder | None = None,
                 extractors: int = DEFAULT_EXTRACTORS, window: int = 0,
                 staging_bytes: int = MAX_STAGING_BYTES, gap_bytes: int = DEFAULT_GAP_BYTES,
                 unit_bytes: int = DEFAULT_UNIT_BYTES) -> None:
        if extractors < 1:
            raise ConfigError("extractors", f"expected an integer >= 1, got {extractors}")
        if window < 0:
            raise ConfigError("window", f"expected an integer >= 0, got {window}")
        self.store, self.buffer, self.labels, self.sampler = store, buffer, labels, sampler
        self.seeds = np.asarray(seeds, np.int64)
        self.batch_size, self.seed, self.order = batch_size, seed, order
        self.extractors, self.window, self.staging_bytes = extractors, window, staging_bytes
        self.readers = [StoreRows(store, staging_bytes, gap_bytes, unit_bytes) for _ in range(extractors)]
        self.epoch = 0
        self.stage_s: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.first_batch_s: float | None = None
        self.order_seen: list[int] = []          # batch indices in the order extraction finished (tests)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return (int(self.seeds.shape[0]) + self.batch_size - 1) // self.batch_size

    def memory(self) -> dict[str, int]:
        return self.buffer.memory(self.extractors, self.staging_bytes)

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
        before = [r.counters() for r in self.readers]
        counts0 = dict(self.buffer.counts)
        wait0 = self.buffer.wait_s
        batches = epoch_batches(self.seeds, self.batch_size, self.epoch, self.seed, order=self.order)
        self.order_seen = []

        def sample() -> None:
            for i, (ids, sampling_seed) in enumerate(batches):
                t = time.perf_counter()
                s = self.sampler.sample(ids, sampling_seed)
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
                data = batch_data(s, x, self.labels.index_select(0, n_id))
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
        after = [r.counters() for r in self.readers]
        self.counts = {k: self.buffer.counts[k] - counts0[k] for k in self.buffer.counts}
        self.counts["rows_read"] = self.counts["misses"]
        self.counts["bytes_read"] = int(sum(a["bytes_read"] - b["bytes_read"] for a, b in zip(after, before)))
        self.counts["requests"] = int(sum(a["requests"] - b["requests"] for a, b in zip(after, before)))
