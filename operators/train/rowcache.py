"""One bounded cache of a store's feature rows, read with O_DIRECT: the PyG backend's and the online loader's.

A `RowCache` is a fixed array of row slots, a table node -> slot (one entry per node) and, per slot, its
node and its key; a `Policy` says which key a row gets and which slots give way first. Memory is fixed
when the cache is made. Rows are read from the store's feature shards by a `rowreader.RowReader` (the
native direct-I/O reader). A cache is used one of two ways:

* **read-through** (`RowCache.for_store`, `gather`; `diskflow.pyg.FeatureStore`): a call's rows are
  copied from the slots or read from the store, and a missed row takes the place of the lowest-keyed
  row when its own key is higher. A row the call asks for never gives way to another of the same call,
  so a call larger than the cache admits what fits and reads the rest past it.
* **planned** (``planned=True``, `plan` / `release`; the online loader, `operators.train.online`): every
  row of a batch must be in a slot, so each miss takes a slot; a batch's slots are pinned (a reference
  count) from its plan until its matrix is gathered, and only unpinned slots give way. Extractors read
  the misses into their slots with their own `RowReader`.

The policies (`cachepolicy.POLICIES`) mean the same whichever way the cache is used.

Every step is a vectorised pass over a call's or batch's ids: no Python loop runs per node.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import ConfigError
from ...native.kernels import copy_rows
from ...native.reader import aligned_empty
from ..formats.sizes import format_bytes
from .cachepolicy import POLICY_TYPES, READ_THROUGH, Policy, policy_for
from .rowreader import RowReader, bounce_bytes, staging_bytes_for

__all__ = ["NODE_TABLE_BYTES", "PLANNED_SLOT_BYTES", "SLOT_TABLE_BYTES", "RowCache", "SlotPlan"]

NODE_TABLE_BYTES = 4                # per node: its slot (int32); a policy may hold more (`Policy.node_bytes`)
SLOT_TABLE_BYTES = 8 + 8            # per slot: its node, its key
PLANNED_SLOT_BYTES = 4 + 8          # per slot of a planned cache besides: its reference count, its next use
_PIN = 1 << 40                      # read-through, fixed keys: a call's hits rank above every miss


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
