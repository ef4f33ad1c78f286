"""Partitioning (`operators.prepare.partition`) and partition batches (`seeds.BatchOrder`): the undirected
adjacency partitioners take, valid and repeatable parts from both partitioners, and batches that cover
every training node once per epoch, repeatably, from few parts each."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from diskflow.operators.formats.npyio import save_npy
from diskflow.operators.prepare.partition import (
    default_parts,
    edge_cut,
    partition_graph,
    undirected_adjacency,
)
from diskflow.operators.prepare.seeds import BatchOrder, part_labels, partition_order, seed_batches

from diskflow.errors import ConfigError


def _csc(n: int, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((src, dst))
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return indptr, src[order].astype(np.int32)


def test_undirected_adjacency_is_the_symmetric_simple_graph() -> None:
    rng = np.random.default_rng(4)
    n = 37
    src, dst = rng.integers(0, n, 300), rng.integers(0, n, 300)
    src, dst = np.concatenate([src, [5, 5, 9]]), np.concatenate([dst, [5, 5, 9]])   # self loops, repeated
    xadj, adj = undirected_adjacency(*_csc(n, src, dst))
    want = {(int(a), int(b)) for a, b in zip(src, dst) if a != b}
    want |= {(b, a) for a, b in want}
    got = [(i, int(v)) for i in range(n) for v in adj[xadj[i]:xadj[i + 1]]]
    assert len(got) == len(set(got)) == len(want)            # no repeats
    assert set(got) == want
    for i in range(n):                                         # each neighbourhood sorted
        assert np.all(np.diff(adj[xadj[i]:xadj[i + 1]]) > 0)


def _two_cliques(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Two k-cliques joined by one edge, as a store's CSC (both directions stored)."""
    pairs = [(a, b) for base in (0, k) for a in range(base, base + k) for b in range(base, base + k) if a != b]
    pairs += [(0, k), (k, 0)]
    src, dst = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    return _csc(2 * k, src, dst)


@pytest.mark.parametrize("method", ["kaminpar", "metis"])
def test_both_partitioners_find_the_min_cut_and_repeat_themselves(method: str, tmp_path: Path) -> None:
    xadj, adj = undirected_adjacency(*_two_cliques(9))
    parts = partition_graph(xadj, adj, 2, method=method, seed=1, scratch=tmp_path)
    assert parts.dtype == np.int32 and parts.shape == (18,)
    assert set(parts.tolist()) == {0, 1}
    assert edge_cut(xadj, adj, parts) == 1                      # the one bridge
    assert len(set(parts[:9].tolist())) == 1 and len(set(parts[9:].tolist())) == 1
    again = partition_graph(xadj, adj, 2, method=method, seed=1, scratch=tmp_path)
    np.testing.assert_array_equal(parts, again)
    assert list(tmp_path.iterdir()) == []                       # KaMinPar's input file is gone


def test_partition_options_are_checked() -> None:
    xadj, adj = undirected_adjacency(*_two_cliques(4))
    with pytest.raises(ConfigError, match="^partitions"):
        partition_graph(xadj, adj, 1)
    with pytest.raises(ConfigError, match="^partitions"):
        partition_graph(xadj, adj, 9)
    with pytest.raises(ConfigError, match="^partitioner"):
        partition_graph(xadj, adj, 2, method="fennel")
    assert default_parts(1000, 10_000) == 8 and default_parts(10, 10_000) == 2 and default_parts(10**6, 50) == 50
    assert default_parts(1000, 10_000, partitions=33) == 33
    # eight parts per batch: the part size follows the batch size (a group of 20 parts fills 2.5 batches)
    assert default_parts(8000, 2_000_000, batch_size=128) == 500 and default_parts(8000, 2_000_000, batch_size=4) == 8000
    assert default_parts(1000, 10_000, batch_size=1024) == default_parts(1000, 10_000) == 8


@pytest.fixture
def parts_file(tmp_path: Path) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(0)
    parts = rng.integers(0, 40, 5000).astype(np.int32)
    path = tmp_path / "parts.npy"
    save_npy(path, parts)
    return path, parts


def test_partition_batches_cover_every_seed_once_repeatably(parts_file: tuple[Path, np.ndarray]) -> None:
    path, parts = parts_file
    seeds = np.sort(np.random.default_rng(1).choice(5000, 1234, replace=False))
    order = BatchOrder("partition", str(path), group=3)
    for epoch in range(3):
        batches = seed_batches(seeds, 100, epoch, seed=5, order=order)
        assert [b.shape[0] for b in batches] == [100] * 12 + [34]   # as many batches as shuffled ones
        np.testing.assert_array_equal(np.sort(np.concatenate(batches)), seeds)
        again = seed_batches(seeds, 100, epoch, seed=5, order=order)
        assert all(np.array_equal(a, b) for a, b in zip(batches, again))
    one = np.concatenate(seed_batches(seeds, 100, 0, 5, order=order))
    assert not np.array_equal(one, np.concatenate(seed_batches(seeds, 100, 1, 5, order=order)))   # per epoch
    assert not np.array_equal(one, np.concatenate(seed_batches(seeds, 100, 0, 6, order=order)))   # per seed
    # groups of 3 parts, taken in turn: the sequence of parts changes at most 3 times per group
    seq = parts[one]
    group_of = np.empty(40, dtype=np.int64)
    first_seen = seq[np.sort(np.unique(seq, return_index=True)[1])]
    group_of[first_seen] = np.arange(first_seen.shape[0]) // 3
    assert np.all(np.diff(group_of[seq]) >= 0)
    shuffled = seed_batches(seeds, 100, 0, 5)
    parts_per_batch = np.mean([np.unique(parts[b]).shape[0] for b in seed_batches(seeds, 100, 0, 5, order=order)])
    assert parts_per_batch < 0.5 * np.mean([np.unique(parts[b]).shape[0] for b in shuffled])


