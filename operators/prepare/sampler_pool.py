"""Idle neighbour samplers kept from one superbatch's sampling task to the next in a process.

A sampling task samples one superbatch (a few minibatches) and used to open the store and build
a `NeighborSampler` of its own. Building one checks the whole `indptr` (one pass over N + 1
entries), and its first batch fills a scratch array of N entries; on the prepare benchmark's
graph (8.4M nodes) that was ~30 ms of CPU a task against ~230 ms of sampling, and on a Dask
worker, where an array that size is mapped fresh and zeroed by the kernel, more. A task now
leases a sampler: an idle one built for the same store (the same manifest file, unchanged),
fanouts and thread count, or a new one, given back when the task is done.

A process keeps no more samplers idle than it has had leased at once since the pool was last
emptied (its sampling concurrency: one per scheduler thread that samples; the least recently
returned go first), so what the pool holds is what its sampling tasks held anyway while they ran:
each keeps its scratch (4 bytes a node) and its memory maps of the topology. `drop_idle_samplers`
lets them go: `flow.prepare` calls it when a prepare ends, in its own process and on every worker of
the cluster it ran on; a streaming run's CPU worker keeps its samplers from superbatch to superbatch.
A sampler whose task failed is not kept.
"""
from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..formats.manifest import MANIFEST
from ..formats.store import Store
from .sample import NeighborSampler
from .samplers import store_sampler
from .typedsample import TypedNeighborSampler, as_fanouts

__all__ = ["PooledSampler", "drop_idle_samplers", "idle_samplers", "leased_sampler"]

_lock = threading.Lock()
_idle: list[tuple[tuple[Any, ...], PooledSampler]] = []    # least recently returned first
_leased = 0            # samplers leased now
_peak = 0              # the most leased at once since the pool was last emptied: how many are kept idle


@dataclass
class PooledSampler:
    """A store opened for sampling and a sampler over its topology (see the module docstring)."""

    store: Store
    sampler: NeighborSampler | TypedNeighborSampler
    _splits: dict[str, np.ndarray] = field(default_factory=dict, init=False, repr=False)

    def split_ids(self, name: str) -> np.ndarray:
        """`Store.split_ids(name)`, computed once per pooled sampler (read-only: shared by its tasks)."""
        ids = self._splits.get(name)
        if ids is None:
            ids = self.store.split_ids(name)
            ids.setflags(write=False)
            self._splits[name] = ids
        return ids

    def link_edges(self, name: str) -> np.ndarray:
        """`Store.link_edges(name)` (a link task's supervision edges), read once per pooled sampler."""
        key = f"link-{name}"
        edges = self._splits.get(key)
        if edges is None:
            edges = np.asarray(self.store.link_edges(name), dtype=np.int64)
            edges.setflags(write=False)
            self._splits[key] = edges
        return edges

    @property
    def num_nodes(self) -> int:
        return self.store.num_nodes

    @property
    def indptr(self) -> np.ndarray:
        return self.store.indptr


def _identity(store_path: str | os.PathLike[str], fanouts: Sequence[int], num_threads: int | None) -> tuple[Any, ...]:
    """What a pooled sampler must match: the store's manifest file as it is now (a re-ingest replaces
    it by a rename, so its inode changes), the fanouts and the thread count."""
    path = os.path.realpath(store_path)
    try:
        st = os.stat(os.path.join(path, MANIFEST))
    except OSError:
        return (path, None, as_fanouts(fanouts), num_threads)      # Store() below raises the clear error
    return (path, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, as_fanouts(fanouts), num_threads)


@contextlib.contextmanager
def leased_sampler(store_path: str | os.PathLike[str], fanouts: Sequence[int],
                   num_threads: int | None = None) -> Iterator[PooledSampler]:
    """A sampler over the store at `store_path` for the block (`NeighborSampler`'s arguments), its
    topology faulted in (`Store.populate_topology`); idle again afterwards unless the block raised."""
    global _leased, _peak
    key = _identity(store_path, fanouts, num_threads)
    entry = None
    with _lock:
        _leased += 1
        _peak = max(_peak, _leased)
        for i in range(len(_idle) - 1, -1, -1):
            if _idle[i][0] == key:
                entry = _idle.pop(i)[1]
                break
    kept = False
    try:
        if entry is None:
            store = Store(store_path)
            entry = PooledSampler(store, store_sampler(store, as_fanouts(fanouts), num_threads=num_threads))
        entry.store.populate_topology()   # cheap where it is resident; faults it back in where it was evicted
        yield entry
        kept = True                       # not reached when the block raised: a failed task's sampler is dropped
    finally:
        with _lock:
            _leased -= 1
            if kept and entry is not None:
                _idle.append((key, entry))
                del _idle[:max(0, len(_idle) - _peak)]


def drop_idle_samplers() -> int:
    """Let every idle sampler go (their scratch and memory maps); how many there were."""
    global _peak
    with _lock:
        n = len(_idle)
        _idle.clear()
        _peak = _leased                   # the next tasks' concurrency decides what is kept from now on
    return n


def idle_samplers() -> int:
    """How many samplers are idle in this process."""
    with _lock:
        return len(_idle)
