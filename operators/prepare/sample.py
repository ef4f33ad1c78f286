"""Multi-hop uniform neighbor sampling with the output of PyG's `NeighborLoader`.

Two implementations of one semantics (homogeneous graph, ``disjoint=False``):

* `NeighborSampler`: the native sampler (C++, threads, GIL released), the one pipelines use;
* `numpy_sample`: a vectorised numpy reference, for tests and as the benchmark's baseline.

Semantics. The graph is CSC by destination: the in-neighbours of ``v`` are
``indices[indptr[v]:indptr[v+1]]``. At hop ``h`` the frontier is the set of nodes first
discovered at hop ``h-1`` (hop 0: the seeds), so nodes are never expanded twice. A frontier
node with ``deg <= fanout`` (or ``fanout == -1``) takes all its in-neighbours in CSC order;
otherwise ``fanout`` distinct edges are drawn uniformly without replacement. Every sampled
neighbour ``u`` gets a local id (existing, or appended to ``n_id`` in discovery order) and the
edge ``local(u) -> local(v)`` is emitted, so ``edge_index`` is in PyG's source->target
orientation: row 0 the sampled neighbour (message source), row 1 the node it was sampled for.
Edges are ordered by hop, then frontier position, then sampled order. As PyG's samplers do, both
report which edges they sampled: ``e_id[j]`` is the position in ``indices`` of the edge in
column ``j`` of ``edge_index`` (``indptr[v]`` plus the offset drawn for ``v``), so a batch can
carry edge attributes stored in CSC order (``edge_attr[e_id]``), aligned with ``edge_index``.

The native draws are a pure function of ``(seed, hop, node)``: the same ``seed`` gives
bit-identical output whatever the thread count; a node drawn at the same hop in two batches
sampled with the same ``seed`` draws the same neighbours, so give every batch its own seed.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import ConfigError

__all__ = ["NUMPY_DEDUP", "NeighborSampler", "SampledBatch", "check_fanouts", "numpy_sample"]

_UINT64_MASK = (1 << 64) - 1


@dataclass
class SampledBatch:
    """One sampled subgraph: ids only (node features and edge attributes join later, at assembly).

    `e_id` says which graph edges were sampled, so edge attributes can follow `edge_index`: column
    ``j`` of `edge_index` is the edge at position ``e_id[j]`` of the CSC ``indices``
    (``indices[e_id] == n_id[edge_index[0]]``). None where a batch was built without it.
    """

    n_id: np.ndarray  # int64 [num_nodes] (int32 for a narrow sample), seeds first
    edge_index: np.ndarray  # int64 [2, num_edges] (int32 for a narrow sample), local ids, source->target
    num_sampled_nodes: list[int]
    num_sampled_edges: list[int]
    batch_size: int
    # int64 [num_edges], or int32 for a narrow sample of a graph of at most 2**31 edges
    e_id: np.ndarray | None = None
    typed: bool = False     # a typed graph's flat sample (`typedsample`): its e_id tells the edge types


def check_fanouts(fanouts: Sequence[int]) -> list[int]:
    """Validate per-hop fanouts (each >= 0, or -1 for all neighbours) and return them as ints.

    Raises:
        ConfigError: empty, not integers, or a value below -1.
    """
    values = list(fanouts)
    if not values:
        raise ConfigError("fanouts", "needs at least one hop, e.g. [10, 15]")
    out = []
    for h, f in enumerate(values):
        if isinstance(f, bool) or not isinstance(f, (int, np.integer)):
            raise ConfigError("fanouts", f"hop {h}: {f!r} is not an integer")
        if f < -1:
            raise ConfigError("fanouts", f"hop {h}: {f} must be >= 0, or -1 for all neighbours")
        out.append(int(f))
    return out


def _as_numpy(x: Any) -> np.ndarray:
    """A numpy view of `x`; a CPU torch tensor is viewed without a copy (`.numpy()`)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        view: np.ndarray = x.detach().cpu().numpy()
        return view
    return np.asarray(x)


def _as_seeds(seeds: Any) -> np.ndarray:
    """Seeds as a 1-D int64 array: other integer widths are converted (a batch is small)."""
    arr = _as_numpy(seeds)
    if arr.dtype.kind in "iu" and arr.dtype != np.int64:
        arr = arr.astype(np.int64)
    return arr


