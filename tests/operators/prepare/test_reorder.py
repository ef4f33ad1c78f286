"""MinHash reordering (DiskGNN Algorithm 1) and the page counter that judges it."""
from __future__ import annotations

import numpy as np
import pytest
from diskflow.operators.prepare.reorder import batch_hashes, minhash_order, pages_touched

from diskflow.errors import ConfigError


def _rows_in(order: np.ndarray, node: np.ndarray) -> np.ndarray:
    """Row of each accessed node in a file laid out in `order`."""
    pos = np.full(int(order.max()) + 1, -1, dtype=np.int64)
    pos[order] = np.arange(order.shape[0])
    return pos[node]


def _random_accesses(seed: int, num_batches: int = 30, per_batch: int = 250, num_nodes: int = 2500):
    rng = np.random.default_rng(seed)
    node = np.concatenate([rng.choice(num_nodes, per_batch, replace=False) for _ in range(num_batches)])
    batch = np.repeat(np.arange(num_batches), per_batch)
    return batch, node


@pytest.mark.parametrize("k", [1, 2])
def test_minhash_gathers_interleaved_groups(k: int) -> None:
    # 16 groups of 32 nodes, interleaved in id order (node j*16 + g is in group g); group g is
    # read by batches g and g + 16 only. 512-byte rows: 8 per page, a group fills 4 pages.
    groups, size, row_bytes = 16, 32, 512
    node = np.concatenate([np.arange(size) * groups + g for g in range(groups)] * 2)
    batch = np.concatenate([np.full(size, g) for g in range(groups)] + [np.full(size, g + groups) for g in range(groups)])
    nodes = np.arange(groups * size)
    order = minhash_order(batch, node, nodes, 2 * groups, k=k, seed=3)
    assert np.array_equal(np.sort(order), nodes)
    by_id = pages_touched((batch, node), row_bytes)
    by_minhash = pages_touched((batch, _rows_in(order, node)), row_bytes)
    assert by_id == 2 * groups * size                    # every row on its own page
    assert by_minhash == 2 * groups * (size * row_bytes // 4096)   # each batch reads exactly its group's 4 pages


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("seed", range(4))
def test_minhash_never_worse_than_id_order_on_random_accesses(k: int, seed: int) -> None:
    batch, node = _random_accesses(seed)
    nodes = np.unique(node)
    order = minhash_order(batch, node, nodes, 30, k=k, seed=seed)
    for row_bytes in (188, 512, 1000):
        by_id = pages_touched((batch, _rows_in(nodes, node)), row_bytes)
        by_minhash = pages_touched((batch, _rows_in(order, node)), row_bytes)
        assert by_minhash < by_id


def test_two_hash_functions_beat_one_on_random_accesses() -> None:
    pages = {}
    for k in (1, 2):
        total = 0
        for seed in range(3):
            batch, node = _random_accesses(seed)
            order = minhash_order(batch, node, np.unique(node), 30, k=k, seed=seed)
            total += pages_touched((batch, _rows_in(order, node)), 512)
        pages[k] = total
    assert pages[2] < pages[1]


def test_minhash_is_deterministic_for_a_seed() -> None:
    batch, node = _random_accesses(0)
    nodes = np.unique(node)
    a = minhash_order(batch, node, nodes, 30, seed=11)
    b = minhash_order(batch, node, nodes, 30, seed=11)
    c = minhash_order(batch, node, nodes, 30, seed=12)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert np.array_equal(batch_hashes(30, 2, 11), batch_hashes(30, 2, 11))


def test_minhash_signature_is_min_over_accessing_batches() -> None:
    # Brute force: sort key of every node = (min hash0 over its batches, min hash1, node id).
    batch, node = _random_accesses(5, num_batches=12, per_batch=40, num_nodes=300)
    nodes = np.unique(node)[::2]                          # order a subset; other pairs are ignored
    hashes = batch_hashes(12, 2, seed=4)
    keys = []
    for v in nodes.tolist():
        bs = batch[node == v]
        keys.append((int(hashes[0, bs].min()), int(hashes[1, bs].min()), v))
    expected = np.array([key[2] for key in sorted(keys)])
    assert np.array_equal(minhash_order(batch, node, nodes, 12, k=2, seed=4), expected)


def test_nodes_without_accesses_go_last_by_id() -> None:
    order = minhash_order(np.array([0, 1]), np.array([7, 7]), np.array([9, 7, 3]), 2, k=2)
    assert order.tolist() == [7, 3, 9]
    assert minhash_order(np.array([], dtype=np.int64), np.array([], dtype=np.int64), np.array([5, 2]), 0).tolist() == [2, 5]


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="minhash"):
        batch_hashes(4, k=0)
    with pytest.raises(ValueError, match="batch ids"):
        minhash_order(np.array([4]), np.array([1]), np.array([1]), 4)


def test_pages_touched_hand_cases() -> None:
    # 1000-byte rows: rows 0..4 cover bytes [0, 5000): pages 0 and 1 (row 4 straddles).
    assert pages_touched([np.arange(5)], 1000) == 2
    assert pages_touched([np.array([4])], 1000) == 2
    assert pages_touched([np.array([0]), np.array([1])], 1000) == 2     # same page, two batches: read twice
    assert pages_touched([np.array([0, 1, 2, 3])], 1024) == 1
    assert pages_touched([np.array([0, 8])], 512) == 2
    # rows larger than a page: row 0 = [0, 10000) -> 3 pages; rows 0, 1 -> [0, 20000) -> 5 pages
    assert pages_touched([np.array([0])], 10000) == 3
    assert pages_touched([np.array([1, 0])], 10000) == 5
    assert pages_touched([np.array([], dtype=np.int64)], 512) == 0
    assert pages_touched([], 512) == 0


def test_pages_touched_matches_brute_force() -> None:
    rng = np.random.default_rng(1)
    for row_bytes in (47 * 4, 4096, 5000):
        batches = [rng.choice(400, rng.integers(0, 60), replace=False) for _ in range(9)]
        expected = 0
        for rows in batches:
            pages = set()
            for r in rows.tolist():
                pages.update(range(r * row_bytes // 4096, ((r + 1) * row_bytes - 1) // 4096 + 1))
            expected += len(pages)
        flat = (np.repeat(np.arange(9), [len(b) for b in batches]), np.concatenate(batches))
        assert pages_touched(batches, row_bytes) == expected
        assert pages_touched(flat, row_bytes) == expected
