"""Segment-size search (DiskGNN Algorithm 2), checked against a brute-force byte count."""
from __future__ import annotations

import re

import numpy as np
import pytest
from diskflow.operators.prepare.search import MissTrace, packed_bytes, search_segment_size

from diskflow.errors import ConfigError

ROW = 47 * 4          # odd row size on purpose: rows straddle pages
PAD = 3 * 4096        # e.g. a batch spread over three shards


def _trace(seed: int, num_batches: int = 37, num_nodes: int = 900) -> list[np.ndarray]:
    """Skewed misses: some nodes are missed by many batches, most by few; sizes vary per batch."""
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, num_nodes + 1) ** 0.7
    w /= w.sum()
    ids = rng.permutation(num_nodes)
    return [np.unique(ids[rng.choice(num_nodes, int(rng.integers(20, 120)), p=w)]) for _ in range(num_batches)]


def _brute_bytes(misses: list[np.ndarray], s: int, row: int = ROW, pad: int = PAD) -> int:
    """Bytes of the segment-size-s layout, counted set by set."""
    total = len(misses) * pad
    for start in range(0, len(misses), s):
        counts: dict[int, int] = {}
        for m in misses[start:start + s]:
            for v in m.tolist():
                counts[v] = counts.get(v, 0) + 1
        cache_rows = sum(1 for c in counts.values() if c >= 2)
        total += -(-cache_rows * row // 4096) * 4096 + sum(1 for c in counts.values() if c == 1) * row
    return total


def _brute_estimates(misses: list[np.ndarray], row: int = ROW, pad: int = PAD) -> list[int]:
    n, seen, out = len(misses), set(), []
    for i, m in enumerate(misses, start=1):
        seen.update(m.tolist())
        out.append(-(-len(seen) * n * row // i) + n * pad)
    return out


def test_packed_bytes() -> None:
    assert packed_bytes([3, 0, 5], 100, 4096) == 800 + 3 * 4096
    assert packed_bytes(np.array([], dtype=np.int64), 100, 4096) == 0


def test_budget_that_packing_meets_needs_no_disk_cache() -> None:
    misses = _trace(0)
    packed = packed_bytes([len(m) for m in misses], ROW, PAD)
    for budget in (packed, packed + 1, 10 * packed):
        found = search_segment_size(misses, ROW, budget, PAD)
        assert found.segment_size is None
        assert found.actual_bytes == found.packed_only_bytes == packed
    assert search_segment_size(misses, ROW, packed - 1, PAD).segment_size is not None


@pytest.mark.parametrize("seed", range(3))
def test_chosen_layout_meets_every_budget(seed: int) -> None:
    misses = _trace(seed)
    n = len(misses)
    packed = packed_bytes([len(m) for m in misses], ROW, PAD)
    smallest = _brute_bytes(misses, n)
    estimates = _brute_estimates(misses)
    sizes = []
    for budget in np.linspace(smallest, packed - 1, 25).astype(int).tolist():
        found = search_segment_size(misses, ROW, budget, PAD)
        s = found.segment_size
        assert s is not None and 2 <= s <= n
        assert found.actual_bytes == _brute_bytes(misses, s) <= budget
        # s is the first size at or after Algorithm 2's pick whose real layout fits
        first = next(i for i, e in enumerate(estimates, start=1) if e <= budget)
        assert found.estimated_bytes == estimates[first - 1]
        assert s >= first
        assert all(_brute_bytes(misses, t) > budget for t in range(max(first, 2), s))
        sizes.append(s)
    # budgets ascend along `sizes`: a larger budget never needs a larger segment
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[0] > sizes[-1]


def test_real_layout_is_checked_when_the_estimate_is_optimistic() -> None:
    # The first batches miss few, disjoint nodes; later ones miss many shared nodes, so
    # extrapolating the first batches underestimates and the search must grow s.
    early = [np.arange(10 * i, 10 * i + 10) for i in range(8)]
    late = [np.arange(1000, 1300) + 150 * (i % 2) for i in range(8)]
    misses = early + late
    packed = packed_bytes([len(m) for m in misses], ROW, 0)
    budget = int(0.6 * packed)
    found = search_segment_size(misses, ROW, budget, 0)
    first = next(i for i, e in enumerate(_brute_estimates(misses, pad=0), start=1) if e <= budget)
    assert first == 1 and found.estimated_bytes < budget // 5         # wildly optimistic
    assert found.segment_size == 4                                      # s = 2 and 3 were tried and rejected
    assert found.actual_bytes == _brute_bytes(misses, 4, pad=0) <= budget
    assert _brute_bytes(misses, 2, pad=0) > budget and _brute_bytes(misses, 3, pad=0) > budget


def test_impossible_budget_names_the_smallest_that_works() -> None:
    misses = _trace(4)
    smallest = _brute_bytes(misses, len(misses))
    with pytest.raises(ConfigError) as err:
        search_segment_size(misses, ROW, smallest - 1, PAD)
    assert err.value.option == "disk_budget"
    assert str(smallest) in str(err.value)
    assert int(re.search(r"smallest workable budget is (\d+) bytes", str(err.value)).group(1)) == smallest
    found = search_segment_size(misses, ROW, smallest, PAD)
    assert found.actual_bytes <= smallest
    distinct = len(np.unique(np.concatenate(misses)))
    assert f"{distinct} distinct missed rows" in str(err.value)
    with pytest.raises(ConfigError):
        search_segment_size(misses, ROW, distinct * ROW, PAD)


def test_bad_inputs() -> None:
    with pytest.raises(ConfigError, match="^disk_budget"):
        search_segment_size(_trace(0), ROW, -1)
    with pytest.raises(ValueError, match="twice"):
        search_segment_size([np.array([1, 2]), np.array([3, 3])], ROW, 0)
    with pytest.raises(ValueError, match=">= 0"):
        search_segment_size([np.array([-1])], ROW, 0)


def test_empty_rounds() -> None:
    assert search_segment_size([], ROW, 0).segment_size is None
    found = search_segment_size([np.array([], dtype=np.int64)] * 3, ROW, 0)
    assert found.segment_size is None and found.actual_bytes == 0
    with pytest.raises(ConfigError):
        search_segment_size([np.array([], dtype=np.int64)] * 3, ROW, 3 * PAD - 1, PAD)


def test_estimate_has_no_int64_overflow() -> None:
    # seen * n * row_bytes = 9 * 3 * 2**59 overflows int64 although every estimate fits.
    trace = MissTrace([np.arange(5), np.arange(5, 9), np.arange(2)])
    row = 2**59
    got = trace.estimates(row, 7).tolist()
    want = [-(-5 * 3 * row // 1) + 21, -(-9 * 3 * row // 2) + 21, -(-9 * 3 * row // 3) + 21]
    assert got == want
