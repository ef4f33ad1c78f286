"""CPU-cache plans: where every feature read of a round comes from (docs/design.md,
"Belady per superbatch").

A round is a sequence of minibatches; batch i reads the rows of `n_id_i` (unique within the
batch). A static GPU tier serves its nodes; the CPU tier is a cache of C slots whose content is
fixed during a batch: an access to a resident row is a hit, any other access misses and is read
from disk (the batch's packed chunk). After batch i a plan may insert some of batch i's missed
rows into slots. Two planners fill that model:

* `plan_belady` (Ginex): after each batch keep the C rows with the soonest next use, planned
  per superbatch with the next superbatch as lookahead and each plan chained to the previous
  plan's final cache. Rows whose next use lies beyond the lookahead rank below every known next
  use, hotter first (by the caller's round frequencies), so they only fill spare room. With the
  whole round as one superbatch and `initial_fill` as the starting cache, the plan is exactly
  Belady-optimal: no plan of this model misses less.
* `plan_static` (DiskGNN's CPU tier): the `static_tier` rows sit in fixed slots all round.

Plans are ids and small arrays; features move only in packing and assembly. `replay` checks a
plan from the plan alone, as the trainer would execute it.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError
from ...native import kernels
from ..formats.plan import SRC_CPU, SRC_GPU, SRC_MISS, BatchPlan, SuperbatchPlan
from ..formats.threadbuffers import thread_buffer

__all__ = ["WindowTrace", "gpu_slots", "initial_fill", "plan_belady", "plan_static", "plan_superbatch",
           "release_planner_scratch", "replay", "static_tier", "trace_window"]


def gpu_slots(gpu_ids_sorted: np.ndarray, n_ids: np.ndarray) -> np.ndarray:
    """The GPU-tier slot of each id (its position in the sorted `gpu_ids_sorted`), or -1."""
    gpu = np.asarray(gpu_ids_sorted, dtype=np.int64)
    ids = np.asarray(n_ids, dtype=np.int64)
    if gpu.shape[0] == 0:
        return np.full(ids.shape, -1, dtype=np.int64)
    pos = np.searchsorted(gpu, ids)
    clipped = np.minimum(pos, gpu.shape[0] - 1)
    return np.where(gpu[clipped] == ids, clipped, -1).astype(np.int64, copy=False)


@dataclass
class WindowTrace:
    """A window's next uses, built apart from the chained simulation (`trace_window`).

    Planning a superbatch has two halves: tracing its window (the superbatch and its lookahead:
    when each access's node is next used, when each node is first used) needs only sample ids,
    while simulating the cache needs the previous plan's final cache. Tracing superbatch k + 1
    while k is simulated takes the costlier half off the serial chain.

    Attributes:
        next_use: [planned accesses]: the window batch next using each access's node.
        first_use: [N]: the first window batch using each node.
            Both in the narrowest of uint8, uint16 and int32 that holds the window's batch indices and
            "none" (the type's largest value): a byte an entry below 255 window batches.
        gpu_slot: int32 [planned accesses]: GPU-tier slot or -1 (empty: no GPU tier).
        batch_sizes: int64 [planned batches]: accesses per planned batch (checked on use).
        window_batches: batches in the window, lookahead included.
    """

    next_use: np.ndarray
    first_use: np.ndarray
    gpu_slot: np.ndarray
    batch_sizes: np.ndarray
    window_batches: int


def trace_window(batches: Sequence[np.ndarray], lookahead: Sequence[np.ndarray], gpu_ids: np.ndarray,
                 num_nodes: int) -> WindowTrace:
    """Trace a superbatch's window for `plan_belady(..., trace=...)` (native, GIL released).

    Memory is O(N) (a byte per node below 255 window batches), like the frequency array the planner reads anyway.

    Raises:
        ValueError: malformed ids (negative, >= `num_nodes`, repeated in a batch) or `gpu_ids`.
    """
    nodes, offsets = _concat([*batches, *lookahead], "batches", scratch=True)
    out = kernels.belady_trace(nodes, offsets, len(batches), _ids(gpu_ids, "gpu_ids"), int(num_nodes))
    return WindowTrace(out["next_use"], out["first_use"], out["gpu_slot"],
                       np.diff(offsets[:len(batches) + 1]), len(batches) + len(lookahead))


def plan_belady(batches: Sequence[np.ndarray], lookahead: Sequence[np.ndarray], capacity: int,
                init_cache: np.ndarray | None, gpu_ids: np.ndarray,
                frequency: np.ndarray | None, trace: WindowTrace | None = None) -> SuperbatchPlan:
    """Belady plan of one superbatch of the CPU cache (native, one core, GIL released).

    After each batch the cache keeps, among its residents and the batch's misses, the (at most)
    `capacity` rows whose next use is soonest; next uses are looked up in `batches` and
    `lookahead` only. Rows with no use there rank below every known next use, by `frequency`
    (higher first): with `frequency` given, such a missed row is still inserted when a slot is
    free or holds a colder far row; with `frequency=None` it is never inserted. A resident is only
    ever evicted for a strictly better row, so no slot empties while a missed row could use it.
    Ties are broken by the lower node id.

    Args:
        batches: the superbatch's `n_id` arrays (integer ids, unique within a batch).
        lookahead: the next superbatch's `n_id` arrays (empty at the end of a round).
        capacity: CPU-cache slots C (0 gives an all-miss plan).
        init_cache: int64 [C], node per slot (-1 = empty): the previous plan's `final_cache`,
            `initial_fill(...)` for a prefilled first plan, or None for an empty cache.
        gpu_ids: sorted unique node ids of the GPU tier (never cached on the CPU).
        frequency: per-node round access counts [N] as the tie-break for far rows, or None.
        trace: `trace_window(batches, lookahead, gpu_ids, N)`, built beforehand (then `lookahead`
            is not read); needs `frequency`. Without it, a `frequency` plan traces here.

    Returns:
        The superbatch's plan; `final_cache` seeds the next one. The plan is the same whichever
        way it is computed (with or without `frequency`'s node-indexed path, with or without a
        prebuilt trace).

    Raises:
        ConfigError: `capacity` is negative.
        ValueError: malformed ids, offsets, `init_cache`, `gpu_ids`, `frequency` or `trace`.
    """
    cap = _capacity(capacity)
    init = np.full(cap, -1, dtype=np.int64) if init_cache is None else _ids(init_cache, "init_cache")
    gpu = _ids(gpu_ids, "gpu_ids")
    freq = _frequency(frequency)
    if freq is None:
        if trace is not None:
            raise ValueError("trace: a prebuilt trace needs the frequency array")
        nodes, offsets = _concat([*batches, *lookahead], "batches", scratch=True)
        out = kernels.belady_plan(nodes, offsets, len(batches), cap, init, gpu, None)
    else:
        if trace is None:
            trace = trace_window(batches, lookahead, gpu, freq.shape[0])
        nodes, offsets = _concat(batches, "batches", scratch=True)
        if not np.array_equal(np.diff(offsets), trace.batch_sizes):
            raise ValueError("trace: traced for other batches (batch sizes differ)")
        out = kernels.belady_simulate(nodes, offsets, trace.window_batches, cap, init, gpu, freq,
                                      trace.next_use, trace.first_use, trace.gpu_slot)
    cuts = offsets[1:len(batches)]
    icuts = out["insert_offsets"][1:-1]
    plans = [BatchPlan(s, i, p, q) for s, i, p, q in zip(
        np.split(out["src"], cuts), np.split(out["idx"], cuts),
        np.split(out["insert_pos"], icuts), np.split(out["insert_slot"], icuts))]
    return SuperbatchPlan(plans[:len(batches)], out["final_cache"], int(out["hits"]), int(out["misses"]),
                          int(out["gpu_hits"]))


def initial_fill(batches: Sequence[np.ndarray], capacity: int, frequency: np.ndarray | None,
                 gpu_ids: np.ndarray) -> np.ndarray:
    """The CPU cache to load before a round: the rows used soonest, as an `init_cache`.

    Picks the (at most) `capacity` non-GPU nodes of `batches` with the soonest first use (ties:
    higher frequency, then lower id); with `frequency` given, room left over goes to the hottest
    remaining nodes (`static_tier`). Starting `plan_belady` from it is Belady-optimal for the
    cache's initial content (it is Belady's choice after a virtual batch reading every row).

    Args:
        batches: the round's first batches (a superbatch and its lookahead, or the whole round).
        capacity: CPU-cache slots C.
        frequency: per-node round access counts [N], or None.
        gpu_ids: sorted unique node ids of the GPU tier.

    Returns:
        int64 [C]: node per slot, soonest first, padded with -1.
    """
    cap = _capacity(capacity)
    nodes, offsets = _concat(batches, "batches", scratch=True)     # the kernel keeps nothing of it
    gpu = _ids(gpu_ids, "gpu_ids")
    freq = _frequency(frequency)
    chosen = kernels.belady_initial_fill(nodes, offsets, cap, gpu, freq)
    if freq is not None and chosen.shape[0] < cap:
        extra = static_tier(freq, cap - chosen.shape[0], np.concatenate([gpu, chosen]))
        chosen = np.concatenate([chosen, extra])
    fill = np.full(cap, -1, dtype=np.int64)
    fill[:chosen.shape[0]] = chosen
    return fill


def static_tier(frequency: np.ndarray, capacity: int, exclude: np.ndarray) -> np.ndarray:
    """The (at most) `capacity` most frequent nodes outside `exclude`, hottest first.

    Ties go to the lower node id; never-accessed nodes (frequency <= 0) are not chosen. O(N):
    a partition finds the threshold, only the chosen nodes are sorted.

    Args:
        frequency: per-node access counts [N].
        capacity: how many nodes to choose.
        exclude: node ids that may not be chosen (e.g. the GPU tier).

    Returns:
        int64 [<= capacity]: node ids in slot order.
    """
    cap = _capacity(capacity)
    if cap == 0:                # e.g. no GPU tier: not even a copy of the counts
        return np.zeros(0, dtype=np.int64)
    freq = np.array(_frequency(frequency), dtype=np.int64, copy=True)
    ex = np.asarray(exclude, dtype=np.int64)
    freq[ex[(ex >= 0) & (ex < freq.shape[0])]] = 0
    k = min(cap, int(np.count_nonzero(freq > 0)))
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    threshold = np.partition(freq, freq.shape[0] - k)[freq.shape[0] - k]
    above = np.flatnonzero(freq > threshold)
    chosen = np.concatenate([above, np.flatnonzero(freq == threshold)[:k - above.shape[0]]])
    return chosen[np.lexsort((chosen, -freq[chosen]))].astype(np.int64, copy=False)


def plan_static(batches: Sequence[np.ndarray], cpu_ids: np.ndarray, gpu_ids: np.ndarray) -> SuperbatchPlan:
    """The static-tier plan: `cpu_ids` (slot -> node, -1 = empty) stay put, nothing is inserted.

    An access is a GPU hit when its node is in `gpu_ids`, else a CPU hit when it is in `cpu_ids`,
    else a miss. Vectorised over the whole superbatch.
    """
    nodes, offsets = _concat(batches, "batches")
    cpu = _ids(cpu_ids, "cpu_ids")
    held = np.flatnonzero(cpu >= 0)
    if np.unique(cpu[held]).shape[0] != held.shape[0]:
        raise ValueError("cpu_ids: a node is held by two slots")
    gslot = gpu_slots(_ids(gpu_ids, "gpu_ids"), nodes)
    order = held[np.argsort(cpu[held], kind="stable")]
    cslot = gpu_slots(cpu[order], nodes)  # position among the sorted held nodes, or -1
    cslot = np.where(cslot >= 0, order[np.maximum(cslot, 0)], -1)
    src = np.where(gslot >= 0, SRC_GPU, np.where(cslot >= 0, SRC_CPU, SRC_MISS)).astype(np.uint8)
    is_miss = src == SRC_MISS
    ranks = np.cumsum(is_miss) - 1
    before = np.concatenate([[0], np.cumsum(is_miss)])[offsets[:-1]]  # misses before each batch
    miss_idx = ranks - np.repeat(before, np.diff(offsets))
    idx = np.where(gslot >= 0, gslot, np.where(cslot >= 0, cslot, miss_idx)).astype(np.int64)
    empty = np.zeros(0, dtype=np.int64)
    cuts = offsets[1:-1]
    plans = [BatchPlan(s, i, empty, empty) for s, i in zip(np.split(src, cuts), np.split(idx, cuts))]
    counts = np.bincount(src, minlength=3)
    return SuperbatchPlan(plans[:len(batches)], cpu.copy(), int(counts[SRC_CPU]), int(counts[SRC_MISS]),
                          int(counts[SRC_GPU]))


def replay(plan: SuperbatchPlan, batches: Sequence[np.ndarray], init_cache: np.ndarray | None,
           gpu_ids: np.ndarray) -> np.ndarray:
    """Check a plan by executing it on node ids alone (vectorised per batch).

    Simulates the CPU cache from `init_cache` and the plan's inserts and checks: GPU-tier nodes,
    and only they, come from their GPU slot; every CPU hit reads a slot that holds that node at
    that time; misses are numbered 0..m-1 in order and are not resident; inserts are of missed
    rows, to distinct slots in range; the counts and `final_cache` agree with the simulation.

    Returns:
        The simulated final cache (int64 [C]).

    Raises:
        AssertionError: naming the batch and the first fault found.
    """
    gpu = _ids(gpu_ids, "gpu_ids")
    cap = plan.final_cache.shape[0]
    cache = np.full(cap, -1, dtype=np.int64) if init_cache is None else _ids(init_cache, "init_cache").copy()
    _expect(cache.shape[0] == cap, f"init_cache has {cache.shape[0]} slots, the plan {cap}")
    _expect(len(plan.batches) == len(batches), f"plan has {len(plan.batches)} batches, trace {len(batches)}")
    counts = np.zeros(3, dtype=np.int64)
    for b, (bp, n_id) in enumerate(zip(plan.batches, batches)):
        n = np.asarray(n_id, dtype=np.int64)
        src, idx = bp.src, bp.idx
        _expect(src.shape == n.shape and idx.shape == n.shape, f"batch {b}: src/idx shape != n_id shape")
        _expect(bool(np.all(src <= SRC_MISS)), f"batch {b}: src value out of range")
        g = gpu_slots(gpu, n)
        _expect(bool(np.array_equal(g >= 0, src == SRC_GPU)), f"batch {b}: GPU tier membership disagrees")
        _expect(bool(np.array_equal(idx[g >= 0], g[g >= 0])), f"batch {b}: wrong GPU slot")
        cpu = src == SRC_CPU
        _expect(bool(np.all((idx[cpu] >= 0) & (idx[cpu] < cap))), f"batch {b}: CPU slot out of range")
        _expect(bool(np.array_equal(cache[idx[cpu]], n[cpu])), f"batch {b}: a CPU hit reads a slot not holding it")
        miss = src == SRC_MISS
        _expect(bool(np.array_equal(idx[miss], np.arange(int(miss.sum())))), f"batch {b}: misses misnumbered")
        _expect(not bool(np.isin(n[miss], cache[cache >= 0]).any()), f"batch {b}: a resident row was missed")
        pos, slot = bp.insert_pos, bp.insert_slot
        _expect(pos.shape == slot.shape, f"batch {b}: insert_pos/insert_slot lengths differ")
        _expect(bool(np.all((pos >= 0) & (pos < n.shape[0]))), f"batch {b}: insert position out of range")
        _expect(bool(np.all(src[pos] == SRC_MISS)), f"batch {b}: inserts a row that was not missed")
        _expect(bool(np.all((slot >= 0) & (slot < cap))), f"batch {b}: insert slot out of range")
        _expect(np.unique(pos).shape == pos.shape and np.unique(slot).shape == slot.shape,
                f"batch {b}: repeated insert position or slot")
        cache[slot] = n[pos]
        counts += np.bincount(src, minlength=3)
    _expect((int(counts[SRC_GPU]), int(counts[SRC_CPU]), int(counts[SRC_MISS])) ==
            (plan.gpu_hits, plan.hits, plan.misses), "hit/miss counts disagree with the plan")
    _expect(bool(np.array_equal(cache, plan.final_cache)), "final_cache disagrees with the replayed cache")
    return cache


def release_planner_scratch() -> int:
    """Free what the Belady planner keeps in this process for its next superbatch (the native simulation's
    scratch: a slot and a flag per node, the cache and its buckets); its bytes. `flow.prepare` calls it when
    a prepare ends, with the thread buffers and the sampler pools."""
    return kernels.belady_release_workspace()


def _expect(ok: bool, fault: str) -> None:
    if not ok:
        raise AssertionError(f"invalid plan: {fault}")


def _capacity(capacity: int) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 0:
        raise ConfigError("capacity", f"expected a number of cache slots >= 0, got {capacity!r}")
    return int(capacity)


def _ids(values: np.ndarray, name: str, what: str = "node ids") -> np.ndarray:
    """A 1-D C-contiguous int64 array of integers (other integer dtypes are converted)."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array of {what}, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected integer {what}, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _frequency(frequency: np.ndarray | None) -> np.ndarray | None:
    """Access counts as the kernels read them: int32 kept as it is (a round's counts, `count.dense_counts`),
    any other integer type as int64."""
    if frequency is None:
        return None
    arr = np.asarray(frequency)
    if arr.dtype == np.int32 and arr.ndim == 1:
        return np.ascontiguousarray(arr)
    return _ids(arr, "frequency", "access counts")


def _concat(batches: Sequence[np.ndarray], name: str, scratch: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """One int64 array of all ids and the batch offsets (what the native planner reads).

    `scratch`: build the array in this thread's reused buffer (valid until its next `_concat(..., scratch=True)`)
    for a caller that hands it to a kernel and keeps nothing of it: a window is tens of MB, and a fresh array
    costs the kernel zeroing every page of it first, several times the concatenation itself.
    """
    if not scratch:
        arrays = [_ids(b, f"{name}[{i}]") for i, b in enumerate(batches)]
    else:
        arrays = [np.asarray(b) for b in batches]
        for i, a in enumerate(arrays):
            if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
                _ids(a, f"{name}[{i}]")      # raises the error it names
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([a.shape[0] for a in arrays], out=offsets[1:])
    if not arrays:
        return np.zeros(0, dtype=np.int64), offsets
    if not scratch:
        return np.concatenate(arrays), offsets
    total = int(offsets[-1])
    buf = thread_buffer("plan-nodes", total * 8).view(np.int64)[:total]
    return np.concatenate(arrays, out=buf, casting="unsafe"), offsets     # integers, as `_ids` converts


def plan_superbatch(batches: Sequence[np.ndarray], lookahead: Sequence[np.ndarray], gpu_ids: np.ndarray,
                    cpu_ids: np.ndarray, frequency: np.ndarray, prev_cache: np.ndarray | None, belady: bool,
                    trace: WindowTrace | None = None) -> SuperbatchPlan:
    """One superbatch's plan under the round's tiers: the one place prepare and the stream plan.

    A static CPU tier (`belady` False) keeps `cpu_ids` in its slots all round. A Belady tier
    starts from the previous superbatch's final cache (`prev_cache`; `cpu_ids` for the first)
    and looks ahead into `lookahead`, or uses `trace`, that window traced beforehand.
    """
    if not belady:
        return plan_static(batches, cpu_ids, gpu_ids)
    init = cpu_ids if prev_cache is None else prev_cache
    if trace is not None:
        return plan_belady(batches, [], cpu_ids.shape[0], init, gpu_ids, frequency, trace=trace)
    return plan_belady(batches, lookahead, cpu_ids.shape[0], init, gpu_ids, frequency)
