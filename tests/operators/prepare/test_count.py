"""Access counting: per-superbatch counts (dense and sorting paths) and their tree merge."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from diskflow.operators.formats.samples import record_batch, write_samples
from diskflow.operators.prepare.count import count_superbatch, dense_counts, merge_counts


def _superbatch(path: Path, n_ids: list[np.ndarray]) -> Path:
    recs = [record_batch(i, SimpleNamespace(n_id=n, edge_index=np.zeros((2, 0), np.int64), num_sampled_nodes=[len(n)],
                                            num_sampled_edges=[], batch_size=len(n))) for i, n in enumerate(n_ids)]
    write_samples(path, recs)
    return path


def test_counts_match_a_bincount_reference_on_both_paths(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    n_ids = [rng.choice(997, size=s, replace=False).astype(np.int64) for s in (5, 300, 71)]
    path = _superbatch(tmp_path / "e0-s00000.arrow", n_ids)
    ref = np.bincount(np.concatenate(n_ids), minlength=997)
    # ids bound by the largest id, by N (both count in a dense array), by a far larger N (sorted instead)
    for ids, counts in (count_superbatch(path), count_superbatch(path, num_nodes=997),
                        count_superbatch(path, num_nodes=10**9)):
        assert ids.dtype == counts.dtype == np.int64
        assert np.array_equal(ids, np.flatnonzero(ref)) and np.array_equal(counts, ref[ids])
        assert np.array_equal(dense_counts((ids, counts), 997), ref)


def test_merge_of_sorted_parts_equals_the_sum() -> None:
    rng = np.random.default_rng(5)
    parts, ref = [], np.zeros(2000, np.int64)
    for n in (0, 1, 400, 1500, 37):
        ids, counts = np.unique(rng.integers(0, 2000, n), return_counts=True)
        parts.append((ids.astype(np.int64), counts.astype(np.int64)))
        ref[ids] += counts
    # pairwise, as the count-merge tree does, and all at once
    tree = parts
    while len(tree) > 1:
        tree = [merge_counts(*tree[i:i + 2]) for i in range(0, len(tree), 2)]
    for ids, counts in (tree[0], merge_counts(*parts)):
        assert np.array_equal(ids, np.flatnonzero(ref)) and np.array_equal(counts, ref[ids])
    empty = merge_counts((np.zeros(0, np.int64), np.zeros(0, np.int64)))
    assert empty[0].size == 0 and empty[1].size == 0


def test_superbatch_counts_dense_or_sparse_and_their_sums_agree() -> None:
    """The graph's counts: dense where a superbatch reads a large share of the nodes, sparse otherwise; any
    mix adds up to the bincount of everything, and both forms convert back exactly."""
    import pytest
    from diskflow.operators.prepare.count import add_counts, as_sparse, superbatch_counts

    rng = np.random.default_rng(11)
    n = 1000
    wide = [rng.choice(n, size=200, replace=False).astype(t) for t in (np.int32, np.int64)]    # 400 >= n / 4
    narrow = [rng.choice(n, size=30, replace=False).astype(np.int64)]                         # 30 < n / 4
    a, b = superbatch_counts(wide, n), superbatch_counts(narrow, n)
    assert isinstance(a, np.ndarray) and a.shape == (n,) and a.dtype == np.uint8      # 2 batches: at most 2 each
    assert isinstance(b, tuple)
    ref = np.bincount(np.concatenate([*wide, *narrow]), minlength=n)
    assert np.array_equal(dense_counts(add_counts(a, b), n), ref)
    assert np.array_equal(dense_counts(add_counts(b, a), n), ref)
    assert np.array_equal(dense_counts(add_counts(add_counts(a, a), b), n), ref + np.bincount(np.concatenate(wide), minlength=n))
    assert np.array_equal(dense_counts(add_counts(b, b), n), 2 * np.bincount(narrow[0], minlength=n))
    ids, counts = as_sparse(add_counts(a, b))
    assert np.array_equal(ids, np.flatnonzero(ref)) and np.array_equal(counts, ref[ids])
    assert a is not add_counts(a, b) and np.array_equal(a, np.bincount(np.concatenate(wide), minlength=n))  # inputs kept
    with pytest.raises(ValueError, match=r"node id 1000 at position 1 is outside \[0, 1000\)"):
        superbatch_counts([np.array([1, 1000] * 200)], n)
    with pytest.raises(ValueError, match="node id -1 at position 0 is outside"):
        superbatch_counts([np.arange(300, dtype=np.int32), np.array([-1] * 300, np.int32)], n)
    with pytest.raises(ValueError, match="expected integer node ids, got dtype float64"):
        superbatch_counts([np.array([0.9, 1.7] * 200)], n)                                   # never truncated
    strided = np.arange(2 * n, dtype=np.int64)[::2] // 2                                     # not contiguous
    assert np.array_equal(superbatch_counts([strided], n), np.ones(n))


def test_dense_sums_widen_before_int32_overflows() -> None:
    """Two int32 counts whose sum could pass 2^31 - 1 add in int64; below that they stay int32."""
    from diskflow.native import kernels
    from diskflow.operators.prepare.count import add_counts

    big = np.array([2**31 - 10, 5, 0], np.int32)
    assert add_counts(big, np.array([9, 1, 0], np.int32)).dtype == np.int32
    s = add_counts(big, np.array([10, 1, 0], np.int32))
    assert s.dtype == np.int64 and s[0] == 2**31
    assert add_counts(big, (np.array([0]), np.array([10]))).tolist() == [2**31, 5, 0]     # dense + sparse: int64
    assert add_counts(big, (np.array([0]), np.array([9]))).dtype == np.int32                # ... int32 where it fits
    # a 16-bit dense count plus a sparse one (a short last superbatch) stays int32, with no scan for its maximum
    u16 = np.array([65535, 7, 0], np.uint16)
    s = add_counts(u16, (np.array([0, 2]), np.array([3, 1], np.int64)))
    assert s.dtype == np.int32 and s.tolist() == [65538, 7, 1] and u16.tolist() == [65535, 7, 0]
    assert add_counts((np.array([1]), np.array([2**31], np.int64)), u16).dtype == np.int64
    out = np.array([2**31 - 1, 0], np.int32)
    with pytest.raises(OverflowError):
        kernels.count_dense([np.array([0], np.int32)], out)


def test_narrow_counts_widen_as_their_sums_grow() -> None:
    """A superbatch's dense counts are uint8 (a node at most once per batch); merging them widens to uint16,
    then int32, so no sum wraps. Ids repeated within a batch, past 255, are counted again in int32."""
    from diskflow.native import kernels
    from diskflow.operators.prepare.count import add_counts, superbatch_counts

    n = 8
    full = superbatch_counts([np.arange(n, dtype=np.int32)] * 3, n)
    assert full.dtype == np.uint8 and full.tolist() == [3] * n
    top = np.full(n, 255, np.uint8)
    s = add_counts(top, top)
    assert s.dtype == np.uint16 and s.tolist() == [510] * n
    s = add_counts(np.full(n, 65535, np.uint16), top)
    assert s.dtype == np.int32 and s.tolist() == [65790] * n
    assert add_counts(s, full).dtype == np.int32 and add_counts(s, full).tolist() == [65793] * n
    repeated = superbatch_counts([np.zeros(300, np.int64)], n)                      # not unique: 300 > 255
    assert repeated.dtype == np.int32 and repeated.tolist() == [300] + [0] * (n - 1)
    with pytest.raises(OverflowError, match="pass 255"):
        kernels.count_dense([np.zeros(256, np.int32)], np.zeros(n, np.uint8))
    with pytest.raises(ValueError, match="expected dtype uint8, uint16 or int32, got int64"):
        kernels.count_dense([np.zeros(2, np.int32)], np.zeros(n, np.int64))


def test_saved_counts_come_back_in_the_form_they_were_written(tmp_path: Path) -> None:
    """`save_counts` keeps dense counts dense (int32 where they fit) and sparse ones sparse; `load_counts`
    gives back the same counts either way, and names a file that holds neither form."""
    from diskflow.operators.prepare.count import load_counts, save_counts

    from diskflow.errors import InputError

    dense = np.array([0, 3, 0, 2**31 - 1, 1], np.int64)
    save_counts(tmp_path / "d.npz", dense)
    back = load_counts(tmp_path / "d.npz")
    assert isinstance(back, np.ndarray) and back.dtype == np.int32 and back.tolist() == dense.tolist()
    sparse = (np.array([1, 3, 4], np.int64), np.array([3, 2**40, 1], np.int64))
    save_counts(tmp_path / "s.npz", sparse)
    ids, counts = load_counts(tmp_path / "s.npz")
    assert ids.dtype == counts.dtype == np.int64 and ids.tolist() == [1, 3, 4] and counts.tolist() == [3, 2**40, 1]
    assert dense_counts((ids, counts), 5).tolist() == [0, 3, 0, 2**40, 1]
    np.savez(tmp_path / "x.npz", other=np.zeros(2))
    with pytest.raises(InputError, match="x.npz.*'dense' or 'ids' and 'counts'"):
        load_counts(tmp_path / "x.npz")
