"""The native neighbor sampler and its numpy reference: structure, semantics, the sampled edges'
CSC positions (e_id), determinism, uniformity, errors. Graphs are small, random, without
multi-edges (so distinct edge positions mean distinct neighbours), and include nodes of in-degree 0."""
from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
import scipy.stats
import torch
from diskflow.operators.prepare.sample import NeighborSampler, SampledBatch, numpy_sample

from diskflow.errors import ConfigError

Sampler = Callable[[np.ndarray, np.ndarray, np.ndarray, list[int]], SampledBatch]


def random_csc(num_nodes: int, num_pairs: int, seed: int, dtype: type = np.int32) -> tuple[np.ndarray, np.ndarray]:
    """A random CSC graph without multi-edges (uniform pairs, deduplicated), some nodes of degree 0."""
    rng = np.random.default_rng(seed)
    dst = rng.integers(0, num_nodes, num_pairs)
    # Skew: a third of the pairs land on the first 5% of nodes, so degrees range widely.
    dst[: num_pairs // 3] = rng.integers(0, max(1, num_nodes // 20), num_pairs // 3)
    keys = np.unique(dst * num_nodes + rng.integers(0, num_nodes, num_pairs))
    dst, src = np.divmod(keys, num_nodes)
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=num_nodes), out=indptr[1:])
    # Shuffle sources inside each node's range so CSC order is not sorted order.
    order = np.lexsort((rng.random(keys.size), dst))
    return indptr, src[order].astype(dtype)


def ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    ends = np.cumsum(counts)
    return np.repeat(starts - (ends - counts), counts) + np.arange(int(counts.sum()))


def sample_equal(a: SampledBatch, b: SampledBatch) -> bool:
    """The same values (whatever the integer widths), e_id included."""
    return (np.array_equal(a.n_id, b.n_id) and np.array_equal(a.edge_index, b.edge_index)
            and a.e_id is not None and b.e_id is not None and np.array_equal(a.e_id, b.e_id)
            and a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges)


def check_e_id(indptr: np.ndarray, indices: np.ndarray, b: SampledBatch) -> None:
    """e_id is each edge's position in `indices`, column for column with edge_index: the source is read
    there, the position lies in the target's in-edge range, and no edge is reported twice."""
    assert b.e_id is not None and b.e_id.ndim == 1 and b.e_id.shape[0] == b.edge_index.shape[1]
    assert b.e_id.dtype == b.n_id.dtype  # int64, or int32 for a narrow sample (of a graph of < 2**31 edges)
    e_id = b.e_id.astype(np.int64)
    src, dst = b.n_id[b.edge_index[0]], b.n_id[b.edge_index[1]]
    np.testing.assert_array_equal(indices[e_id], src)
    assert ((e_id >= indptr[dst]) & (e_id < indptr[dst + 1])).all(), "an e_id outside its target's range"
    assert np.unique(e_id).size == e_id.size, "an edge position reported twice"