class NeighborSampler:
    """The native multi-hop sampler over one CSC graph (see the module docstring).

    The graph arrays are referenced, not copied (numpy arrays, memmaps or CPU torch tensors);
    they must stay unchanged while the sampler lives. One object may be shared by threads:
    calls on it are serialised, each parallel inside over `num_threads` threads.

    Args:
        indptr: int64 [N+1], C-contiguous.
        indices: int32 or int64 [E], C-contiguous.
        fanouts: neighbours per frontier node, per hop (-1 = all).
        num_threads: threads per hop; None means `os.cpu_count()`. The output does not depend on it.

    Raises:
        ConfigError: bad fanouts or num_threads.
        ValueError: arrays of the wrong dtype/shape/layout, or an inconsistent indptr.
    """

    def __init__(self, indptr: Any, indices: Any, fanouts: Sequence[int], num_threads: int | None = None) -> None:
        from ...native.kernels import NeighborSampler as NativeNeighborSampler

        self.fanouts = check_fanouts(fanouts)
        threads = (os.cpu_count() or 1) if num_threads is None else int(num_threads)
        if threads < 1:
            raise ConfigError("num_threads", f"{threads} must be >= 1")
        self.indptr = _as_numpy(indptr)
        self.indices = _as_numpy(indices)
        self._impl = NativeNeighborSampler(self.indptr, self.indices, self.fanouts, threads)
        self.num_threads = threads

    @property
    def num_nodes(self) -> int:
        return int(self._impl.num_nodes)

    def sample(self, seeds: Any, seed: int, stop: Any = None, last_hop: bool = False,
               narrow: bool = False, thin: int = 0) -> SampledBatch:
        """Sample the subgraph around `seeds` (unique node ids, int64 or any integer dtype).

        Args:
            seeds: unique node ids in [0, N), 1-D.
            seed: random seed; the same seed gives bit-identical output.
            stop: node ids never expanded when they join a frontier after the seeds' (their subtree is
                pruned, e.g. where a historical embedding stands in for it); every other node draws the
                neighbours it draws without `stop`.
            last_hop: prune less: the `stop` nodes, and the nodes that only they (or such nodes) drew
                when they joined the batch, are expanded as usual except at the last hop. Where a
                historical embedding stands in for a stop node's last-but-one layer, every other
                node's lower layers then see exactly what they see without `stop`.
            thin: with `last_hop`, the neighbours (at most the last hop's fanout) that each node left
                unexpanded at the last hop draws there after all (0: none). Where a historical embedding
                stands in for a stop node, the model's gradient runs through that node's children; one
                neighbour each gives their rows a neighbour mean instead of none (docs/benchmarks.md).
            narrow: `n_id` and `edge_index` as int32, as the samples files store them (half the bytes, no
                conversion pass), and `e_id` too when the graph has at most 2**31 edges (int64 past
                that: its positions would not fit, while its node ids may); the same values.

        Returns:
            The batch, with `e_id` (each sampled edge's position in `indices`, column for column with
            `edge_index`).

        Raises:
            ValueError: seeds out of range, duplicated, not integers; a corrupt `indices` entry; `narrow`
                on a graph of more than 2**31 nodes; `thin` below 0.
        """
        s = _as_seeds(seeds)
        st = None if stop is None else np.ascontiguousarray(_as_numpy(stop), dtype=np.int64).reshape(-1)
        n_id, edge_index, e_id, nodes, edges = self._impl.sample(s, int(seed) & _UINT64_MASK, st, bool(last_hop),
                                                                 bool(narrow), int(thin))
        return SampledBatch(n_id, edge_index, list(nodes), list(edges), int(s.shape[0]), e_id)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + c) for every (s, c), vectorised."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(counts)
    return np.repeat(starts - (ends - counts), counts) + np.arange(total, dtype=np.int64)


def _check_seeds_numpy(seeds: np.ndarray, num_nodes: int) -> None:
    if seeds.ndim != 1 or seeds.dtype.kind not in "iu":
        raise ValueError(f"seeds must be a 1-D integer array, got {seeds.dtype} with {seeds.ndim} dimensions")
    bad = np.flatnonzero((seeds < 0) | (seeds >= num_nodes))
    if bad.size:
        raise ValueError(f"seeds[{bad[0]}] = {seeds[bad[0]]} is out of range [0, {num_nodes})")
    if np.unique(seeds).size != seeds.size:
        raise ValueError("seeds must be unique (duplicates found)")


NUMPY_DEDUP = ("unique", "minimum-at")


