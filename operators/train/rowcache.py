"""One bounded cache of a store's feature rows, read with O_DIRECT: the PyG backend's and the online loader's.

A `RowCache` is a fixed array of row slots, a table node -> slot (one entry per node) and, per slot, its
node and its key; a `Policy` says which key a row gets and which slots give way first. Memory is fixed
when the cache is made. Rows are read from the store's feature shards by a `RowReader` (the native
direct-I/O reader: the page cache is bypassed, each distinct 512-byte sector read once where the device
allows it, reads merged across short gaps). A cache is used one of two ways:

* **read-through** (`RowCache.for_store`, `gather`; `diskflow.pyg.FeatureStore`): a call's rows are
  copied from the slots or read from the store, and a missed row takes the place of the lowest-keyed
  row when its own key is higher. A row the call asks for never gives way to another of the same call,
  so a call larger than the cache admits what fits and reads the rest past it.
* **planned** (``planned=True``, `plan` / `release`; the online loader, `operators.train.online`): every
  row of a batch must be in a slot, so each miss takes a slot; a batch's slots are pinned (a reference
  count) from its plan until its matrix is gathered, and only unpinned slots give way. Extractors read
  the misses into their slots with their own `RowReader`.

The policies (`POLICIES`), each one meaning whichever way the cache is used:

* ``"degree"``: a row's key is its node's out-degree, the number of neighbour lists that hold it
  (counted once, natively, from the store's ``indices``: an int32 per node). A uniform neighbour sampler
  draws a node about that much more often than a node of degree one: the static degree cache of
  out-of-core GNN loaders, filled as rows are read (nothing is read ahead).
* ``"lru"``: a row's key is the call or batch that last used it, least recently used first (GNNDrive's
  standby list).
* ``"hybrid"`` (planned only: it looks ahead): LSM-GNN's order. A slot's level is its row's next use in
  a lookahead window of batches (empty slot; no use; a use beyond the threshold; a use within it, kept
  longest), and within a level the lowest key, the node's in-degree, goes first.

Every step is a vectorised pass over a call's or batch's ids: no Python loop runs per node.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import ConfigError, InputError
from ...native.constants import ALIGN, DEFAULT_MERGE_BYTES, SECTOR
from ...native.kernels import copy_rows, count_dense
from ...native.reader import DirectReader, aligned_empty
from ..formats.intwidth import byte_offsets
from ..formats.sizes import format_bytes

MAX_STAGING_BYTES = 2 << 20         # a reader's staging rows (misses go through in pieces) ...
MIN_STAGING_BYTES = 64 << 10        # ... sized to 1/16 of the budget over the readers, within these bounds
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
NODE_TABLE_BYTES = 4                # per node: its slot (int32); a policy may hold more (`Policy.node_bytes`)
SLOT_TABLE_BYTES = 8 + 8            # per slot: its node, its key
PLANNED_SLOT_BYTES = 4 + 8          # per slot of a planned cache besides: its reference count, its next use
_PIN = 1 << 40                      # read-through, fixed keys: a call's hits rank above every miss
_NO_USE = np.iinfo(np.int64).max


class Policy:
    """What a row cache keeps: the key an admitted row gets, what a use does to it, and the order in which
    slots give way (lowest first).

    Attributes:
        name: the policy's name in `POLICIES`.
        fixed_keys: a row's key does not change with use (a read-through call's hits are pinned instead).
        lookahead: the order needs the next batches' node ids (a planned cache's window).
        node_bytes: bytes per node the policy holds beside the cache's node table.
    """

    name = ""
    fixed_keys = True
    lookahead = False
    node_bytes = 0

    def keys(self, nodes: np.ndarray, tick: int) -> np.ndarray:
        """The keys (int64) of rows of `nodes` admitted at call or batch `tick`."""
        raise NotImplementedError

    def used(self, key: np.ndarray, slots: np.ndarray, tick: int) -> None:
        """The rows in `slots` were used at `tick` (their keys, `key[slots]`, may change)."""

    def order(self, cache: RowCache, slots: np.ndarray, window: list[np.ndarray] | None) -> np.ndarray:
        """The rank of `slots` (int64): the lowest give way first."""
        return cache.key[slots]

    def arrays(self) -> list[np.ndarray]:
        """The per-node arrays the policy holds (counted in the cache's tables)."""
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class LeastRecentlyUsed(Policy):
    """``"lru"``: a row's key is the call or batch that last used it."""

    name, fixed_keys = "lru", False

    def keys(self, nodes: np.ndarray, tick: int) -> np.ndarray:
        return np.full(nodes.shape[0], tick, np.int64)

    def used(self, key: np.ndarray, slots: np.ndarray, tick: int) -> None:
        key[slots] = tick


class OutDegree(Policy):
    """``"degree"``: a row's key is its node's out-degree, counted from `indices` (the CSC's neighbour lists)."""

    name, node_bytes = "degree", 4

    def __init__(self, indices: np.ndarray, num_nodes: int) -> None:
        self.degree = np.zeros(num_nodes, np.int32)
        count_dense([np.ascontiguousarray(indices)], self.degree)

    def keys(self, nodes: np.ndarray, tick: int) -> np.ndarray:
        return self.degree[nodes].astype(np.int64)

    def arrays(self) -> list[np.ndarray]:
        return [self.degree]


class InDegree:
    """Each node's in-degree, read from the CSC's `indptr` when asked (no array over every node)."""

    def __init__(self, indptr: np.ndarray) -> None:
        self.indptr = indptr

    def __getitem__(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, np.int64)
        return np.asarray(self.indptr[ids + 1], np.int64) - np.asarray(self.indptr[ids], np.int64)


class Lookahead(Policy):
    """``"hybrid"``: LSM-GNN's levels over a window of the next batches, then the lowest static score.

    Args:
        static: each node's static score (an integer array over nodes, or `InDegree`), read once per
            admitted row.
        threshold: next uses at most this many batches ahead are kept longest.
    """

    name, lookahead = "hybrid", True

    def __init__(self, static: Any, threshold: int = 1) -> None:
        self.scores, self.threshold = static, max(1, int(threshold))

    def keys(self, nodes: np.ndarray, tick: int) -> np.ndarray:
        return np.asarray(self.scores[nodes], np.int64) if nodes.size else np.zeros(0, np.int64)

    def order(self, cache: RowCache, slots: np.ndarray, window: list[np.ndarray] | None) -> np.ndarray:
        """Level (empty; no use in the window; a use beyond the threshold; a use within it), then the key.
        The window is scanned whole for every batch, so the paper's "recently inserted" level is empty."""
        next_use = cache.next_use
        next_use.fill(_NO_USE)
        window = window or []
        for ahead in range(len(window), 0, -1):           # farthest first: the nearest use is written last
            s = cache.slot_of[window[ahead - 1]]
            next_use[s[s >= 0]] = ahead
        ahead_of = next_use[slots]
        level = np.where(cache.node_of[slots] < 0, 0,
                         np.where(ahead_of == _NO_USE, 1, np.where(ahead_of > self.threshold, 2, 3))).astype(np.int64)
        return (level << 40) + np.minimum(cache.key[slots], (1 << 40) - 1)

    def __repr__(self) -> str:
        return f"Lookahead(threshold={self.threshold})"


POLICY_TYPES: dict[str, type[Policy]] = {"degree": OutDegree, "lru": LeastRecentlyUsed, "hybrid": Lookahead}
POLICIES = tuple(POLICY_TYPES)                                     # every policy's name
READ_THROUGH = tuple(n for n, t in POLICY_TYPES.items() if not t.lookahead)   # those a read-through cache takes


def policy_for(name: str, store: Any = None, *, static: Any = None, threshold: int = 1,
               allowed: Sequence[str] = POLICIES) -> Policy:
    """The policy called `name`, over `store`'s topology where it needs one (``"degree"``: the out-degrees
    of its ``indices``; ``"hybrid"``: `static`, or the in-degrees of its ``indptr``).

    Raises:
        ConfigError: (``policy``) a name not in `allowed`, or a policy without the scores it needs.
    """
    if name not in allowed:
        raise ConfigError("policy", f"expected one of {', '.join(allowed)}, got {name!r}")
    if name == "lru":
        return LeastRecentlyUsed()
    if name == "degree":
        if store is None:
            raise ConfigError("policy", "the degree policy needs the store's topology")
        return OutDegree(store.indices, int(store.num_nodes))
    if static is None and store is None:
        raise ConfigError("policy", "the hybrid policy needs a static score per node")
    return Lookahead(InDegree(store.indptr) if static is None else static, threshold)


def staging_bytes_for(budget: int, readers: int) -> int:
    """Each reader's staging bytes for a cache of `budget` bytes: 1/16 of it over the readers, within
    [`MIN_STAGING_BYTES`, `MAX_STAGING_BYTES`], a multiple of 4 KiB."""
    share = int(budget) // (16 * max(1, readers))
    return max(MIN_STAGING_BYTES, min(MAX_STAGING_BYTES, share)) // ALIGN * ALIGN


def bounce_bytes(staging_bytes: int) -> int:
    """The page bounce buffer of a reader: as large as its staging, at least one merged request."""
    return max(int(staging_bytes), DEFAULT_MERGE_BYTES)


class RowReader:
    """Reads store rows into a cache's slots (and a caller's rows) with one native direct-I/O reader.

    Rows are read by `DirectReader.read_rows` (each distinct unit once: a 512-byte sector where the device
    allows it, else a 4 KiB page, `unit_bytes`; units merged into one request across gaps of up to
    `gap_bytes`), in shard runs and offset order, in pieces of at most `staging_bytes`. The reader is
    opened in the process that reads (a forked loader worker opens its own: rings and threads do not
    survive fork).
    """

    def __init__(self, store: Any, staging_bytes: int = MAX_STAGING_BYTES, gap_bytes: int = DEFAULT_GAP_BYTES,
                 unit_bytes: int = DEFAULT_UNIT_BYTES) -> None:
        self.store = store
        self.row_bytes = int(store.row_bytes)
        self.bounce_bytes = bounce_bytes(staging_bytes)
        self.gap_bytes, self.unit_bytes = int(gap_bytes), int(unit_bytes)
        self.piece = max(1, int(staging_bytes) // self.row_bytes)
        self.staging = np.empty((self.piece, self.row_bytes), np.uint8)
        self._identity = np.arange(self.piece, dtype=np.int64)
        self._reader: DirectReader | None = None
        self._pid = -1
        self._handles: dict[int, int] = {}

    @property
    def reader(self) -> DirectReader:
        """This process's native reader."""
        if self._reader is None or self._pid != os.getpid():
            self._reader = DirectReader(backend="auto", bounce_bytes=self.bounce_bytes, gap_bytes=self.gap_bytes,
                                        unit_bytes=self.unit_bytes)
            self._pid = os.getpid()
            self._handles = {}
        return self._reader

    def _handle(self, p: int) -> int:
        reader = self.reader
        h = self._handles.get(p)
        if h is None:
            path = self.store.shards[p].path
            try:
                h = self._handles[p] = int(reader.open(str(path)))
            except OSError as e:
                raise InputError(path, f"cannot open feature shard for reading ({e.strerror or e})") from e
        return h

    def read(self, ids: np.ndarray, slots: np.ndarray, cache: RowCache, batch: int | None = None,
             out: np.ndarray | None = None, pos: np.ndarray | None = None) -> None:
        """Rows of nodes `ids` into `cache` slots `slots` (none where a slot is -1) and, with `out`, into
        rows `pos` of `out`.

        Raises:
            InputError: a shard cannot be opened or read (names the shard file, the byte offset and
                `batch` where given).
        """
        if ids.shape[0] == 0:
            return
        if ids.shape[0] > 1 and not bool(np.all(ids[1:] >= ids[:-1])):
            order = np.argsort(ids, kind="stable")
            ids, slots = ids[order], slots[order]
            pos = None if pos is None else pos[order]
        st, rb = self.store, self.row_bytes
        raw = cache.raw
        out_raw = None if out is None else out.view(np.uint8).reshape(out.shape[0], rb)
        where = "" if batch is None else f"batch {batch}: "
        shard = ids // st.shard_rows
        cuts = np.flatnonzero(np.diff(shard)) + 1
        for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, ids.shape[0]].tolist(), strict=True):
            s = st.shards[int(shard[lo])]
            h = self._handle(s.index)
            offsets = byte_offsets(ids[lo:hi] - s.row_start, rb, s.offset)
            for a in range(0, hi - lo, self.piece):       # a loop per staging piece, not per row
                b = min(hi - lo, a + self.piece)
                buf = self.staging[: b - a]
                try:
                    self.reader.read_rows(h, offsets[a:b], rb, buf)
                except OSError as e:
                    raise InputError(s.path, f"{where}reading {b - a:,} feature rows from byte offset "
                                             f"{int(offsets[a]):,} failed: {e.strerror or e}") from e
                if out_raw is not None and pos is not None:
                    copy_rows(out_raw, pos[lo + a: lo + b], buf, self._identity[: b - a])
                d = slots[lo + a: lo + b]
                keep = np.flatnonzero(d >= 0)
                copy_rows(raw, d[keep].astype(np.int64, copy=False), buf, keep)

    @property
    def unit(self) -> int:
        """The unit the reader reads the store's shards in (512 bytes, or 4096 where the device needs it)."""
        return self.reader.unit_of(self._handle(self.store.shards[0].index))

    def counters(self) -> dict[str, float]:
        """The reader's counters in this process (``bytes_read``, ``requests``, ``seconds``); none before a read."""
        if self._reader is None or self._pid != os.getpid():
            return {}
        return self._reader.counters()

    def close(self) -> None:
        """Close the reader's files (a later read reopens them)."""
        if self._reader is not None and self._pid == os.getpid():
            self._reader.close()
        self._reader, self._handles = None, {}


