"""Thin, typed Python wrappers of the native kernels (`_native`, built from `native/*.cpp`).

Operators call these, never `_native` itself: each wrapper states its arguments and results in
Python's terms, and the binding (`native/bindings.cpp`) checks the arrays, releases the GIL and
maps the engine's errors (ValueError for bad input, IndexError for a row position out of range).
No wrapper copies its arrays: they are passed to the engine as they are, so they must already have
the dtype and layout stated (1-D C-contiguous int64 unless said otherwise).

Kernels:
    NeighborSampler: multi-hop uniform neighbor sampling (sampler.cpp); operators use it through
        `diskflow.operators.prepare.sample.NeighborSampler`, which checks fanouts and converts seeds.
    belady_plan, belady_trace, belady_simulate, belady_initial_fill, belady_release_workspace: the Belady
        CPU-cache planner (belady.cpp); operators use them through `diskflow.operators.prepare.plan`.
    copy_rows, gather_rows: one-pass row copies between feature matrices (rows.cpp); packing gathers
        every segment with `gather_rows_crc`, which checksums the rows as it copies them (crc32.cpp).
    count_dense: dense access counts of a superbatch (count.cpp);
    count_ids, merge_counts: sparse access counts of a superbatch and their pairwise sum (count.cpp);
        operators use them through `diskflow.operators.prepare.count`.
    route_batch: one batch's plan in the packed index's form, its packed ids grouped by shard
        (route.cpp); operators use it through `diskflow.operators.prepare.route`.

The direct-I/O reader has its own wrapper module, `diskflow.native.reader`.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

import numpy as np

from . import _native
from .forward import NativeInt


class NeighborSampler:
    """Uniform multi-hop neighbor sampler over a CSC graph (PyG NeighborLoader semantics).

    Args:
        indptr: int64 [N+1], C-contiguous; referenced, not copied (kept alive by the sampler).
        indices: int32 or int64 [E], C-contiguous; the source node of every in-edge, grouped by
            destination; referenced, not copied.
        fanouts: per hop, neighbours to sample per frontier node (-1 = all).
        num_threads: worker threads per hop (the output does not depend on it).

    Raises:
        ValueError: arrays of the wrong dtype or layout, an inconsistent indptr, bad fanouts.
    """

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, fanouts: Sequence[int], num_threads: int = 1) -> None:
        self._impl = _native.NeighborSampler(indptr, indices, [int(f) for f in fanouts], int(num_threads))

    num_nodes = NativeInt("N, the graph's node count.")
    num_edges = NativeInt("E, the graph's edge count.")

    @property
    def fanouts(self) -> list[int]:
        """Neighbours sampled per frontier node, per hop (-1 = all)."""
        return list(self._impl.fanouts)

    num_threads = NativeInt("Worker threads per hop.")

    def sample(self, seeds: np.ndarray, seed: int, stop: np.ndarray | None = None, last_hop: bool = False,
               narrow: bool = False, thin: int = 0
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int], list[int]]:
        """The subgraph around unique int64 `seeds`, deterministic in `seed` (an unsigned 64-bit int);
        the int64 nodes of `stop` are not expanded when they join a frontier after the seeds'. With
        `last_hop`, they and the nodes that only they (or such nodes) drew are expanded as usual
        except at the last hop, where they draw min(`thin`, fanout) neighbours each (0: none).

        Returns:
            (n_id int64 [n], edge_index int64 [2, e] of local ids, e_id int64 [e], num_sampled_nodes per
            hop with the seeds first, num_sampled_edges per hop). e_id is each sampled edge's position in
            `indices`, column for column with edge_index, so edge attributes stored in CSC order can be
            gathered for the batch (PyG's e_id). With `narrow`, n_id and edge_index are int32, and e_id
            too when the graph has at most 2**31 edges (else int64). The arrays own their memory (no copy
            was made).

        Raises:
            ValueError: seeds not int64, out of range or repeated; a corrupt `indices` entry; `narrow`
                for a graph of more than 2**31 nodes; `thin` below 0.
        """
        if stop is not None:
            stop = np.ascontiguousarray(stop, dtype=np.int64).reshape(-1)
        n_id, edge_index, e_id, nodes, edges = self._impl.sample(seeds, int(seed), stop, bool(last_hop),
                                                                 bool(narrow), int(thin))
        return n_id, edge_index, e_id, list(nodes), list(edges)


def sample_ranges(starts: np.ndarray, ends: np.ndarray, keys: np.ndarray, indices: np.ndarray, fanout: int,
                  seed: int, salt: int, num_threads: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One hop of a typed sample: range i (positions ``[starts[i], ends[i])`` of `indices`, one node's
    in-edges of one edge type) draws min(`fanout`, its length) distinct positions (all when `fanout` < 0)
    with the generator of node ``keys[i]`` at (`seed`, `salt`), the draw the multi-hop sampler makes for
    a node at one hop: a pure function of those, whatever `num_threads`.

    Returns:
        (counts int64 [n], neighbours int64 = ``indices[positions]``, positions int64), range after range.

    Raises:
        ValueError: arrays of the wrong dtype or layout, a range outside ``[0, len(indices))``.
    """
    return _native.sample_ranges(np.ascontiguousarray(starts, dtype=np.int64), np.ascontiguousarray(ends, dtype=np.int64),
                                 np.ascontiguousarray(keys, dtype=np.int64), indices, int(fanout), int(seed) & (2**64 - 1),
                                 int(salt) & (2**64 - 1), int(num_threads))


class BeladyPlanArrays(TypedDict):
    """A Belady plan as the kernel returns it (see `diskflow.operators.prepare.plan`)."""

    src: np.ndarray             # uint8 per planned access: 0 GPU tier, 1 CPU cache, 2 miss
    idx: np.ndarray             # int64 per planned access: GPU slot, CPU slot or the miss's rank
    insert_pos: np.ndarray      # int64 per insert: position of the missed row in its batch
    insert_slot: np.ndarray     # int64 per insert: the CPU slot it goes to
    insert_offsets: np.ndarray  # int64 [n_plan + 1]: each batch's inserts
    final_cache: np.ndarray     # int64 [capacity]: node per slot after the plan, -1 empty
    hits: int
    misses: int
    gpu_hits: int


class BeladyTraceArrays(TypedDict):
    """A window trace for `belady_simulate`."""

    next_use: np.ndarray   # per planned access: the next window batch using its node
    first_use: np.ndarray  # [num_nodes]: first window batch using each node
    #                        both uint8 below 255 window batches, uint16 below 65535, else int32; none: the
    #                        dtype's largest value
    gpu_slot: np.ndarray   # int32 per planned access: GPU slot or -1 (empty without a GPU tier)


def belady_plan(nodes: np.ndarray, offsets: np.ndarray, n_plan: int, capacity: int, init_cache: np.ndarray,
                gpu_ids: np.ndarray, frequency: np.ndarray | None) -> BeladyPlanArrays:
    """Belady CPU-cache plan of the first `n_plan` batches of a trace (the rest is lookahead).

    Args:
        nodes: every batch's node ids, concatenated (unique within a batch).
        offsets: [B + 1] batch boundaries in `nodes`.
        n_plan: batches to plan (<= B).
        capacity: CPU-cache slots.
        init_cache: [capacity] node per slot, -1 empty.
        gpu_ids: sorted unique node ids of the GPU tier (never cached on the CPU).
        frequency: per-node access counts [N] to rank rows with no use in the window, or None.

    Raises:
        ValueError: malformed arrays or ids.
    """
    out: BeladyPlanArrays = _native.belady_plan(nodes, offsets, int(n_plan), int(capacity), init_cache, gpu_ids,
                                                frequency)
    return out


def belady_trace(nodes: np.ndarray, offsets: np.ndarray, n_plan: int, gpu_ids: np.ndarray,
                 num_nodes: int) -> BeladyTraceArrays:
    """The window trace of the node-indexed planner, built ahead of `belady_simulate`.

    Args:
        nodes, offsets: the window (planned batches, then lookahead), as for `belady_plan`.
        n_plan: the planned batches.
        gpu_ids: sorted unique node ids of the GPU tier.
        num_nodes: N (ids must be below it).

    Raises:
        ValueError: malformed arrays or ids.
    """
    out: BeladyTraceArrays = _native.belady_trace(nodes, offsets, int(n_plan), gpu_ids, int(num_nodes))
    return out


def belady_simulate(nodes: np.ndarray, offsets: np.ndarray, n_window: int, capacity: int, init_cache: np.ndarray,
                    gpu_ids: np.ndarray, frequency: np.ndarray, next_use: np.ndarray, first_use: np.ndarray,
                    gpu_slot: np.ndarray) -> BeladyPlanArrays:
    """`belady_plan`'s result for the planned batches of a window traced by `belady_trace`.

    Args:
        nodes, offsets: the planned batches only.
        n_window: batches of the whole traced window.
        capacity, init_cache, gpu_ids: as for `belady_plan`.
        frequency: per-node access counts [N] (required).
        next_use, first_use, gpu_slot: the trace's arrays (`next_use`, `first_use`: uint8, uint16 or int32, as traced).

    Raises:
        ValueError: malformed arrays or ids, or a trace that does not fit the inputs.
    """
    out: BeladyPlanArrays = _native.belady_simulate(nodes, offsets, int(n_window), int(capacity), init_cache,
                                                    gpu_ids, frequency, next_use, first_use, gpu_slot)
    return out


def belady_release_workspace() -> int:
    """Free the scratch the last Belady simulation left for the next one in this process (per-node arrays
    and the residents' buckets: 255 MB on the prepare benchmark's 8.4M nodes); its bytes (0 where none was
    left). A simulation under way keeps its own."""
    return int(_native.belady_release_workspace())


def belady_initial_fill(nodes: np.ndarray, offsets: np.ndarray, capacity: int, gpu_ids: np.ndarray,
                        frequency: np.ndarray | None) -> np.ndarray:
    """The (at most) `capacity` non-GPU nodes of the trace with the soonest first use (then the higher
    frequency, then the lower id), best first, as int64.

    Raises:
        ValueError: malformed arrays or ids.
    """
    chosen: np.ndarray = _native.belady_initial_fill(nodes, offsets, int(capacity), gpu_ids, frequency)
    return chosen


def copy_rows(out: np.ndarray, out_pos: np.ndarray, src: np.ndarray, src_rows: np.ndarray) -> None:
    """``out[out_pos[i]] = src[src_rows[i]]`` for every i, in one pass (one memcpy per row).

    numpy's ``out[pos] = src[idx]`` makes a gathered temporary and then scatters it, doubling the
    memory traffic; this reads each source row once and writes it in place.

    Args:
        out: 2-D C-contiguous, writable.
        out_pos: int64 [n] row positions in `out`.
        src: 2-D C-contiguous, of `out`'s dtype and width.
        src_rows: int64 [n] row positions in `src`.

    Raises:
        ValueError: arrays of the wrong shape, layout or dtype, or of different lengths.
        IndexError: a position out of range (checked before anything is copied).
    """
    _native.copy_rows(out, out_pos, src, src_rows)


def gather_rows(out: np.ndarray, src: np.ndarray, src_rows: np.ndarray) -> None:
    """``out[:n] = src[src_rows]`` (n = ``len(src_rows)``) in one pass, without numpy's temporary.

    Args:
        out: 2-D C-contiguous, writable, with at least n rows (e.g. a view into a write buffer).
        src: 2-D C-contiguous, of `out`'s dtype and width.
        src_rows: int64 [n] row positions in `src`.

    Raises:
        ValueError: arrays of the wrong shape, layout or dtype.
        IndexError: a row out of range, or `out` shorter than n rows (checked before copying).
    """
    _native.gather_rows(out, src, src_rows)


def gather_rows_crc(out: np.ndarray, src: np.ndarray, src_rows: np.ndarray, crc: int = 0) -> int:
    """`gather_rows`, returning the running crc32 of the rows written (zlib's ``crc32(out[:n], crc)``).

    Each row is checksummed from the source while it is in cache, and written past the cache where rows
    and `out` are 16-byte aligned (what a packed segment needs: it goes to disk, it is not read again):
    about two thirds of the time of the gather followed by a checksum of the gathered bytes.

    Raises:
        ValueError, IndexError: as `gather_rows`.
    """
    return int(_native.gather_rows_crc(out, src, src_rows, int(crc)))


def crc32(data: Any, value: int = 0) -> int:
    """zlib's ``crc32(data, value)`` of a contiguous buffer (any buffer-protocol object), computed natively
    with the GIL released: `gather_rows_crc`'s checksum, and `operators.formats.checksum`'s.

    Raises:
        ValueError: a buffer that is not contiguous.
    """
    return int(_native.crc32(data, int(value) & 0xFFFFFFFF))


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """zlib's ``crc32_combine``: the crc32 of A followed by B from ``crc32(A)``, ``crc32(B)`` and ``len(B)``
    (a file's block checksum from the pieces different writers wrote)."""
    return int(_native.crc32_combine(int(crc1) & 0xFFFFFFFF, int(crc2) & 0xFFFFFFFF, int(len2)))


def crc32_zeros(value: int, n: int) -> int:
    """``crc32(bytes(n), value)`` without the buffer: the running crc32 after `value` of `n` zero bytes."""
    return int(_native.crc32_zeros(int(value) & 0xFFFFFFFF, int(n)))


def crc32_blocks(data: Any, block: int) -> np.ndarray:
    """uint32 [ceil(len / block)]: zlib's crc32 of every `block` bytes of a contiguous buffer (the last block
    may be short), in one call with the GIL released.

    Raises:
        ValueError: a buffer that is not contiguous, or ``block <= 0``.
    """
    return np.asarray(_native.crc32_blocks(data, int(block)), dtype=np.uint32)


def crc32_folds() -> bool:
    """Whether `crc32` folds with carry-less multiplication on this CPU (else a table computes it)."""
    return bool(_native.crc32_folds())


def count_ids(nodes: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids ascending, counts), both int64, of the node ids in `nodes` (int64, all in [0, num_nodes)).

    Raises:
        ValueError: an id out of range.
    """
    ids, counts = _native.count_ids(nodes, int(num_nodes))
    return ids, counts


def count_dense(arrays: list[np.ndarray], out: np.ndarray) -> None:
    """``out[v] +=`` the occurrences of v in every array of `arrays` (1-D int32 or int64 node ids, all in
    [0, len(out))), in one native pass per array with the GIL released: no concatenation, no widening.

    Args:
        arrays: the node ids, e.g. a superbatch's ``n_id`` arrays as the samples file holds them.
        out: uint8, uint16 or int32 [num_nodes], C-contiguous and writable (e.g. ``np.zeros(N, np.uint8)``:
            fewer than 256 arrays of unique ids count at most 255 per node).

    Raises:
        ValueError: an id out of range, an array of another dtype or layout, or one sharing memory with
            `out` (naming ``arrays[i]``; every array is checked before any is counted, so `out` is untouched).
        OverflowError: a count would pass `out`'s largest value (`out` is then partly counted: discard it).
    """
    _native.count_dense(list(arrays), out)


def merge_counts(ids_a: np.ndarray, counts_a: np.ndarray, ids_b: np.ndarray,
                 counts_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sum of two sparse counts (int64 ids strictly ascending, int64 counts), ids ascending.

    Raises:
        ValueError: ids that are negative or not strictly ascending, or ids and counts of different lengths.
    """
    ids, counts = _native.merge_counts(ids_a, counts_a, ids_b, counts_b)
    return ids, counts


def route_batch(n_id: np.ndarray, src: np.ndarray, idx: np.ndarray, in_cache: np.ndarray | None,
                row: np.ndarray | None, shard_rows: int, num_shards: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One batch's plan in the packed index's form, in one native pass (GIL released).

    Args:
        n_id: the batch's node ids (int32 or int64).
        src, idx: its plan, uint8 and int64, one per node: 0 GPU / 1 CPU / 2 miss, the misses numbered
            0..m-1 in order.
        in_cache, row: uint8 and int64, one per miss: held by the disk cache (then `row` is its row there)
            or packed (then `row` ranks it among the k packed misses, a permutation of 0..k-1); both None:
            every miss packed, in miss order.
        shard_rows, num_shards: the store's shards (node v in shard ``v // shard_rows``).

    Returns:
        (src uint8, idx int64) with misses as packed rows (2, shard-major and miss order within a shard)
        or disk-cache rows (3); int64 packed rows per shard [num_shards]; int64 packed ids in packed order.

    Raises:
        ValueError: misnumbered misses, a layout of another length or not ranking 0..k-1, a packed id
            outside the shards, or arrays of the wrong dtype, layout or length.
    """
    out_src, out_idx, counts, ids = _native.route_batch(n_id, src, idx, in_cache, row, int(shard_rows),
                                                        int(num_shards))
    return out_src, out_idx, counts, ids


__all__ = ["BeladyPlanArrays", "BeladyTraceArrays", "NeighborSampler", "belady_initial_fill", "belady_plan",
           "belady_simulate", "belady_trace", "copy_rows", "count_dense", "count_ids", "crc32", "crc32_blocks",
           "crc32_combine", "crc32_folds", "crc32_zeros", "gather_rows", "merge_counts", "route_batch", "sample_ranges"]
