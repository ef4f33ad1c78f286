"""Segmented disk-cache layout: every miss placed exactly once, bytes that add up, low amplification."""
from __future__ import annotations

import numpy as np
import pytest
from diskflow.operators.prepare.diskcache import DiskCacheLayout, build_layout, read_amplification
from diskflow.operators.prepare.reorder import minhash_order, pages_touched
from diskflow.operators.prepare.search import MissTrace, packed_bytes

from diskflow.errors import ConfigError

ROW = 47 * 4
PAD = 2 * 4096


def _trace(seed: int, num_batches: int = 41, num_nodes: int = 3000, size: tuple[int, int] = (0, 200)) -> list[np.ndarray]:
    """Skewed misses with varying sizes (some batches miss nothing), in no particular order."""
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, num_nodes + 1) ** 0.6
    w /= w.sum()
    ids = rng.permutation(num_nodes)
    out = []
    for _ in range(num_batches):
        m = np.unique(ids[rng.choice(num_nodes, int(rng.integers(*size)), p=w)])
        out.append(rng.permutation(m))            # miss order is not id order
    return out


def _check_layout(layout: DiskCacheLayout, misses: list[np.ndarray], budget: int) -> None:
    n = len(misses)
    s = layout.segment_size
    assert s is not None and layout.segment_of_batch.tolist() == [i // s for i in range(n)]
    assert len(layout.cache_nodes) == -(-n // s)
    total = n * PAD
    for seg, cache in enumerate(layout.cache_nodes):
        batches = range(seg * s, min(n, (seg + 1) * s))
        nodes, counts = np.unique(np.concatenate([misses[i] for i in batches]), return_counts=True)
        # the cache holds exactly the nodes missed >= 2 times in the segment, once each
        assert np.array_equal(np.sort(cache), nodes[counts >= 2])
        total += -(-cache.shape[0] * ROW // 4096) * 4096 + int((counts == 1).sum()) * ROW
        # and its order is Algorithm 1 over the segment's accesses
        seg_batch = np.concatenate([np.full(len(misses[i]), i) for i in batches])
        seg_node = np.concatenate([misses[i] for i in batches])
        assert np.array_equal(cache, minhash_order(seg_batch, seg_node, cache, n, k=2, seed=9))
        once = set(nodes[counts == 1].tolist())
        for i in batches:
            m, in_cache, row = misses[i], layout.in_cache[i], layout.row[i]
            assert in_cache.shape == row.shape == m.shape
            # a cached miss points at the row holding that very node
            assert np.array_equal(cache[row[in_cache]], m[in_cache])
            # packed misses are exactly the ones missed once in the segment, numbered in miss order
            assert set(m[~in_cache].tolist()) == once & set(m.tolist())
            assert row[~in_cache].tolist() == list(range(int((~in_cache).sum())))
            assert np.array_equal(layout.packed_nodes(misses, i), m[~in_cache])
    assert layout.disk_bytes == total <= budget


@pytest.mark.parametrize("seed", range(2))
def test_every_miss_placed_once_and_bytes_add_up(seed: int) -> None:
    misses = _trace(seed)
    packed = packed_bytes([len(m) for m in misses], ROW, PAD)
    smallest = MissTrace(misses).layout_bytes(len(misses), ROW, PAD)      # one segment
    layouts = []
    for frac in (0.9, 0.5, 0.0):
        budget = smallest + int(frac * (packed - smallest))
        layout = build_layout(misses, ROW, budget, PAD, k=2, seed=9)
        _check_layout(layout, misses, budget)
        layouts.append(layout)
    assert layouts[0].segment_size < layouts[1].segment_size < layouts[2].segment_size == len(misses)
    for layout in layouts:
        assert read_amplification(layout, ROW) > 1.0


def test_packed_only_layout() -> None:
    misses = _trace(3, size=(1500, 2500), num_nodes=50_000)
    packed = packed_bytes([len(m) for m in misses], ROW, PAD)
    layout = build_layout(misses, ROW, packed, PAD)
    assert layout.segment_size is None and layout.cache_nodes == []
    assert (layout.segment_of_batch == -1).all()
    assert layout.disk_bytes == packed
    for m, in_cache, row in zip(misses, layout.in_cache, layout.row):
        assert not in_cache.any() and row.tolist() == list(range(len(m)))
    amp = read_amplification(layout, ROW)
    assert 1.0 <= amp <= 1.05


def test_minhash_layout_reads_less_than_id_order() -> None:
    misses = _trace(5, num_batches=60, num_nodes=20_000, size=(300, 600))
    packed = packed_bytes([len(m) for m in misses], ROW, PAD)
    layout = build_layout(misses, ROW, int(0.75 * packed), PAD)
    assert layout.segment_size is not None
    cached = [layout.row[i][layout.in_cache[i]] for i in range(len(misses))]
    by_id = []
    for i, m in enumerate(misses):
        ids = np.sort(layout.cache_nodes[layout.segment_of_batch[i]])
        by_id.append(np.searchsorted(ids, m[layout.in_cache[i]]))
    assert pages_touched(cached, ROW) < 0.85 * pages_touched(by_id, ROW)


def test_layout_is_deterministic_and_seeded() -> None:
    misses = _trace(1)
    budget = int(0.7 * packed_bytes([len(m) for m in misses], ROW, PAD))
    a, b = build_layout(misses, ROW, budget, PAD, seed=1), build_layout(misses, ROW, budget, PAD, seed=1)
    c = build_layout(misses, ROW, budget, PAD, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a.cache_nodes, b.cache_nodes))
    assert all(np.array_equal(x, y) for x, y in zip(a.row, b.row))
    assert a.disk_bytes == c.disk_bytes
    assert any(not np.array_equal(x, y) for x, y in zip(a.cache_nodes, c.cache_nodes))


def test_k1_layout_is_valid() -> None:
    misses = _trace(2)
    budget = int(0.7 * packed_bytes([len(m) for m in misses], ROW, PAD))
    layout = build_layout(misses, ROW, budget, PAD, k=1, seed=9)
    for i, m in enumerate(misses):
        cache = layout.cache_nodes[layout.segment_of_batch[i]]
        assert np.array_equal(cache[layout.row[i][layout.in_cache[i]]], m[layout.in_cache[i]])


def test_impossible_budget_and_empty_rounds() -> None:
    with pytest.raises(ConfigError, match="^disk_budget"):
        build_layout(_trace(0), ROW, 1000, PAD)
    empty = build_layout([], ROW, 0)
    assert empty.segment_size is None and empty.in_cache == [] and empty.disk_bytes == 0
    assert read_amplification(empty, ROW) == 1.0
    none_missed = build_layout([np.array([], dtype=np.int64)] * 2, ROW, 0)
    assert [r.shape for r in none_missed.row] == [(0,), (0,)]