def test_partition_order_shuffles_within_groups() -> None:
    seed_parts = np.repeat(np.arange(4), 50)
    perm = partition_order(seed_parts, group=1, epoch=0, seed=0)
    np.testing.assert_array_equal(np.sort(perm), np.arange(200))
    runs = seed_parts[perm].reshape(4, 50)
    assert all(len(set(r.tolist())) == 1 for r in runs)               # one part after another
    assert not np.array_equal(perm[:50], np.sort(perm[:50]))          # shuffled inside


def test_label_grouping_mixes_the_labels_of_single_label_parts(tmp_path: Path) -> None:
    # 40 parts of 50 seeds each, every part of one label (4 labels, 10 parts each), as min-cut
    # parts of a homophilous graph nearly are; groups of 4 parts, batches of one group each
    parts = np.repeat(np.arange(40, dtype=np.int32), 50)
    labels = np.repeat(np.random.default_rng(2).permutation(np.repeat(np.arange(4), 10)), 50).astype(np.int64)
    save_npy(tmp_path / "p.npy", parts)
    save_npy(tmp_path / "y.npy", labels)
    seeds = np.arange(2000)
    by_label = BatchOrder("partition", str(tmp_path / "p.npy"), group=4, grouping="label", labels=str(tmp_path / "y.npy"))
    by_chance = BatchOrder("partition", str(tmp_path / "p.npy"), group=4)
    for epoch in range(3):
        batches = seed_batches(seeds, 200, epoch, seed=1, order=by_label)
        np.testing.assert_array_equal(np.sort(np.concatenate(batches)), seeds)       # every seed once
        assert all(np.unique(parts[b]).shape[0] == 4 for b in batches)              # whole groups of 4 parts
        assert all(np.unique(labels[b]).shape[0] == 4 for b in batches)             # one part of each label
        again = seed_batches(seeds, 200, epoch, seed=1, order=by_label)
        assert all(np.array_equal(a, b) for a, b in zip(batches, again))
    first = [np.unique(parts[b]).tolist() for b in seed_batches(seeds, 200, 0, 1, order=by_label)]
    assert first != [np.unique(parts[b]).tolist() for b in seed_batches(seeds, 200, 1, 1, order=by_label)]
    # grouped at random, some batch misses a label (most do)
    chance = seed_batches(seeds, 200, 0, seed=1, order=by_chance)
    assert min(np.unique(labels[b]).shape[0] for b in chance) < 4
    assert by_label.describe()["grouping"] == "label" and "grouping" not in by_chance.describe()
    with pytest.raises(ConfigError, match="^group_by"):
        BatchOrder("partition", str(tmp_path / "p.npy"), grouping="label")       # no labels
    with pytest.raises(ConfigError, match="^group_by"):
        BatchOrder("partition", str(tmp_path / "p.npy"), grouping="degree")


def test_part_labels_is_each_parts_most_common_label() -> None:
    rng = np.random.default_rng(3)
    part_of_seed = rng.integers(0, 30, 3000)
    seed_labels = rng.integers(-1, 7, 3000) * 10           # any integers: negative, sparse
    got = part_labels(part_of_seed, seed_labels, 31)
    values = np.unique(seed_labels)
    for q in range(30):
        counts = np.array([(seed_labels[part_of_seed == q] == v).sum() for v in values])
        assert got[q] == int(np.argmax(counts))                # the index of the label, ties: the smaller
    assert got[30] == 0                                        # a part with no seeds


def test_batch_order_errors(parts_file: tuple[Path, np.ndarray], tmp_path: Path) -> None:
    path, _ = parts_file
    with pytest.raises(ConfigError, match="^batches"):
        BatchOrder("metis")
    with pytest.raises(ConfigError, match="^batches"):
        BatchOrder("partition")
    with pytest.raises(ConfigError, match="another graph"):
        seed_batches(np.array([1, 6000]), 10, 0, 0, order=BatchOrder("partition", str(path)))
    bad = tmp_path / "bad.npy"
    save_npy(bad, np.zeros(10, dtype=np.int64))
    with pytest.raises(ConfigError, match="int32"):
        seed_batches(np.array([1]), 10, 0, 0, order=BatchOrder("partition", str(bad)))
