"""The native batch router (`kernels.route_batch` through `route._translate`) against its numpy reference."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from diskflow.operators.prepare.route import _translate, translate_numpy

SHARD_ROWS, SHARDS = 97, 11


def _batch(rng: np.random.Generator, n: int, dtype: type) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A batch of n distinct ids and a plan of it: GPU, CPU and missed positions, misses numbered in order."""
    n_id = rng.choice(SHARD_ROWS * SHARDS, size=n, replace=False).astype(dtype)
    src = rng.integers(0, 3, n).astype(np.uint8)
    idx = rng.integers(0, 50, n).astype(np.int64)
    miss = src == 2
    idx[miss] = np.arange(int(miss.sum()))
    return n_id, src, idx


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("layout", [False, True])
def test_native_routing_equals_the_numpy_reference(dtype: type, layout: bool) -> None:
    """Same (src, idx, counts per shard, packed ids) as numpy, for int32 and int64 ids, with every miss packed
    or a disk-cache layout holding some of them and ranking the rest in a shuffled order; empty batches too."""
    rng = np.random.default_rng(7)
    for n in (0, 1, 5, 300, 1000):
        n_id, src, idx = _batch(rng, n, dtype)
        m = int((src == 2).sum())
        lay = None
        if layout:
            in_cache = rng.random(m) < 0.3
            row = np.empty(m, np.int64)
            row[in_cache] = rng.integers(0, 10_000, int(in_cache.sum()))
            row[~in_cache] = rng.permutation(int((~in_cache).sum()))
            lay = (in_cache, row)
        got = _translate(n_id, src, idx, lay, SHARD_ROWS, SHARDS, "b")
        want = translate_numpy(n_id.astype(np.int64), src, idx, lay, SHARD_ROWS, SHARDS, "b")
        for g, w, name in zip(got, want, ("src", "idx", "counts", "ids")):
            assert g.dtype == w.dtype and np.array_equal(g, w), (n, name)



@pytest.mark.parametrize(("shard_rows", "shards"), [(1, 40), (3, 17), (1_000_003, 9), (2**31 - 1, 5), (2**26 + 1, 1000),
                                                    (3 * 2**33 + 1, 2000), (828_496_424_670, 4000),
                                                    (2**50 - 3, 8)])
def test_native_routing_places_every_shard_boundary_like_integer_division(shard_rows: int, shards: int) -> None:
    """The native router finds a node's shard by a multiply and a correction below 2^52 ids (a division above):
    every id on either side of the boundaries, up to ids past 2^52, lands where id // shard_rows says. With
    3 * 2^33 + 1 or 828,496,424,670 rows a shard, the product alone puts a boundary's first id in the shard before."""
    bounds = np.unique(np.linspace(1, shards - 1, num=min(shards - 1, 64), dtype=np.int64)) * shard_rows
    n_id = np.unique(np.concatenate([bounds - 1, bounds, [0, shard_rows * shards - 1]]))
    n_id = n_id[(n_id >= 0) & (n_id < shard_rows * shards)]
    if shard_rows > 2**45:
        assert n_id.max() >= 2**52 > n_id[n_id < 2**52].max() > 2**51     # both paths, near where they meet
    src = np.full(n_id.shape[0], 2, np.uint8)
    idx = np.arange(n_id.shape[0], dtype=np.int64)
    got = _translate(n_id, src, idx, None, shard_rows, shards, "b")
    want = translate_numpy(n_id, src, idx, None, shard_rows, shards, "b")
    for g, w, name in zip(got, want, ("src", "idx", "counts", "ids")):
        assert g.dtype == w.dtype and np.array_equal(g, w), name
    assert np.array_equal(np.repeat(np.arange(shards), got[2]), np.sort(n_id) // shard_rows)

def test_native_routing_names_the_batch_and_the_fault() -> None:
    """Each fault numpy's router reports is reported in the same words, after the batch's name."""
    rng = np.random.default_rng(3)
    n_id, src, idx = _batch(rng, 200, np.int64)
    miss = np.flatnonzero(src == 2)
    bad = idx.copy()
    bad[miss[[0, 1]]] = bad[miss[[1, 0]]]
    with pytest.raises(ValueError, match=r"^batch 4: the plan's miss numbers are not 0..k-1 in n_id order"):
        _translate(n_id, src, bad, None, SHARD_ROWS, SHARDS, "batch 4")
    with pytest.raises(ValueError, match=r"^batch 4: the layout lists 1 misses, the plan"):
        _translate(n_id, src, idx, (np.zeros(1, bool), np.zeros(1, np.int64)), SHARD_ROWS, SHARDS, "batch 4")
    twice = (np.zeros(miss.size, bool), np.zeros(miss.size, np.int64))
    with pytest.raises(ValueError, match=r"^batch 4: the layout's packed rows are not numbered 0\.\."):
        _translate(n_id, src, idx, twice, SHARD_ROWS, SHARDS, "batch 4")
    outside = n_id.copy()
    outside[miss[3]] = SHARD_ROWS * SHARDS
    with pytest.raises(ValueError, match=r"^batch 4: packed node id outside the store's 11 shards"):
        _translate(outside, src, idx, None, SHARD_ROWS, SHARDS, "batch 4")
    outside[miss[3]] = -1
    with pytest.raises(ValueError, match=r"outside the store's 11 shards"):
        _translate(outside, src, idx, None, SHARD_ROWS, SHARDS, "batch 4")


def test_routing_file_reads_each_shard_from_its_ids_file_and_names_a_missing_one(tmp_path: Path) -> None:
    """A routing file keeps the packed ids in a plain .npy beside it: every shard's slice comes back as routed
    (each batch's ids of that shard, batch-major), and a missing or short ids file is an InputError naming it."""
    from diskflow.operators.formats.plan import BatchPlan
    from diskflow.operators.prepare.route import RouteFile, ids_path, route_superbatch

    from diskflow.errors import InputError

    rng = np.random.default_rng(11)
    batches = [_batch(rng, n, np.int32) for n in (300, 0, 450)]
    plans = [BatchPlan(src, idx, np.zeros(0, np.int64), np.zeros(0, np.int64)) for _, src, idx in batches]
    out = tmp_path / "e0-s00000.npz"
    routed = route_superbatch("e0-s00000", [b[0] for b in batches], plans, None, 0, SHARD_ROWS, SHARDS, out)
    assert ids_path(out).is_file()
    want = [_translate(n, s, i, None, SHARD_ROWS, SHARDS, "b") for n, s, i in batches]
    rf = RouteFile(out)
    try:
        assert np.array_equal(rf.seg_rows, routed["seg_rows"])
        for p in range(SHARDS):
            expect = np.concatenate([ids[np.sum(c[:p]):np.sum(c[:p + 1])] for _, _, c, ids in want])
            assert np.array_equal(rf.shard_ids(p), expect)
    finally:
        rf.close()
    np.save(ids_path(out), np.zeros(3, np.int32))
    with pytest.raises(InputError, match=r"e0-s00000\.ids\.npy.*packed ids"):
        RouteFile(out).shard_ids(0)
    ids_path(out).unlink()
    with pytest.raises(InputError, match=r"e0-s00000\.ids\.npy.*unreadable"):
        RouteFile(out).shard_ids(0)