def check_batch(indptr: np.ndarray, indices: np.ndarray, seeds: np.ndarray, fanouts: list[int],
                b: SampledBatch) -> None:
    """Every structural property of a sampled batch, checked vectorised."""
    n = indptr.size - 1
    assert b.n_id.dtype == np.int64 and b.edge_index.dtype == np.int64
    assert b.edge_index.ndim == 2 and b.edge_index.shape[0] == 2
    assert b.batch_size == seeds.size
    np.testing.assert_array_equal(b.n_id[: seeds.size], seeds)
    assert np.unique(b.n_id).size == b.n_id.size, "n_id has duplicates"
    assert len(b.num_sampled_nodes) == len(fanouts) + 1 and len(b.num_sampled_edges) == len(fanouts)
    assert b.num_sampled_nodes[0] == seeds.size
    assert sum(b.num_sampled_nodes) == b.n_id.size and sum(b.num_sampled_edges) == b.edge_index.shape[1]
    check_e_id(indptr, indices, b)
    row, col = b.edge_index
    src, dst = b.n_id[row], b.n_id[col]
    # Every sampled edge exists: src is an in-neighbour of dst.
    graph_keys = np.repeat(np.arange(n), np.diff(indptr)) * n + indices.astype(np.int64)
    assert np.isin(dst * n + src, graph_keys).all(), "a sampled edge is not in the graph"
    assert np.unique(row * b.n_id.size + col).size == row.size, "an edge was sampled twice"
    node_off = np.cumsum([0, *b.num_sampled_nodes])
    edge_off = np.cumsum([0, *b.num_sampled_edges])
    deg = np.diff(indptr)
    for h, fanout in enumerate(fanouts):
        r, c = row[edge_off[h]:edge_off[h + 1]], col[edge_off[h]:edge_off[h + 1]]
        f_lo, f_hi, new_hi = node_off[h], node_off[h + 1], node_off[h + 2]
        # Only the frontier (nodes new at hop h-1) is expanded, in local-id order.
        assert ((c >= f_lo) & (c < f_hi)).all()
        assert (np.diff(c) >= 0).all()
        assert (r < new_hi).all()
        # New nodes get local ids in order of first occurrence.
        fresh = r[r >= f_hi]
        uniq, first = np.unique(fresh, return_index=True)
        np.testing.assert_array_equal(uniq[np.argsort(first)], np.arange(f_hi, new_hi))
        # min(fanout, deg) edges per frontier node (all of them for -1), degree 0 included.
        fdeg = deg[b.n_id[f_lo:f_hi]]
        want = fdeg if fanout < 0 else np.minimum(fdeg, fanout)
        np.testing.assert_array_equal(np.bincount(c - f_lo, minlength=f_hi - f_lo), want)
        # Nodes that take all their neighbours take them in CSC order.
        full = want == fdeg
        in_full = np.repeat(full, want)
        positions = ranges(indptr[b.n_id[f_lo:f_hi][full]], fdeg[full])
        np.testing.assert_array_equal(b.n_id[r[in_full]], indices[positions])
        np.testing.assert_array_equal(b.e_id[edge_off[h]:edge_off[h + 1]][in_full], positions)


def native(threads: int = 2) -> Sampler:
    return lambda indptr, indices, seeds, fanouts: NeighborSampler(indptr, indices, fanouts, threads).sample(seeds, 7)


def reference(indptr: np.ndarray, indices: np.ndarray, seeds: np.ndarray, fanouts: list[int]) -> SampledBatch:
    return numpy_sample(indptr, indices, seeds, fanouts, np.random.default_rng(7))


def reference_minimum_at(indptr: np.ndarray, indices: np.ndarray, seeds: np.ndarray,
                         fanouts: list[int]) -> SampledBatch:
    return numpy_sample(indptr, indices, seeds, fanouts, np.random.default_rng(7), dedup="minimum-at")


SAMPLERS = [pytest.param(native(), id="native"), pytest.param(reference, id="numpy"),
            pytest.param(reference_minimum_at, id="numpy-minimum-at")]