def numpy_sample(indptr: Any, indices: Any, seeds: Any, fanouts: Sequence[int],
                 rng: np.random.Generator, *, dedup: str = "unique") -> SampledBatch:
    """The same semantics as `NeighborSampler.sample`, vectorised in numpy (different draws).

    Per hop: all candidate edge positions of the frontier nodes that must be subsampled get a
    random key; sorting by (node, key) and cutting at rank `fanout` within each node keeps a
    uniform sample without replacement. The sort is one stable argsort of the composite integer
    ``node << b | key`` (as a lexsort, but far faster: the nodes are already in runs), where the
    key takes all ``b = 63 - bits(nodes)`` remaining bits, so ties (broken by position) have
    probability about ``deg**2 / 2**(b+1)``, under 1e-9 for any real frontier.
    Nodes that take all their neighbours are expanded as ranges. New nodes get local ids in
    first-occurrence order. The edge positions drawn are the batch's `e_id` (int64).

    Args:
        indptr: int64 [N+1]; indices: integer [E]; seeds: unique ids in [0, N).
        fanouts: per hop (-1 = all).
        rng: the numpy generator drawing the keys.
        dedup: how new nodes are found in first-occurrence order: "unique" (`np.unique` with
            `return_index`, then an argsort of the first indices) or "minimum-at" (the first
            position of every node by `np.minimum.at` into an N-sized scratch array: no sort,
            about 10x faster on large hops). Same output either way.

    Raises:
        ConfigError: bad fanouts or dedup.
        ValueError: seeds out of range or duplicated.
    """
    hops = check_fanouts(fanouts)
    if dedup not in NUMPY_DEDUP:
        raise ConfigError("dedup", f"{dedup!r} is not one of {NUMPY_DEDUP}")
    indptr = _as_numpy(indptr).astype(np.int64, copy=False)
    indices = _as_numpy(indices)
    seeds = _as_seeds(seeds)
    num_nodes = indptr.shape[0] - 1
    _check_seeds_numpy(seeds, num_nodes)

    local = np.full(num_nodes, -1, dtype=np.int64)  # global -> local id
    local[seeds] = np.arange(seeds.shape[0])
    first_pos = np.empty(num_nodes, dtype=np.int64) if dedup == "minimum-at" else None
    n_id_parts = [seeds.astype(np.int64)]
    edge_parts: list[tuple[np.ndarray, np.ndarray]] = []
    e_id_parts = [np.zeros(0, dtype=np.int64)]  # the edge positions drawn, hop by hop
    num_nodes_out = [int(seeds.shape[0])]
    num_edges_out: list[int] = []
    frontier, frontier_start = n_id_parts[0], 0
    for fanout in hops:
        starts = indptr[frontier]
        deg = indptr[frontier + 1] - starts
        take = deg if fanout < 0 else np.minimum(deg, fanout)
        out_off = np.cumsum(take) - take  # first output slot of every frontier node
        positions = np.empty(int(take.sum()), dtype=np.int64)
        sub = (take < deg) & (take > 0)
        # Nodes taking all their neighbours (or none): their CSC ranges, in order.
        positions[_ranges(out_off[~sub], take[~sub])] = _ranges(starts[~sub], take[~sub])
        # Nodes to subsample: random keys, sort by (node, key), keep the first `fanout` of each.
        part = np.flatnonzero(sub)
        if part.size:
            cand = _ranges(starts[part], deg[part])
            key_bits = 63 - int(part.size).bit_length()
            seg = np.repeat(np.arange(part.size, dtype=np.int64), deg[part])
            keys = rng.integers(0, 1 << key_bits, size=cand.size, dtype=np.int64)
            order = np.argsort((seg << key_bits) | keys, kind="stable")
            rank = np.arange(cand.size) - np.repeat(np.cumsum(deg[part]) - deg[part], deg[part])
            keep = rank < fanout  # rank of the sorted element within its node (seg is sorted already)
            slots = np.repeat(out_off[part], fanout) + np.tile(np.arange(fanout), part.size)
            positions[slots] = cand[order[keep]]
        nbrs = indices[positions].astype(np.int64, copy=False)
        cols = np.repeat(np.arange(frontier_start, frontier_start + frontier.size), take)
        # New nodes in order of first occurrence get the next local ids.
        fresh = nbrs[local[nbrs] < 0]
        if first_pos is None:
            uniq, first = np.unique(fresh, return_index=True)
            new_nodes = uniq[np.argsort(first, kind="stable")]
        else:
            pos = np.arange(fresh.size)
            first_pos[fresh] = fresh.size
            np.minimum.at(first_pos, fresh, pos)
            new_nodes = fresh[first_pos[fresh] == pos]
        next_id = sum(num_nodes_out)
        local[new_nodes] = np.arange(next_id, next_id + new_nodes.size)
        edge_parts.append((local[nbrs], cols))
        e_id_parts.append(positions)
        n_id_parts.append(new_nodes)
        num_nodes_out.append(int(new_nodes.size))
        num_edges_out.append(int(nbrs.size))
        frontier, frontier_start = new_nodes, next_id
    n_id = np.concatenate(n_id_parts)
    edge_index = np.empty((2, sum(num_edges_out)), dtype=np.int64)
    np.concatenate([r for r, _ in edge_parts], out=edge_index[0])
    np.concatenate([c for _, c in edge_parts], out=edge_index[1])
    return SampledBatch(n_id, edge_index, num_nodes_out, num_edges_out, int(seeds.shape[0]),
                        np.concatenate(e_id_parts))
