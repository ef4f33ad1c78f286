"""CPU-cache plans: Belady against an exhaustive optimum, against the static tier, exact sequences."""
from __future__ import annotations

import functools
import itertools
from dataclasses import replace

import numpy as np
import pytest
from diskflow.native import kernels
from diskflow.operators.formats.plan import SRC_CPU, SRC_GPU, SRC_MISS, SuperbatchPlan
from diskflow.operators.prepare.plan import (
    gpu_slots,
    initial_fill,
    plan_belady,
    plan_static,
    release_planner_scratch,
    replay,
    static_tier,
    trace_window,
)

from diskflow.errors import ConfigError

NO_GPU = np.zeros(0, dtype=np.int64)


def ids(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def random_trace(rng: np.random.Generator, batches: int, nodes: int, max_batch: int,
                 skew: float) -> list[np.ndarray]:
    """Batches of unique ids drawn with Zipf-like weights (node 0 hottest), in random order."""
    p = 1.0 / np.arange(1, nodes + 1) ** skew
    return [rng.choice(nodes, size=int(rng.integers(1, max_batch + 1)), replace=False, p=p / p.sum())
            for _ in range(batches)]


def frequency_of(trace: list[np.ndarray], nodes: int) -> np.ndarray:
    return np.bincount(np.concatenate(trace), minlength=nodes).astype(np.int64)


def min_misses(trace: list[np.ndarray], capacity: int, start: frozenset[int] | None) -> int:
    """Fewest possible misses by exhaustive search over cache states (batch-granular, bypass).

    After each batch the cache may become any subset of (cache | batch) of at most `capacity`
    rows. With `start=None` the initial cache is free to choose (prefill).
    """
    sets = [frozenset(int(v) for v in b) for b in trace]
    future = [frozenset().union(*sets[i:]) for i in range(len(sets) + 1)]

    @functools.cache
    def best(i: int, cache: frozenset[int]) -> int:
        if i == len(sets):
            return 0
        misses = len(sets[i] - cache)
        pool = sorted((cache | sets[i]) & future[i + 1])  # rows never used again are worthless
        keep = min(capacity, len(pool))  # holding more never hurts: only maximal subsets matter
        return misses + min(best(i + 1, frozenset(c)) for c in itertools.combinations(pool, keep))

    if start is not None:
        return best(0, start)
    pool = sorted(future[0])
    return min(best(0, frozenset(c)) for c in itertools.combinations(pool, min(capacity, len(pool))))


def plan_chained(trace: list[np.ndarray], size: int, capacity: int, frequency: np.ndarray | None,
                 gpu: np.ndarray, init: np.ndarray | None, full_lookahead: bool = False) -> list[SuperbatchPlan]:
    """Plan `trace` in superbatches of `size` from `init`, each chained to the last and replayed."""
    supers = [trace[i:i + size] for i in range(0, len(trace), size)]
    state = init
    plans = []
    for k, batches in enumerate(supers):
        lookahead = trace[(k + 1) * size:] if full_lookahead else trace[(k + 1) * size:(k + 2) * size]
        plan = plan_belady(batches, lookahead, capacity, state, gpu, frequency)
        replay(plan, batches, state, gpu)
        state = plan.final_cache
        plans.append(plan)
    return plans


# ------------------------------------------------------------------------------------------------
# Optimality


@pytest.mark.parametrize("seed", range(10))
def test_belady_full_lookahead_equals_exhaustive_optimum(seed: int) -> None:
    rng = np.random.default_rng(seed)
    nodes, capacity = int(rng.integers(8, 13)), int(rng.integers(2, 5))
    trace = random_trace(rng, int(rng.integers(6, 9)), nodes, 5, skew=float(rng.uniform(0.0, 1.2)))
    freq = frequency_of(trace, nodes)
    for frequency in (freq, None):
        fill = initial_fill(trace, capacity, frequency, NO_GPU)
        prefilled = plan_belady(trace, [], capacity, fill, NO_GPU, frequency)
        replay(prefilled, trace, fill, NO_GPU)
        assert prefilled.misses == min_misses(trace, capacity, None)
        cold = plan_belady(trace, [], capacity, None, NO_GPU, frequency)
        replay(cold, trace, None, NO_GPU)
        assert cold.misses == min_misses(trace, capacity, frozenset())


def reference_belady_misses(trace: list[np.ndarray], capacity: int) -> int:
    """Textbook Belady from an empty cache, with sets (slow, obviously right)."""
    sets = [{int(v) for v in batch} for batch in trace]
    never = len(sets)
    cache: set[int] = set()
    misses = 0
    for i, rows in enumerate(sets):
        misses += len(rows - cache)
        ranked = sorted((next((j for j in range(i + 1, never) if v in sets[j]), never), v) for v in cache | rows)
        cache = {v for j, v in ranked[:capacity] if j < never}
    return misses


@pytest.mark.parametrize("capacity", [1, 17, 60])
def test_belady_matches_textbook_simulation_on_larger_traces(capacity: int) -> None:
    rng = np.random.default_rng(capacity)
    trace = random_trace(rng, 40, 300, 45, skew=0.8)
    plan = plan_belady(trace, [], capacity, None, NO_GPU, frequency_of(trace, 300))
    replay(plan, trace, None, NO_GPU)
    assert plan.misses == reference_belady_misses(trace, capacity)


def test_bruteforce_reference_is_not_trivial() -> None:
    """The exhaustive search itself: a hand-checked case where a smarter choice saves a miss."""
    trace = [ids(0, 1), ids(2), ids(0), ids(1)]
    assert min_misses(trace, 1, frozenset()) == 4  # 0,1 cold, 2 cold, then keep 0 -> 1 misses
    assert min_misses(trace, 1, None) == 3         # prefill 0 (or 1): one cold miss fewer
    assert min_misses(trace, 2, frozenset()) == 3


@pytest.mark.parametrize("seed", range(8))
def test_belady_never_misses_more_than_static(seed: int) -> None:
    """Full lookahead: a theorem (Belady is optimal). Chained superbatches: not a theorem (a short
    lookahead may evict a hot far row for a near one and lose it later), but on skewed traces the
    frequency tie-break keeps chained plans at or below the static tier; asserted exactly here.
    """
    rng = np.random.default_rng(100 + seed)
    nodes = 400
    trace = random_trace(rng, 36, nodes, 60, skew=1.0)
    freq = frequency_of(trace, nodes)
    gpu = np.sort(static_tier(freq, 5, NO_GPU))
    for capacity in (1, 10, 40):
        static = plan_static(trace, static_tier(freq, capacity, gpu), gpu)
        replay(static, trace, static.final_cache, gpu)
        full = plan_chained(trace, len(trace), capacity, freq, gpu, initial_fill(trace, capacity, freq, gpu))
        assert full[0].misses <= static.misses
        for size in (1, 4, 9):
            prefill = initial_fill(trace[:2 * size], capacity, freq, gpu)  # what is known at the start
            chained = plan_chained(trace, size, capacity, freq, gpu, prefill)
            assert sum(p.misses for p in chained) <= static.misses
            assert sum(p.misses for p in chained) >= full[0].misses  # nothing beats full lookahead


# ------------------------------------------------------------------------------------------------
# Exact admit/evict sequences

TRACE = [ids(5, 3, 8), ids(3, 9), ids(8, 5, 9), ids(3, 5)]


def test_exact_sequence_from_empty_cache() -> None:
    plan = plan_belady(TRACE, [], 2, None, NO_GPU, None)
    b = plan.batches
    # b0: all cold; keep 3 (next use b1) and 5 (b2); 8 (b2) ties 5 and loses on the id.
    assert b[0].src.tolist() == [SRC_MISS] * 3 and b[0].idx.tolist() == [0, 1, 2]
    assert (b[0].insert_pos.tolist(), b[0].insert_slot.tolist()) == ([1, 0], [0, 1])
    # b1: 3 hits slot 0 (next use b3), 9 misses (next use b2) and evicts 3.
    assert b[1].src.tolist() == [SRC_CPU, SRC_MISS] and b[1].idx.tolist() == [0, 0]
    assert (b[1].insert_pos.tolist(), b[1].insert_slot.tolist()) == ([1], [0])
    # b2: 8 misses and is never used again: bypassed. b3: 3 misses, 5 hits.
    assert b[2].src.tolist() == [SRC_MISS, SRC_CPU, SRC_CPU] and b[2].idx.tolist() == [0, 1, 0]
    assert b[3].src.tolist() == [SRC_MISS, SRC_CPU] and b[3].idx.tolist() == [0, 1]
    assert [p.insert_pos.tolist() for p in b[2:]] == [[], []]
    assert plan.final_cache.tolist() == [9, 5]
    assert (plan.hits, plan.misses, plan.gpu_hits, plan.inserts) == (4, 6, 0, 3)
    assert plan.misses == min_misses(TRACE, 2, frozenset())


def test_exact_sequence_with_prefill() -> None:
    fill = initial_fill(TRACE, 2, None, NO_GPU)
    assert fill.tolist() == [3, 5]  # first use b0 for 3, 5, 8: lower ids win the tie
    plan = plan_belady(TRACE, [], 2, fill, NO_GPU, None)
    assert [p.insert_pos.tolist() for p in plan.batches] == [[], [1], [], []]
    assert [p.insert_slot.tolist() for p in plan.batches] == [[], [0], [], []]
    assert plan.misses == 4 == min_misses(TRACE, 2, None)
    replay(plan, TRACE, fill, NO_GPU)


def test_far_rows_fill_spare_room_by_frequency_only() -> None:
    freq = ids(0, 5, 1, 9, 0)
    # No use in the window: with frequencies the hotter row takes the free slot ...
    plan = plan_belady([ids(1, 2, 3)], [], 2, None, NO_GPU, freq)
    assert plan.batches[0].insert_pos.tolist() == [2, 0] and plan.final_cache.tolist() == [3, 1]
    # ... without them nothing is inserted.
    assert plan_belady([ids(1, 2, 3)], [], 2, None, NO_GPU, None).inserts == 0
    # A known next use (2, in the lookahead) outranks the hottest far row.
    plan = plan_belady([ids(1, 2, 3)], [ids(2)], 1, None, NO_GPU, freq)
    assert plan.batches[0].insert_pos.tolist() == [1] and plan.final_cache.tolist() == [2]
    # A far resident is evicted by a row with a known next use, not by a colder far row.
    plan = plan_belady([ids(2, 4), ids(4)], [], 1, ids(3), NO_GPU, freq)
    assert plan.batches[0].insert_pos.tolist() == [1] and plan.batches[0].insert_slot.tolist() == [0]
    plan = plan_belady([ids(2)], [], 1, ids(3), NO_GPU, freq)
    assert plan.inserts == 0 and plan.final_cache.tolist() == [3]


# ------------------------------------------------------------------------------------------------
# Chaining


@pytest.mark.parametrize("size", [1, 3, 5])
def test_chaining_with_full_lookahead_equals_one_plan(size: int) -> None:
    rng = np.random.default_rng(size)
    trace = random_trace(rng, 17, 120, 25, skew=0.9)
    freq = frequency_of(trace, 120)
    gpu = ids(0, 7, 50)
    fill = initial_fill(trace, 15, freq, gpu)
    whole = plan_belady(trace, [], 15, fill, gpu, freq)
    chained = plan_chained(trace, size, 15, freq, gpu, fill, full_lookahead=True)
    flat = [b for p in chained for b in p.batches]
    for one, other in zip(whole.batches, flat, strict=True):
        for field in ("src", "idx", "insert_pos", "insert_slot"):
            np.testing.assert_array_equal(getattr(one, field), getattr(other, field))
    np.testing.assert_array_equal(chained[-1].final_cache, whole.final_cache)
    assert sum(p.misses for p in chained) == whole.misses


def test_chaining_with_short_lookahead_is_valid_and_carries_state() -> None:
    rng = np.random.default_rng(42)
    trace = random_trace(rng, 23, 90, 20, skew=1.1)
    freq = frequency_of(trace, 90)
    gpu = ids(1, 2)
    plans = plan_chained(trace, 4, 12, freq, gpu, None)  # replay checks each plan
    assert plans[0].final_cache.shape == (12,)
    assert sum(p.hits for p in plans) > 0
    windows = [trace[i:i + 4] for i in range(0, len(trace), 4)]
    gpu_hits = [sum(int(np.isin(b, gpu).sum()) for b in w) for w in windows]
    assert sum(gpu_hits) > 0 and [p.gpu_hits for p in plans] == gpu_hits     # every access of a GPU row, each window
    assert [p.hits + p.misses + p.gpu_hits for p in plans] == [sum(b.size for b in w) for w in windows]
    # A cold start fills the cache: no slot stays empty while missed rows have a future.
    assert (plans[0].final_cache >= 0).all()


# ------------------------------------------------------------------------------------------------
# GPU tier, capacity 0, static tier


def test_gpu_tier_never_touches_the_cpu_tier() -> None:
    rng = np.random.default_rng(3)
    trace = random_trace(rng, 12, 60, 20, skew=1.0)
    gpu = ids(0, 1, 4, 33)
    plan = plan_belady(trace, [], 8, None, gpu, frequency_of(trace, 60))
    replay(plan, trace, None, gpu)
    for n_id, bp in zip(trace, plan.batches):
        on_gpu = np.isin(n_id, gpu)
        assert (bp.src[on_gpu] == SRC_GPU).all() and (bp.src[~on_gpu] != SRC_GPU).all()
        np.testing.assert_array_equal(gpu[bp.idx[on_gpu]], n_id[on_gpu])
        assert not np.isin(n_id[bp.insert_pos], gpu).any()
    assert not np.isin(plan.final_cache, gpu).any()
    assert plan.gpu_hits == sum(int(np.isin(b, gpu).sum()) for b in trace)
    with pytest.raises(ValueError, match="init_cache: node 4 belongs to the GPU tier"):
        plan_belady(trace, [], 2, ids(5, 4), gpu, None)


def test_capacity_zero_misses_everything() -> None:
    trace = [ids(3, 1), ids(1, 2), ids(0, 3)]
    plan = plan_belady(trace, [ids(1)], 0, None, ids(2), None)
    assert (plan.hits, plan.misses, plan.gpu_hits, plan.inserts) == (0, 5, 1, 0)
    assert plan.final_cache.shape == (0,)
    assert plan.batches[1].src.tolist() == [SRC_MISS, SRC_GPU] and plan.batches[1].idx.tolist() == [0, 0]
    replay(plan, trace, None, ids(2))
    assert initial_fill(trace, 0, None, NO_GPU).shape == (0,)
    assert plan_belady([], [], 3, None, NO_GPU, None).batches == []


def test_static_tier_ties_exclusion_and_plan() -> None:
    freq = ids(4, 0, 7, 4, 4, 9, 1)
    assert static_tier(freq, 3, ids(5)).tolist() == [2, 0, 3]  # 5 excluded; ties by lower id
    assert static_tier(freq, 10, NO_GPU).tolist() == [5, 2, 0, 3, 4, 6]  # never-read node 1 left out
    assert static_tier(freq, 0, NO_GPU).shape == (0,)
    trace = [ids(2, 6, 5, 1), ids(0, 2)]
    plan = plan_static(trace, ids(2, -1, 0), ids(5))
    assert plan.batches[0].src.tolist() == [SRC_CPU, SRC_MISS, SRC_GPU, SRC_MISS]
    assert plan.batches[0].idx.tolist() == [0, 0, 0, 1]
    assert plan.batches[1].src.tolist() == [SRC_CPU, SRC_CPU] and plan.batches[1].idx.tolist() == [2, 0]
    assert (plan.hits, plan.misses, plan.gpu_hits, plan.inserts) == (3, 2, 1, 0)
    replay(plan, trace, ids(2, -1, 0), ids(5))


def test_initial_fill_orders_by_first_use_then_frequency() -> None:
    trace = [ids(6, 2), ids(4, 1), ids(3)]
    freq = ids(0, 1, 1, 9, 2, 8, 1)
    assert initial_fill(trace, 3, freq, ids(2)).tolist() == [6, 4, 1]  # 2 is on the GPU
    assert initial_fill(trace, 6, freq, ids(2)).tolist() == [6, 4, 1, 3, 5, -1]  # room: hottest unused (5)
    assert initial_fill(trace, 6, None, ids(2)).tolist() == [6, 1, 4, 3, -1, -1]


def test_initial_fill_orders_large_batches_like_a_lexsort() -> None:
    """Batches with thousands of new nodes (the radix-sorted path) give the order of the small ones:
    first use, then higher frequency, then lower id; frequency ties are common and zero counts too."""
    rng = np.random.default_rng(5)
    n = 60_000
    trace = [rng.choice(n, size=9_000, replace=False).astype(np.int64) for _ in range(4)]
    freq = rng.integers(0, 4, size=n).astype(np.int64)
    gpu = np.sort(rng.choice(n, size=500, replace=False)).astype(np.int64)
    expected, seen = [], set(gpu.tolist())
    for batch in trace:
        new = np.array([v for v in dict.fromkeys(batch.tolist()) if v not in seen], np.int64)
        seen.update(new.tolist())
        expected += new[np.lexsort((new, -freq[new]))].tolist()
    for capacity in (5_000, 12_345, len(expected)):
        assert initial_fill(trace, capacity, freq, gpu).tolist() == expected[:capacity]
    unweighted = initial_fill(trace, 12_345, None, gpu).tolist()
    assert unweighted[:9_000 - int(np.isin(trace[0], gpu).sum())] == sorted(set(trace[0].tolist()) - set(gpu.tolist()))


def test_gpu_slots() -> None:
    assert gpu_slots(ids(2, 5, 9), ids(9, 0, 5, 10, 2)).tolist() == [2, -1, 1, -1, 0]
    assert gpu_slots(NO_GPU, ids(1, 2)).tolist() == [-1, -1]


# ------------------------------------------------------------------------------------------------
# The checker fails on broken plans; bad input is refused clearly


def test_replay_catches_broken_plans() -> None:
    plan = plan_belady(TRACE, [], 2, None, NO_GPU, None)
    plan.batches[1].idx[0] = 1  # the hit on 3 now reads slot 1, which holds 5
    with pytest.raises(AssertionError, match="batch 1: a CPU hit reads a slot not holding it"):
        replay(plan, TRACE, None, NO_GPU)
    plan = plan_belady(TRACE, [], 2, None, NO_GPU, None)
    plan.batches[1].insert_pos[0] = 0  # inserts the row that hit
    with pytest.raises(AssertionError, match="batch 1: inserts a row that was not missed"):
        replay(plan, TRACE, None, NO_GPU)
    plan = plan_belady(TRACE, [], 2, None, NO_GPU, None)
    plan.batches[0].insert_slot[0] = 2
    with pytest.raises(AssertionError, match="batch 0: insert slot out of range"):
        replay(plan, TRACE, None, NO_GPU)
    plan = plan_belady(TRACE, [], 2, None, NO_GPU, None)
    with pytest.raises(AssertionError, match="GPU tier membership"):
        replay(plan, TRACE, None, ids(9))


def test_bad_input_is_refused() -> None:
    with pytest.raises(ConfigError, match="capacity: expected a number of cache slots >= 0, got -1"):
        plan_belady(TRACE, [], -1, None, NO_GPU, None)
    with pytest.raises(ValueError, match="node 3 occurs twice in batch 1"):
        plan_belady([ids(1), ids(3, 3)], [], 2, None, NO_GPU, None)
    with pytest.raises(ValueError, match="node 4 occurs twice in batch 2"):  # inside the lookahead
        plan_belady([ids(1)], [ids(2), ids(4, 4)], 2, None, NO_GPU, None)
    with pytest.raises(ValueError, match="negative node id -2"):
        plan_belady([ids(1, -2)], [], 2, None, NO_GPU, None)
    with pytest.raises(ValueError, match="gpu_ids: must be sorted and unique"):
        plan_belady(TRACE, [], 2, None, ids(4, 2), None)
    with pytest.raises(ValueError, match="init_cache: has 3 slots, capacity is 2"):
        plan_belady(TRACE, [], 2, ids(-1, -1, -1), NO_GPU, None)
    with pytest.raises(ValueError, match="init_cache: node 7 is held by two slots"):
        plan_belady(TRACE, [], 2, ids(7, 7), NO_GPU, None)
    with pytest.raises(ValueError, match=r"init_cache: slot 1 holds -5 \(expected a node id or -1\)"):
        plan_belady(TRACE, [], 2, ids(7, -5), NO_GPU, None)
    with pytest.raises(ValueError, match="frequency: has 6 entries but node id 8 occurs"):
        plan_belady(TRACE, [], 2, None, NO_GPU, np.ones(6, dtype=np.int64))
    with pytest.raises(ValueError, match=r"batches\[1\]: expected integer node ids, got dtype float64"):
        plan_belady([ids(1), np.array([2.0])], [], 2, None, NO_GPU, None)
    with pytest.raises(ValueError, match="frequency: expected integer access counts, got dtype float64"):
        initial_fill(TRACE, 2, np.ones(10), NO_GPU)
    with pytest.raises(ValueError, match="cpu_ids: a node is held by two slots"):
        plan_static(TRACE, ids(3, 3), NO_GPU)


def test_native_binding_checks_arrays_without_copying() -> None:
    nodes, offsets, empty = ids(1, 2), ids(0, 2), NO_GPU
    with pytest.raises(ValueError, match="nodes: expected dtype int64, got int32"):
        kernels.belady_plan(nodes.astype(np.int32), offsets, 1, 0, empty, empty, None)
    with pytest.raises(ValueError, match="nodes: expected a C-contiguous array"):
        kernels.belady_plan(ids(1, 0, 2, 0)[::2], offsets, 1, 0, empty, empty, None)
    with pytest.raises(ValueError, match="offsets: last offset 2 != number of accesses 3"):
        kernels.belady_plan(ids(1, 2, 3), offsets, 1, 0, empty, empty, None)
    with pytest.raises(ValueError, match="n_plan: 2 is not in"):
        kernels.belady_plan(nodes, offsets, 2, 0, empty, empty, None)
    with pytest.raises(ValueError, match="frequency: expected a numpy array"):
        kernels.belady_plan(nodes, offsets, 1, 0, empty, empty, [1, 2, 3])


def test_plan_benchmark_runs_small(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from diskflow.bench import plan as bench_plan

    parser = argparse.ArgumentParser()
    bench_plan.add_arguments(parser)
    figures = bench_plan.run(parser.parse_args(
        ["--batches", "9", "--batch-size", "70", "--nodes", "500", "--superbatch", "2", "--gpu", "0.01"]))
    assert figures["accesses"] == 9 * 70 and figures["capacity"] == 50 and figures["gpu_nodes"] == 5
    assert figures["belady_full_misses"] <= figures["belady_misses"] <= figures["static_misses"]
    assert figures["belady_accesses_per_s"] > 0
    assert "CPU-cache planners at the same capacity" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="--superbatch"):
        bench_plan.run(parser.parse_args(["--superbatch", "0"]))


def _same_plan(a: SuperbatchPlan, b: SuperbatchPlan) -> None:
    assert (a.hits, a.misses, a.gpu_hits) == (b.hits, b.misses, b.gpu_hits)
    assert np.array_equal(a.final_cache, b.final_cache)
    for x, y in zip(a.batches, b.batches, strict=True):
        for field in ("src", "idx", "insert_pos", "insert_slot"):
            assert np.array_equal(getattr(x, field), getattr(y, field)), field


@pytest.mark.parametrize("seed", range(6))
def test_two_step_planner_equals_the_one_shot_planner(seed: int) -> None:
    """Trace-then-simulate (node-indexed, as prepare runs it) plans exactly like the one-shot call."""
    rng = np.random.default_rng(seed)
    n = 300
    trace = random_trace(rng, 14, n, 60, 0.8)
    freq = frequency_of(trace, n + 7)             # a universe larger than the ids used
    gpu = np.sort(rng.choice(n, size=int(rng.integers(0, 20)), replace=False)).astype(np.int64)
    cap = int(rng.integers(0, 80))
    init = initial_fill(trace[:10], cap, freq, gpu) if seed % 2 else None
    batches, lookahead = trace[:6], trace[6:10]
    nodes = np.concatenate(batches + lookahead)
    offsets = np.r_[0, np.cumsum([b.shape[0] for b in batches + lookahead])].astype(np.int64)
    one = kernels.belady_plan(nodes, offsets, len(batches), cap,
                              np.full(cap, -1, np.int64) if init is None else init, gpu, freq)
    prebuilt = trace_window(batches, lookahead, gpu, freq.shape[0])
    two = plan_belady(batches, [], cap, init, gpu, freq, trace=prebuilt)
    assert np.array_equal(np.concatenate([b.src for b in two.batches]), one["src"])
    assert np.array_equal(np.concatenate([b.idx for b in two.batches]), one["idx"])
    assert np.array_equal(np.concatenate([b.insert_pos for b in two.batches]), one["insert_pos"])
    assert np.array_equal(two.final_cache, one["final_cache"])
    assert (two.hits, two.misses, two.gpu_hits) == (one["hits"], one["misses"], one["gpu_hits"])
    _same_plan(two, plan_belady(batches, lookahead, cap, init, gpu, freq))
    replay(two, batches, init, gpu)


def test_planner_scratch_is_kept_for_the_next_plan_until_released() -> None:
    """A simulation leaves its scratch (a slot and a flag per node, the cache, the buckets) for the next one;
    `release_planner_scratch` frees it (its bytes: at least the per-node arrays), after which plans are the
    same as before."""
    rng = np.random.default_rng(11)
    n = 50_000
    trace = random_trace(rng, 8, n, 2_000, 0.5)
    freq = frequency_of(trace, n)
    release_planner_scratch()
    batches, lookahead = trace[:4], trace[4:]
    first = plan_belady(batches, [], 500, None, NO_GPU, freq, trace=trace_window(batches, lookahead, NO_GPU, n))
    assert release_planner_scratch() >= n * (4 + 1)          # slot_of (int32) and held (char) per node
    assert release_planner_scratch() == 0                      # nothing left
    _same_plan(first, plan_belady(batches, [], 500, None, NO_GPU, freq,
                                  trace=trace_window(batches, lookahead, NO_GPU, n)))
    release_planner_scratch()


@pytest.mark.parametrize(("window", "dtype"), [(9, np.uint8), (254, np.uint8), (255, np.uint16), (300, np.uint16),
                                               (65534, np.uint16), (65535, np.int32)])
def test_first_uses_take_the_narrowest_type_and_plan_alike(window: int, dtype: type) -> None:
    """A trace's next uses and per-node first uses are uint8 below 255 window batches, uint16 below 65535, else
    int32 (the type's largest value: none); every width plans exactly like the one-shot planner, and a trace too
    narrow for the window it is used with is refused by name."""
    rng = np.random.default_rng(window)
    n = 60
    if window <= 400:
        trace = random_trace(rng, window, n, 4, 0.7)
        plan_n = max(1, window // 2)
    else:   # random batches at both ends, node n alone between them: the planned rows' next uses reach the
        # window's last batches (past 32767 in a 65534-batch window) without planning or drawing 65k batches
        ends = random_trace(rng, 2 * 150, n, 4, 0.7)
        trace = [*ends[:150], *([np.array([n], np.int64)] * (window - 300)), *ends[150:]]
        plan_n = 150
    freq = frequency_of(trace, n + 2)
    gpu = ids(1, 7)
    cap = 9
    batches, lookahead = trace[:plan_n], trace[plan_n:]
    prebuilt = trace_window(batches, lookahead, gpu, freq.shape[0])
    assert prebuilt.first_use.dtype == dtype and prebuilt.next_use.dtype == dtype and prebuilt.window_batches == window
    assert prebuilt.first_use[n + 1] == np.iinfo(dtype).max                  # a node no batch uses
    if window > 400:        # planned rows next used at the window's far end, past int16's range
        assert prebuilt.next_use[prebuilt.next_use != np.iinfo(dtype).max].max() >= window - 150 > 2**15
    used = np.concatenate(trace)
    first_batch = np.repeat(np.arange(window), [b.shape[0] for b in trace])
    expect = np.full(n + 2, np.iinfo(dtype).max, np.int64)
    np.minimum.at(expect, used, first_batch)
    assert np.array_equal(prebuilt.first_use.astype(np.int64), expect)
    nodes = np.concatenate(trace)
    offsets = np.r_[0, np.cumsum([b.shape[0] for b in trace])].astype(np.int64)
    init = initial_fill(trace[:3], cap, freq, gpu)
    one = kernels.belady_plan(nodes, offsets, plan_n, cap, init, gpu, freq)
    two = plan_belady(batches, [], cap, init, gpu, freq, trace=prebuilt)
    assert np.array_equal(np.concatenate([b.src for b in two.batches]), one["src"])
    assert np.array_equal(np.concatenate([b.idx for b in two.batches]), one["idx"])
    assert np.array_equal(two.final_cache, one["final_cache"])
    if dtype is not np.int32:
        bigger = np.iinfo(dtype).max + 1          # a window the trace's entries cannot count
        planned = nodes[:offsets[plan_n]]
        with pytest.raises(ValueError, match="next_use: .*cannot hold a window of"):
            kernels.belady_simulate(planned, offsets[:plan_n + 1], bigger, cap, init, gpu, freq, prebuilt.next_use,
                                    prebuilt.first_use, prebuilt.gpu_slot)
        wide_next = prebuilt.next_use.astype(np.int32)
        wide_next[prebuilt.next_use == np.iinfo(dtype).max] = 2**31 - 1
        with pytest.raises(ValueError, match="first_use: .*cannot hold a window of"):
            kernels.belady_simulate(planned, offsets[:plan_n + 1], bigger, cap, init, gpu, freq, wide_next,
                                    prebuilt.first_use, prebuilt.gpu_slot)
        # int32 next uses beside narrow first uses (any widths that hold the window) plan alike
        _same_plan(two, plan_belady(batches, [], cap, init, gpu, freq,
                                    trace=replace(prebuilt, next_use=wide_next)))
        beyond = wide_next.copy()
        beyond[0] = window                                  # a batch after the window's last
        with pytest.raises(ValueError, match=f"next_use: access 0 is next used in batch {window}, outside the window"):
            plan_belady(batches, [], cap, init, gpu, freq, trace=replace(prebuilt, next_use=beyond))
        late = prebuilt.first_use.copy()
        late[init[0]] = window
        with pytest.raises(ValueError, match=f"first_use: node {init[0]} is first used in batch {window}, outside"):
            plan_belady(batches, [], cap, init, gpu, freq, trace=replace(prebuilt, first_use=late))
    with pytest.raises(ValueError, match="first_use: expected dtype uint8, uint16 or int32"):
        kernels.belady_simulate(nodes[:offsets[plan_n]], offsets[:plan_n + 1], window, cap, init, gpu, freq,
                                prebuilt.next_use, prebuilt.first_use.astype(np.int64), prebuilt.gpu_slot)
    # Entries of the trace's own width are checked too, wherever the fault sits: the last access here
    planned, last = nodes[:offsets[plan_n]], offsets[plan_n] - 1
    simulate = (lambda n, nu: kernels.belady_simulate(n, offsets[:plan_n + 1], window, cap, init, gpu, freq, nu,
                                                      prebuilt.first_use, prebuilt.gpu_slot))
    outside = prebuilt.next_use.copy()
    outside[last] = window                                  # the batch after the window's last
    with pytest.raises(ValueError, match=f"next_use: access {last} is next used in batch {window}, outside the window"):
        simulate(planned, outside)
    if dtype is np.int32:
        outside[last] = -2
        with pytest.raises(ValueError, match=f"next_use: access {last} is next used in batch -2, outside the window"):
            simulate(planned, outside)
    unknown = planned.copy()
    unknown[last] = freq.shape[0]                           # a node beyond the frequency array
    with pytest.raises(ValueError, match=rf"nodes: node id {freq.shape[0]} outside \[0, {freq.shape[0]}\)"):
        simulate(unknown, prebuilt.next_use)


@pytest.mark.parametrize("seed", range(4))
def test_int32_counts_plan_exactly_like_int64(seed: int) -> None:
    """A round's counts stay int32 (`count.dense_counts`): every planner path reads them in place and plans
    exactly as with int64 counts; other dtypes are refused by name."""
    rng = np.random.default_rng(100 + seed)
    n = 400
    trace = random_trace(rng, 12, n, 70, 0.9)
    wide = frequency_of(trace, n + 3)
    narrow = wide.astype(np.int32)
    gpu = np.sort(rng.choice(n, size=int(rng.integers(0, 15)), replace=False)).astype(np.int64)
    cap = int(rng.integers(1, 90))
    init64, init32 = initial_fill(trace[:8], cap, wide, gpu), initial_fill(trace[:8], cap, narrow, gpu)
    assert np.array_equal(init64, init32)
    batches, lookahead = trace[:6], trace[6:9]
    _same_plan(plan_belady(batches, lookahead, cap, init64, gpu, wide),
               plan_belady(batches, lookahead, cap, init32, gpu, narrow))
    prebuilt = trace_window(batches, lookahead, gpu, n + 3)
    _same_plan(plan_belady(batches, [], cap, init64, gpu, wide, trace=prebuilt),
               plan_belady(batches, [], cap, init32, gpu, narrow, trace=prebuilt))
    nodes = np.concatenate(batches)
    offsets = np.r_[0, np.cumsum([b.shape[0] for b in batches])].astype(np.int64)
    for bad in (wide.astype(np.float64), wide.astype(np.uint32), narrow[::2]):
        with pytest.raises(ValueError, match="frequency"):
            kernels.belady_initial_fill(nodes, offsets, cap, gpu, bad)


def test_trace_and_simulate_refuse_bad_input() -> None:
    b = [ids(1, 2), ids(2, 5)]
    with pytest.raises(ValueError, match="frequency: has 5 entries but node id 5"):
        trace_window(b, [], NO_GPU, 5)
    with pytest.raises(ValueError, match="occurs twice in batch 2"):
        trace_window(b, [ids(3, 3)], NO_GPU, 9)
    with pytest.raises(ValueError, match="negative node id"):
        trace_window([ids(-1)], [], NO_GPU, 9)
    t = trace_window(b, [], NO_GPU, 9)
    freq = np.ones(9, np.int64)
    with pytest.raises(ValueError, match="traced for other batches"):
        plan_belady([ids(1, 2, 3)], [], 2, None, NO_GPU, freq, trace=t)
    with pytest.raises(ValueError, match="needs the frequency"):
        plan_belady(b, [], 2, None, NO_GPU, None, trace=t)
    with pytest.raises(ValueError, match="first_use"):
        plan_belady(b, [], 2, None, NO_GPU, np.ones(8, np.int64), trace=t)
    with pytest.raises(ValueError, match="held by two slots"):
        plan_belady(b, [], 2, ids(4, 4), NO_GPU, freq, trace=t)
    with pytest.raises(ValueError, match="belongs to the GPU tier"):
        plan_belady(b, [], 2, ids(4, -1), ids(4), freq, trace=trace_window(b, [], ids(4), 9))
    with pytest.raises(ValueError, match="does not match gpu_ids"):
        plan_belady(b, [], 2, None, ids(4), freq, trace=t)


def reference_plan(batches: list[np.ndarray], lookahead: list[np.ndarray], capacity: int, init: np.ndarray,
                   frequency: np.ndarray) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """`plan_belady`'s documented rule, written out slowly: after each batch, misses in (badness, node)
    order take the lowest free slot, else the slot of the worst earlier resident when strictly better
    by badness; admission stops at the first miss that gets no slot. Badness: the next window batch
    using the row, then far rows by frequency (hotter first), rows never used again last (never
    admitted). Returns per batch (insert_pos, insert_slot) and the final cache."""
    window = batches + lookahead
    uses: dict[int, list[int]] = {}
    for j, b in enumerate(window):
        for v in b.tolist():
            uses.setdefault(v, []).append(j)
    far, never = len(window), len(window) + 1

    def bad(node: int, after: int) -> tuple[int, int]:
        nxt = next((j for j in uses.get(node, []) if j > after), None)
        if nxt is not None:
            return (nxt, 0)
        f = int(frequency[node])
        return (far, -f) if f > 0 else (never, 0)

    slot_of = {int(v): s for s, v in enumerate(init.tolist()) if v >= 0}
    free = sorted(s for s, v in enumerate(init.tolist()) if v < 0)
    out = []
    for b, rows in enumerate(batches):
        misses = sorted((bad(int(v), b), int(v), p) for p, v in enumerate(rows.tolist()) if int(v) not in slot_of)
        misses = [m for m in misses if m[0][0] != never]
        held = sorted(((bad(v, b), v) for v in slot_of), reverse=True)   # earlier residents, worst first
        pos, slots = [], []
        for rank, v, p in misses:
            if free:
                s = free.pop(0)
            else:
                if not held:
                    break
                worst_rank, worst = held[0]
                if not rank < worst_rank:
                    break
                s = slot_of.pop(worst)
                held.pop(0)
            slot_of[v] = s
            pos.append(p)
            slots.append(s)
        out.append((np.array(pos, np.int64), np.array(slots, np.int64)))
    final = np.full(capacity, -1, np.int64)
    for v, s in slot_of.items():
        final[s] = v
    return out, final


@pytest.mark.parametrize("seed, scale", [(0, 1), (1, 2**40), (1, 2**41)])
def test_large_buckets_plan_exactly_as_the_rule_says(seed: int, scale: int) -> None:
    """Batches of thousands of rows, so the planner's buckets and miss classes pass the size where it
    radix-sorts them (2,048): the inserts, slots and final cache equal the rule written out in Python.
    With frequencies scaled by 2^40 or 2^41, far rows' (badness, node) keys need 65 or 66 bits: sorted
    by comparison then, still exactly."""
    rng = np.random.default_rng(50 + seed)
    n = 60_000
    weights = 1.0 / np.arange(1, n + 1) ** 0.5
    weights /= weights.sum()
    trace = [rng.permutation(rng.choice(n, size=int(rng.integers(9_000, 11_000)), replace=False, p=weights))
             .astype(np.int64) for _ in range(8)]
    freq = frequency_of(trace, n) * rng.integers(1, 50, size=n) * scale   # far rows: a wide range of frequencies
    capacity = 16_000
    init = initial_fill(trace[:3], capacity // 4, freq, NO_GPU)
    init = np.concatenate([init, np.full(capacity - init.shape[0], -1, np.int64)])
    batches, lookahead = trace[:6], trace[6:]
    plan = plan_belady(batches, lookahead, capacity, init, NO_GPU, freq)
    expected, final = reference_plan(batches, lookahead, capacity, init, freq)
    assert sum(p.size for p, _ in expected) > 3_000           # a real test: thousands of inserts
    for got, (pos, slots) in zip(plan.batches, expected):
        assert np.array_equal(got.insert_pos, pos)
        assert np.array_equal(got.insert_slot, slots)
    assert np.array_equal(plan.final_cache, final)
    replay(plan, batches, init, NO_GPU)