@pytest.mark.parametrize("sample", SAMPLERS)
@pytest.mark.parametrize("dtype", [np.int32, np.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("fanouts", [[3, 2], [5, -1, 2], [0, 4], [-1], [1, 1, 1, 1]], ids=str)
def test_structure(sample: Sampler, dtype: type, fanouts: list[int]) -> None:
    indptr, indices = random_csc(1237, 9000, seed=1, dtype=dtype)
    seeds = np.random.default_rng(2).choice(1237, 61, replace=False).astype(np.int64)
    b = sample(indptr, indices, seeds, fanouts)
    check_batch(indptr, indices, seeds, fanouts, b)
    assert b.edge_index.shape[1] > 0 or fanouts[0] == 0


@pytest.mark.parametrize("sample", SAMPLERS)
def test_exact_small_graph(sample: Sampler) -> None:
    # in-neighbours: 0 <- {1, 2}, 1 <- {0}, 2 <- {0, 3}, 3 <- {}
    indptr = np.array([0, 2, 3, 5, 5], dtype=np.int64)
    indices = np.array([1, 2, 0, 0, 3], dtype=np.int32)
    b = sample(indptr, indices, np.array([2, 1]), [-1, -1, -1])
    # hop 0 expands 2 (-> 0 new, 3 new) and 1 (-> 0); hop 1 expands 0 (-> 1, 2 known) and 3 (none);
    # hop 2 has an empty frontier: 0 and 1 are never expanded twice.
    np.testing.assert_array_equal(b.n_id, [2, 1, 0, 3])
    np.testing.assert_array_equal(b.edge_index, [[2, 3, 2, 1, 0], [0, 0, 1, 2, 2]])
    np.testing.assert_array_equal(b.e_id, [3, 4, 2, 0, 1])  # 2 <- 0, 3 at 3, 4; 1 <- 0 at 2; 0 <- 1, 2 at 0, 1
    assert b.e_id.dtype == np.int64
    assert b.num_sampled_nodes == [2, 2, 0, 0]
    assert b.num_sampled_edges == [3, 2, 0]
    assert b.batch_size == 2


def test_native_equals_numpy_when_nothing_is_random() -> None:
    indptr, indices = random_csc(2003, 12000, seed=3)
    seeds = np.arange(5, 2003, 37, dtype=np.int64)
    fanouts = [-1, 10_000]  # every node takes all its neighbours
    a, b = native(3)(indptr, indices, seeds, fanouts), reference(indptr, indices, seeds, fanouts)
    np.testing.assert_array_equal(a.n_id, b.n_id)
    np.testing.assert_array_equal(a.edge_index, b.edge_index)
    np.testing.assert_array_equal(a.e_id, b.e_id)
    assert (a.num_sampled_nodes, a.num_sampled_edges) == (b.num_sampled_nodes, b.num_sampled_edges)


def test_numpy_dedup_modes_agree() -> None:
    indptr, indices = random_csc(3001, 40000, seed=12)
    seeds = np.random.default_rng(13).choice(3001, 150, replace=False)
    a = reference(indptr, indices, seeds, [6, 5, 4])
    b = reference_minimum_at(indptr, indices, seeds, [6, 5, 4])
    assert a.num_sampled_nodes[3] > 100 and sample_equal(a, b)


def test_frontier_not_reexpanded() -> None:
    # 0 <-> 1 and a self-loop on 1: with fanout -1 everywhere hop 1 expands only node 1.
    indptr = np.array([0, 1, 3], dtype=np.int64)
    indices = np.array([1, 0, 1], dtype=np.int64)
    b = NeighborSampler(indptr, indices, [-1, -1, -1], 1).sample(np.array([0]), 0)
    np.testing.assert_array_equal(b.n_id, [0, 1])
    np.testing.assert_array_equal(b.edge_index, [[1, 0, 1], [0, 1, 1]])
    np.testing.assert_array_equal(b.e_id, [0, 1, 2])
    assert b.num_sampled_edges == [1, 2, 0] and b.num_sampled_nodes == [1, 1, 0, 0]


def test_deterministic_across_threads_and_seeds() -> None:
    indptr, indices = random_csc(6007, 60000, seed=4)
    seeds = np.random.default_rng(5).choice(6007, 900, replace=False)
    fanouts = [5, 4, 3]
    runs = {t: NeighborSampler(indptr, indices, fanouts, t).sample(seeds, 11) for t in (1, 2, 7)}
    assert runs[1].num_sampled_nodes[1] > 1000  # frontiers wide enough to be split into chunks
    assert sample_equal(runs[1], runs[2]) and sample_equal(runs[1], runs[7])
    sampler = NeighborSampler(indptr, indices, fanouts, 2)
    assert sample_equal(sampler.sample(seeds, 11), runs[1])
    assert not sample_equal(sampler.sample(seeds, 12), runs[1])
    # int32 and int64 indices draw the same edge positions.
    wide = NeighborSampler(indptr, indices.astype(np.int64), fanouts, 2).sample(seeds, 11)
    assert sample_equal(wide, runs[1])


@pytest.mark.parametrize("threads", [1, 3])
def test_narrow_samples_are_the_wide_ones_in_int32(threads: int) -> None:
    """`narrow` gives int32 n_id and edge_index with the values of the int64 sample (frontiers wide enough
    that the output is written in parallel slices), with or without stopped nodes."""
    indptr, indices = random_csc(6007, 60000, seed=8)
    seeds = np.random.default_rng(9).choice(6007, 900, replace=False)
    sampler = NeighborSampler(indptr, indices, [5, 4, 3], threads)
    stop = np.arange(0, 6007, 7)
    for kw in ({}, {"stop": stop}, {"stop": stop, "last_hop": True}, {"stop": stop, "last_hop": True, "thin": 1}):
        wide = sampler.sample(seeds, 3, **kw)
        narrow = sampler.sample(seeds, 3, narrow=True, **kw)
        assert narrow.n_id.dtype == np.int32 and narrow.edge_index.dtype == np.int32
        assert narrow.e_id is not None and narrow.e_id.dtype == np.int32
        assert wide.n_id.dtype == np.int64 and narrow.edge_index.shape == wide.edge_index.shape
        assert sample_equal(narrow, wide)
        check_e_id(indptr, indices, narrow)
    empty = sampler.sample(np.zeros(0, np.int64), 3, narrow=True)
    assert empty.n_id.dtype == np.int32 and empty.n_id.shape == (0,) and empty.edge_index.shape == (2, 0)
    assert empty.e_id is not None and empty.e_id.dtype == np.int32 and empty.e_id.shape == (0,)


@pytest.mark.parametrize("narrow", [False, True], ids=["wide", "narrow"])
def test_e_id_is_the_same_whatever_the_thread_count(narrow: bool) -> None:
    """e_id, like the rest, is a pure function of (graph, seeds, fanouts, seed), for pruned samples too."""
    indptr, indices = random_csc(6007, 60000, seed=15)
    seeds = np.random.default_rng(16).choice(6007, 900, replace=False)
    stop = np.arange(3, 6007, 5)
    for kw in ({}, {"stop": stop}, {"stop": stop, "last_hop": True}, {"stop": stop, "last_hop": True, "thin": 2}):
        runs = [NeighborSampler(indptr, indices, [5, 4, 3], t).sample(seeds, 21, narrow=narrow, **kw)
                for t in (1, 2, 7)]
        assert runs[0].num_sampled_nodes[1] > 1000  # frontiers wide enough to be split into chunks
        check_e_id(indptr, indices, runs[0])
        assert all(sample_equal(r, runs[0]) and r.e_id.dtype == runs[0].e_id.dtype for r in runs[1:])


@pytest.mark.parametrize("num_edges", [2**31, 2**31 + 1], ids=["2^31", "2^31+1"])
def test_narrow_e_id_is_int32_while_edge_positions_fit(tmp_path, num_edges: int) -> None:
    """A narrow sample's e_id is int32 for a graph of up to 2**31 edges and int64 beyond (its node ids still
    fit int32). The graph: node 1's six in-edges close the CSC array, node 0 holds the rest; `indices` is a
    sparse file of zeros (every source is node 0), so only the pages read take memory."""
    path = tmp_path / "indices.bin"
    with open(path, "wb") as f:
        f.truncate(num_edges * 4)
    if path.stat().st_blocks * 512 >= 2**20:
        pytest.skip("this filesystem does not keep sparse files")
    indices = np.memmap(path, dtype=np.int32, mode="r", shape=(num_edges,))
    indptr = np.array([0, num_edges - 6, num_edges], dtype=np.int64)
    sampler = NeighborSampler(indptr, indices, [-1], 1)
    narrow, wide = sampler.sample(np.array([1]), 0, narrow=True), sampler.sample(np.array([1]), 0)
    positions = np.arange(num_edges - 6, num_edges)
    assert narrow.n_id.dtype == np.int32 and narrow.n_id.tolist() == [1, 0]
    assert narrow.e_id is not None and narrow.e_id.dtype == (np.int32 if num_edges <= 2**31 else np.int64)
    assert wide.e_id is not None and wide.e_id.dtype == np.int64
    np.testing.assert_array_equal(narrow.e_id, positions)
    np.testing.assert_array_equal(wide.e_id, positions)
    reference = numpy_sample(indptr, indices, np.array([1]), [-1], np.random.default_rng(0))
    np.testing.assert_array_equal(reference.e_id, positions)


def test_concurrent_calls_on_one_object() -> None:
    indptr, indices = random_csc(3001, 30000, seed=6)
    sampler = NeighborSampler(indptr, indices, [6, 6], 2)
    batches = [np.random.default_rng(i).choice(3001, 200, replace=False) for i in range(8)]
    expected = [sampler.sample(s, i) for i, s in enumerate(batches)]
    got: list[SampledBatch | None] = [None] * len(batches)

    def work(i: int) -> None:
        for _ in range(3):
            got[i] = sampler.sample(batches[i], i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(g is not None and sample_equal(g, e) for g, e in zip(got, expected))


def hub_graph(num_hubs: int, degree: int) -> tuple[np.ndarray, np.ndarray]:
    """Hubs 0..H-1, each with in-neighbours H..H+degree-1 (in that CSC order)."""
    indptr = np.arange(num_hubs + degree + 1, dtype=np.int64) * degree
    indptr[num_hubs + 1:] = num_hubs * degree
    indices = np.tile(np.arange(num_hubs, num_hubs + degree), num_hubs).astype(np.int64)
    return indptr, indices


def _draws(sample: Sampler, num_hubs: int, degree: int, fanout: int) -> np.ndarray:
    """[num_hubs, fanout] neighbour offsets drawn for each hub (one independent draw per hub)."""
    indptr, indices = hub_graph(num_hubs, degree)
    b = sample(indptr, indices, np.arange(num_hubs, dtype=np.int64), [fanout])
    assert b.edge_index.shape[1] == num_hubs * fanout
    return (b.n_id[b.edge_index[0]] - num_hubs).reshape(num_hubs, fanout)


@pytest.mark.parametrize("sample", SAMPLERS)
@pytest.mark.parametrize(("degree", "fanout"), [(40, 8), (100, 40)], ids=["floyd-scan", "floyd-marks"])
def test_uniform_marginals(sample: Sampler, degree: int, fanout: int) -> None:
    draws = _draws(sample, 3000, degree, fanout)
    assert (np.sort(draws, axis=1)[:, 1:] != np.sort(draws, axis=1)[:, :-1]).all()  # distinct per hub
    counts = np.bincount(draws.ravel(), minlength=degree)
    assert scipy.stats.chisquare(counts).pvalue > 1e-3


def test_uniform_over_seeds() -> None:
    # One node of degree 40, fanout 8, sampled under 2000 different seeds: the seed mixing alone
    # must give uniform draws.
    indptr, indices = hub_graph(1, 40)
    sampler = NeighborSampler(indptr, indices, [8], 1)
    draws = np.stack([sampler.sample(np.array([0]), seed).n_id[1:] - 1 for seed in range(2000)])
    counts = np.bincount(draws.ravel(), minlength=40)
    assert counts.sum() == 16000
    assert scipy.stats.chisquare(counts).pvalue > 1e-3


@pytest.mark.parametrize("sample", SAMPLERS)
def test_uniform_subsets(sample: Sampler) -> None:
    # 2 of 6: each of the 15 unordered pairs must be equally likely (joint, not just marginal).
    draws = np.sort(_draws(sample, 4500, 6, 2), axis=1)
    counts = np.bincount(draws[:, 0] * 6 + draws[:, 1], minlength=36)
    pairs = counts[np.triu_indices(6, 1)[0] * 6 + np.triu_indices(6, 1)[1]]
    assert pairs.sum() == 4500
    assert scipy.stats.chisquare(pairs).pvalue > 1e-3


def test_torch_tensors_zero_copy() -> None:
    indptr, indices = random_csc(777, 5000, seed=8)
    t_indptr, t_indices = torch.from_numpy(indptr), torch.from_numpy(indices)
    sampler = NeighborSampler(t_indptr, t_indices, [4, 3], 2)
    assert np.shares_memory(sampler.indices, indices) and np.shares_memory(sampler.indptr, indptr)
    seeds = torch.arange(0, 777, 13)
    got = sampler.sample(seeds, 3)
    assert sample_equal(got, NeighborSampler(indptr, indices, [4, 3], 1).sample(seeds.numpy(), 3))
    check_batch(indptr, indices, seeds.numpy(), [4, 3], got)
    check_batch(indptr, indices, seeds.numpy(), [4, 3], numpy_sample(t_indptr, t_indices, seeds, [4, 3],
                                                                    np.random.default_rng(0)))


def test_memmapped_graph(tmp_path) -> None:
    indptr, indices = random_csc(501, 3000, seed=9)
    np.save(tmp_path / "indptr.npy", indptr)
    np.save(tmp_path / "indices.npy", indices)
    mm = NeighborSampler(np.load(tmp_path / "indptr.npy", mmap_mode="r"),
                         np.load(tmp_path / "indices.npy", mmap_mode="r"), [3, 3], 2)
    seeds = np.arange(0, 501, 10, dtype=np.int32)  # narrower integer seeds are accepted
    assert sample_equal(mm.sample(seeds, 1), NeighborSampler(indptr, indices, [3, 3], 2).sample(seeds, 1))


GOOD_INDPTR = np.array([0, 2, 3, 5, 5], dtype=np.int64)
GOOD_INDICES = np.array([1, 2, 0, 0, 3], dtype=np.int32)


@pytest.mark.parametrize(("indptr", "indices", "match"), [
    (GOOD_INDPTR.astype(np.int32), GOOD_INDICES, "indptr: expected dtype int64, got int32"),
    (GOOD_INDPTR, GOOD_INDICES.astype(np.float32), "indices: expected dtype int32 or int64, got float32"),
    (GOOD_INDPTR, np.repeat(GOOD_INDICES, 2)[::2], "indices: expected a C-contiguous array"),
    (GOOD_INDPTR.reshape(1, -1), GOOD_INDICES, "indptr: expected a 1-D array"),
    (np.array([0, 3, 2, 5, 5]), GOOD_INDICES, r"indptr is not non-decreasing: indptr\[2\] = 2 < indptr\[1\] = 3"),
    (np.array([0, 2, 3, 5, 6]), GOOD_INDICES, r"indptr\[-1\] = 6 does not match len\(indices\) = 5"),
    (np.array([1, 2, 3, 5, 5]), GOOD_INDICES, r"indptr\[0\] must be 0"),
], ids=["indptr-int32", "indices-float", "non-contiguous", "2d", "not-monotone", "length", "start"])
def test_bad_graph(indptr: np.ndarray, indices: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        NeighborSampler(indptr, indices, [2])


@pytest.mark.parametrize(("seeds", "match"), [
    (np.array([1, 4]), r"seeds\[1\] = 4 is out of range \[0, 4\)"),
    (np.array([-1]), r"seeds\[0\] = -1 is out of range"),
    (np.array([2, 0, 2]), r"seeds\[2\] = 2 duplicates seeds\[0\]"),
    (np.array([0.0, 1.0]), "seeds: expected dtype int64, got float64"),
], ids=["too-big", "negative", "duplicate", "float"])
def test_bad_seeds(seeds: np.ndarray, match: str) -> None:
    sampler = NeighborSampler(GOOD_INDPTR, GOOD_INDICES, [2, 2], 2)
    with pytest.raises(ValueError, match=match):
        sampler.sample(seeds, 0)
    # The failed call left no trace: the next batch is sampled as if it were the first.
    assert sample_equal(sampler.sample(np.array([2, 0]), 5),
                         NeighborSampler(GOOD_INDPTR, GOOD_INDICES, [2, 2], 1).sample(np.array([2, 0]), 5))


@pytest.mark.parametrize("seeds", [np.array([1, 4]), np.array([2, 0, 2])], ids=["range", "duplicate"])
def test_bad_seeds_numpy(seeds: np.ndarray) -> None:
    with pytest.raises(ValueError, match="out of range|unique"):
        numpy_sample(GOOD_INDPTR, GOOD_INDICES, seeds, [2], np.random.default_rng(0))


def test_corrupt_indices_named() -> None:
    bad = GOOD_INDICES.copy()
    bad[3] = 9
    sampler = NeighborSampler(GOOD_INDPTR, bad, [-1], 1)
    with pytest.raises(ValueError, match=r"indices\[3\] = 9 is out of range \[0, 4\)"):
        sampler.sample(np.array([2]), 0)
    assert sampler.sample(np.array([0]), 0).n_id.tolist() == [0, 1, 2]


def test_corrupt_indices_while_threads_run() -> None:
    # The fault surfaces in the ordered merge of the last chunk while other threads sample: all
    # are joined, the error names the edge, and the sampler is left clean for the next batch.
    indptr, indices = random_csc(5003, 80000, seed=14, dtype=np.int64)
    bad = indices.copy()
    bad[-1] = -7  # an in-edge of node 5002 (the last node has in-edges in this graph)
    assert indptr[-2] < indptr[-1]
    broken = NeighborSampler(indptr, bad, [-1], 4)
    seeds = np.arange(5003)
    with pytest.raises(ValueError, match=rf"indices\[{indices.size - 1}\] = -7 is out of range"):
        broken.sample(seeds, 0)
    clean = NeighborSampler(indptr, indices, [-1], 4)
    assert sample_equal(broken.sample(seeds[:-1], 1), clean.sample(seeds[:-1], 1))


@pytest.mark.parametrize(("fanouts", "match"), [
    ([], "fanouts: needs at least one hop"),
    ([3, -2], "fanouts: hop 1: -2 must be >= 0, or -1"),
    ([2.5], "fanouts: hop 0: 2.5 is not an integer"),
], ids=["empty", "below-minus-one", "float"])
def test_bad_fanouts(fanouts: list, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        NeighborSampler(GOOD_INDPTR, GOOD_INDICES, fanouts)
    with pytest.raises(ConfigError, match=match):
        numpy_sample(GOOD_INDPTR, GOOD_INDICES, np.array([0]), fanouts, np.random.default_rng(0))


def test_bad_numpy_dedup() -> None:
    with pytest.raises(ConfigError, match="dedup: 'hash' is not one of"):
        numpy_sample(GOOD_INDPTR, GOOD_INDICES, np.array([0]), [1], np.random.default_rng(0), dedup="hash")


def test_empty_batch_and_zero_degree_seeds() -> None:
    sampler = NeighborSampler(GOOD_INDPTR, GOOD_INDICES, [2, 2], 2)
    empty = sampler.sample(np.zeros(0, dtype=np.int64), 0)
    assert empty.n_id.size == 0 and empty.edge_index.shape == (2, 0)
    assert empty.e_id is not None and empty.e_id.dtype == np.int64 and empty.e_id.shape == (0,)
    assert empty.num_sampled_nodes == [0, 0, 0] and empty.num_sampled_edges == [0, 0]
    lonely = sampler.sample(np.array([3]), 0)  # node 3 has no in-neighbours
    assert lonely.n_id.tolist() == [3] and lonely.edge_index.shape == (2, 0)


def test_bench_sampler_small(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from diskflow.bench import sampler as bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    figures = bench.run(parser.parse_args(["--nodes", "3001", "--batch-size", "64", "--batches", "3",
                                           "--numpy-batches", "2", "--threads", "2", "--fanouts", "4,3"]))
    assert figures["nodes"] == 3001 and figures["fanouts"] == [4, 3] and figures["threads"] == 2
    assert figures["native_edges_per_s"] > 0 and figures["speedup"] > 0
    assert "numpy (np.unique dedup)" in capsys.readouterr().out
    indptr, indices = bench.generate_graph(3001, 15.0, 0)
    assert indices.dtype == np.int32 and indptr[-1] == indices.size
    assert abs(indices.size / 3001 - 15.0) < 1.5 and np.diff(indptr).max() > 60  # heavy-tailed in-degrees