@dataclass
class SlotPlan:
    """Where one batch's rows are: `aliases[k]` is the slot of `n_id[k]`; `miss` the positions of the
    rows to read and `slots` the slots they go to (same order)."""

    aliases: np.ndarray
    miss: np.ndarray
    slots: np.ndarray


class RowCache:
    """A fixed array of row slots, the tables that say which node each holds, and a `Policy` (see the module).

    Args:
        num_nodes: nodes of the graph (the node table has one entry each).
        slots: row slots.
        dim, dtype: a row's shape.
        policy: a `Policy` (`policy_for` makes one by name).
        planned: used by `plan` / `release` (reference counts, a next-use table per slot) rather than
            `gather`; the per-slot tables are the same whichever the policy.
        option: the budget option an error names.

    Attributes:
        counts: ``calls`` (calls or batches), ``rows`` asked for, ``hits``, ``misses``, ``admitted``
            (misses given a slot), ``evicted`` (rows that gave way), ``waits`` (plans that waited for slots).

    Raises:
        ConfigError: (`option`) no slot.
    """

    def __init__(self, num_nodes: int, slots: int, dim: int, dtype: np.dtype | str, policy: Policy, *,
                 planned: bool = False, option: str = "cpu_memory") -> None:
        if slots < 1:
            raise ConfigError(option, "the row cache holds no row")
        self.policy, self.planned, self.option = policy, bool(planned), option
        self.dim, self.dtype = int(dim), np.dtype(dtype)
        self.row_bytes = self.dim * self.dtype.itemsize
        self.slots = int(slots)
        self._raw = aligned_empty(self.slots * self.row_bytes)
        self.raw = self._raw.reshape(self.slots, self.row_bytes)
        self.rows = self._raw.view(self.dtype).reshape(self.slots, self.dim)
        self.slot_of = np.full(num_nodes, -1, np.int32 if self.slots < 2**31 else np.int64)
        self.node_of = np.full(self.slots, -1, np.int64)
        self.key = np.full(self.slots, -1, np.int64)
        self.ref = np.zeros(self.slots if planned else 0, np.int32)
        self.next_use = np.zeros(self.slots if planned else 0, np.int64)
        self.reader: RowReader | None = None    # a read-through cache's (`for_store`)
        self.budget = 0                         # a read-through cache's bytes in all (`for_store`)
        self._tick = 0
        self._cond = threading.Condition()
        self.counts = {"calls": 0, "rows": 0, "hits": 0, "misses": 0, "admitted": 0, "evicted": 0, "waits": 0}
        self.wait_s = 0.0           # seconds `plan` waited for batches in flight to release slots

    # ------------------------------------------------------------------ a read-through cache over a store

    @classmethod
    def for_store(cls, store: Any, budget: int, policy: str = "degree", option: str = "cache_memory") -> RowCache:
        """A read-through cache over `store` whose slots, tables, staging rows and reader's bounce buffer
        fit `budget` bytes (`layout`).

        Raises:
            ConfigError: (``policy``) not one of `READ_THROUGH`; (`option`) the budget does not hold the
                tables and read buffers and one row: the message names the smallest budget that does.
        """
        if policy not in READ_THROUGH:
            raise ConfigError("policy", f"expected one of {', '.join(READ_THROUGH)}, got {policy!r}")
        slots, staging, _, fixed = cls.layout(store, budget, policy)
        if slots < 1:
            least = cls.smallest_budget(store, policy)
            raise ConfigError(option, f"{format_bytes(budget)} does not hold the row cache's node tables and "
                                      f"read buffers ({format_bytes(fixed)} for {int(store.num_nodes):,} nodes) "
                                      f"and one {int(store.row_bytes)}-byte row; the smallest budget that works is "
                                      f"{least:,} bytes ({format_bytes(least)})")
        cache = cls(int(store.num_nodes), slots, int(store.feature_dim), store.feature_dtype,
                    policy_for(policy, store, allowed=READ_THROUGH), option=option)
        cache.reader = RowReader(store, staging)
        cache.budget = int(budget)
        return cache

    @staticmethod
    def layout(store: Any, budget: int, policy: str = "degree") -> tuple[int, int, int, int]:
        """(slots, staging bytes, bounce bytes, fixed bytes) of a read-through cache of `budget` bytes.

        The staging rows are 1/16 of the budget within [64 KiB, 2 MiB], the reader's bounce buffer as
        large (at least one merged request), the node tables `NODE_TABLE_BYTES` a node and the policy's;
        each slot costs its row and `SLOT_TABLE_BYTES`. Never more slots than nodes. Slots may be < 1
        (too small a budget).
        """
        staging = staging_bytes_for(budget, 1)
        bounce = bounce_bytes(staging)
        fixed = store.num_nodes * (NODE_TABLE_BYTES + POLICY_TYPES[policy].node_bytes) + staging + bounce
        slots = (int(budget) - fixed) // (int(store.row_bytes) + SLOT_TABLE_BYTES)
        return int(min(slots, store.num_nodes)), staging, bounce, fixed

    @classmethod
    def smallest_budget(cls, store: Any, policy: str = "degree") -> int:
        """The fewest bytes a read-through cache over `store` works with (the tables, the read buffers, one slot)."""
        per_slot = int(store.row_bytes) + SLOT_TABLE_BYTES
        budget = per_slot
        while True:     # the buffers grow with the budget in steps: a few rounds reach the fixed point
            slots, _, _, fixed = cls.layout(store, budget, policy)
            if slots >= 1:
                return budget
            budget = fixed + per_slot

    @property
    def table_bytes(self) -> int:
        """Bytes of the node table, the per-slot tables and the policy's per-node arrays."""
        arrays: list[np.ndarray] = [self.slot_of, self.node_of, self.key, self.ref, self.next_use, *self.policy.arrays()]
        return int(sum(a.nbytes for a in arrays))

    def memory(self) -> dict[str, int]:
        """A read-through cache's bytes: ``slot_bytes`` (rows), ``table_bytes`` (`table_bytes`),
        ``buffer_bytes`` (its reader's staging rows and bounce buffer), ``total_bytes`` (<= ``budget``)."""
        slot_bytes = self.slots * self.row_bytes
        buffers = 0 if self.reader is None else int(self.reader.staging.nbytes) + self.reader.bounce_bytes
        return {"slot_bytes": slot_bytes, "table_bytes": self.table_bytes, "buffer_bytes": buffers,
                "total_bytes": slot_bytes + self.table_bytes + buffers, "budget": self.budget}

    def counters(self) -> dict[str, float]:
        """A read-through cache's calls, rows asked for, hits, misses (rows read), rows admitted and evicted,
        and its reader's counters (``bytes_read`` from disk, ``requests``, ``seconds``)."""
        out: dict[str, float] = {k: v for k, v in self.counts.items() if k != "waits"}
        if self.reader is not None:
            out.update(self.reader.counters())
        return out

    def cached(self) -> np.ndarray:
        """The node ids the cache holds now (in slot order)."""
        return self.node_of[self.node_of >= 0].copy()

    def gather(self, ids: np.ndarray) -> np.ndarray:
        """Read-through: feature rows of node ids `ids` (int64, in [0, N), repeats allowed) as a new
        (len(ids), dim) array; misses are read and admitted by key.

        Raises:
            InputError: a shard cannot be opened or read (names the shard file and the byte offset).
        """
        if self.reader is None or self.planned:
            raise TypeError("gather needs a read-through cache (RowCache.for_store)")
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        out = np.empty((ids.shape[0], self.dim), self.dtype)
        if ids.shape[0] == 0:
            return out
        fixed = self.policy.fixed_keys
        with self._cond:
            self._tick += 1
            tick = self._tick
            slot = self.slot_of[ids]
            hit = slot >= 0
            hit_pos = np.flatnonzero(hit)
            hit_slots = slot[hit_pos].astype(np.int64)
            copy_rows(out, hit_pos, self.rows, hit_slots)
            self.policy.used(self.key, hit_slots, tick)
            if fixed:                   # this call's rows never give way to its misses
                self.key[hit_slots] += _PIN
            miss_pos = np.flatnonzero(~hit)
            self._count(ids.shape[0], ids.shape[0] - miss_pos.shape[0])
            try:
                if miss_pos.shape[0]:
                    self._admit(ids[miss_pos], miss_pos, out, tick)
            finally:
                if fixed:
                    self.key[hit_slots] -= _PIN
        return out

    def _count(self, rows: int, hits: int) -> None:
        self.counts["calls"] += 1
        self.counts["rows"] += int(rows)
        self.counts["hits"] += int(hits)
        self.counts["misses"] += int(rows) - int(hits)

    def _admit(self, miss_ids: np.ndarray, miss_pos: np.ndarray, out: np.ndarray, tick: int) -> None:
        """Read the missed rows into `out`; admit the highest-keyed distinct ones in place of lower-keyed rows."""
        order = np.argsort(miss_ids, kind="stable")
        ids, pos = miss_ids[order], miss_pos[order]
        first = np.ones(ids.shape[0], bool)
        first[1:] = ids[1:] != ids[:-1]
        rank = np.cumsum(first) - 1                     # each missed row's place among the distinct ones
        cand = ids[first]
        ckey = self.policy.keys(cand, tick)
        k = min(cand.shape[0], self.slots)
        best = np.argpartition(-ckey, k - 1)[:k] if k < cand.shape[0] else np.arange(cand.shape[0])
        best = best[np.argsort(-ckey[best], kind="stable")]               # highest key first
        victims = np.argpartition(self.key, k - 1)[:k] if k < self.slots else np.arange(self.slots)
        victims = victims[np.argsort(self.key[victims], kind="stable")]   # lowest key first
        m = int(np.count_nonzero(ckey[best] > self.key[victims]))       # keys fall on one side, rise on the other
        best, victims = best[:m], victims[:m].astype(np.int64)
        new = cand[best]
        self._install(victims, new, ckey[best])
        cand_slot = np.full(cand.shape[0], -1, np.int64)
        cand_slot[best] = victims
        try:
            assert self.reader is not None
            self.reader.read(ids, cand_slot[rank], self, out=out, pos=pos)
        except BaseException:           # the admitted slots hold no valid row: forget them
            self.slot_of[new] = -1
            self.node_of[victims] = -1
            self.key[victims] = -1
            raise

    def _install(self, victims: np.ndarray, new: np.ndarray, keys: np.ndarray) -> None:
        """Rows of nodes `new` take slots `victims` (whose rows give way), with keys `keys`."""
        old = self.node_of[victims]
        self.slot_of[old[old >= 0]] = -1
        self.counts["evicted"] += int(np.count_nonzero(old >= 0))
        self.counts["admitted"] += int(victims.shape[0])
        self.node_of[victims] = new
        self.slot_of[new] = victims
        self.key[victims] = keys

    def close(self) -> None:
        """Close a read-through cache's reader (the cache can still serve; a later miss reopens it)."""
        if self.reader is not None:
            self.reader.close()

    # ------------------------------------------------------------------ a planned cache (the online loader)

    @property
    def pinned(self) -> int:
        """Slots held by batches planned and not yet released."""
        with self._cond:
            return int(np.count_nonzero(self.ref))

    def plan(self, index: int, n_id: np.ndarray, window: list[np.ndarray] | None = None,
             stop: threading.Event | None = None) -> SlotPlan:
        """Slots for batch `index` (called in batch order): hits pinned, misses given unpinned slots.

        `n_id` holds distinct node ids (a sampler's, seeds first). `window` (a lookahead policy's): the
        node ids of the next batches, nearest first. Waits while the unpinned slots are too few (batches
        in flight release theirs when gathered); returns early if `stop` is set.

        Raises:
            ConfigError: (`option`) the batch alone needs more rows than the cache has.
        """
        assert self.planned, "plan needs a planned cache"
        n_id = np.asarray(n_id, np.int64)
        if n_id.shape[0] > self.slots:
            raise ConfigError(self.option, f"batch {index} has {n_id.shape[0]:,} distinct rows, the feature buffer "
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
            victims = self._victims(free, k, window)
            new = n_id[miss]
            self._install(victims, new, self.policy.keys(new, index))
            self.ref[victims] += 1
            aliases[miss] = victims
            self.policy.used(self.key, aliases, index)
            self._count(n_id.shape[0], n_id.shape[0] - k)
        return SlotPlan(aliases, miss, victims)

    def _victims(self, free: np.ndarray, k: int, window: list[np.ndarray] | None) -> np.ndarray:
        """`k` of the unpinned slots, the policy's first choices (empty slots before any)."""
        if k == 0:
            return np.zeros(0, np.int64)
        if k == free.shape[0]:
            return free.astype(np.int64)
        pick = np.argpartition(self.policy.order(self, free, window), k - 1)[:k]
        return free[pick].astype(np.int64)

    def release(self, aliases: np.ndarray) -> None:
        """Unpin a gathered batch's slots (they may give way again)."""
        with self._cond:
            self.ref[aliases] -= 1
            self._cond.notify_all()


__all__ = ["DEFAULT_GAP_BYTES", "DEFAULT_UNIT_BYTES", "MAX_STAGING_BYTES", "MIN_STAGING_BYTES", "NODE_TABLE_BYTES",
           "PLANNED_SLOT_BYTES", "POLICIES", "READ_THROUGH", "SLOT_TABLE_BYTES", "InDegree", "LeastRecentlyUsed",
           "Lookahead", "OutDegree", "Policy", "RowCache", "RowReader", "SlotPlan", "bounce_bytes", "policy_for",
           "staging_bytes_for"]
