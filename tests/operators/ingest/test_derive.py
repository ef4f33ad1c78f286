"""Derived features without Dask: each task's rows against a dense numpy mean, its memory against its share."""
from __future__ import annotations

import itertools
import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from diskflow.operators.ingest.derive import derive_jobs, derive_rows, rewritten_files, task_ranges
from typed_derive import TypedStore, read_table, typed_store

from diskflow.errors import ConfigError, InputError


def _run(store: TypedStore, share: int) -> int:
    """Every task of every rule, in the order `derive_jobs` gives; the number of tasks."""
    tasks = 0
    for job in derive_jobs(store.path, store.manifest, store.rules):
        for lo, hi in task_ranges(job, share):
            derive_rows(job, lo, hi, share)
            tasks += 1
    return tasks


def _tol(dtype: str) -> dict[str, float]:
    return {"rtol": 1e-6, "atol": 1e-6} if dtype == "float32" else {"rtol": 1e-3, "atol": 1e-3}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_derived_rows_are_the_neighbours_mean_and_the_rest_is_untouched(tmp_path: Path, dtype: str) -> None:
    store = typed_store(tmp_path, dtype=dtype)
    tasks = _run(store, 8 << 10)
    assert tasks > 4
    got = read_table(store)
    np.testing.assert_allclose(got.astype(np.float64), store.expected.astype(np.float64), **_tol(dtype))
    papers = store.manifest["hetero"]["node_types"][0]["count"]
    np.testing.assert_array_equal(got[:papers], store.before[:papers])     # the neighbours' rows: as written
    assert not got[:, 5:].any()                                             # the padding: zero
    a_ptr = np.load(tmp_path / "hetero/author-ptr.npy")
    lonely = papers + np.flatnonzero(np.diff(a_ptr) == 0)
    assert len(lonely) > 2 and not got[lonely].any()                        # authors without papers: zero rows
    assert got[papers:, :5].any(axis=1).sum() > len(got[papers:]) // 2


def test_the_chain_is_ordered_whatever_the_rules_order(tmp_path: Path) -> None:
    store = typed_store(tmp_path)
    jobs = derive_jobs(store.path, store.manifest, store.rules)
    assert [(j.type, j.after) for j in jobs] == [("author", None), ("institution", "author")]
    assert rewritten_files(jobs) == [f"features/part-{p:05d}.npy" for p in range(3, 8)]   # rows 157..390


def test_tasks_cut_rows_and_edges_within_their_share(tmp_path: Path) -> None:
    store = typed_store(tmp_path)
    job = derive_jobs(store.path, store.manifest, store.rules)[0]
    per_row = job.costs(4)[0]
    ranges = task_ranges(job, 8 << 10)
    assert ranges[0][0] == 0 and ranges[-1][1] == job.count
    assert all(b == c for (_, b), (c, _) in itertools.pairwise(ranges))
    assert max(hi - lo for lo, hi in ranges) <= (8 << 10) // 2 // per_row
    assert task_ranges(job, 1 << 30) == [(0, job.count)]
    with pytest.raises(ConfigError, match="memory_budget.*needs at least"):
        task_ranges(job, job.min_share() - 1)


def test_a_task_allocates_within_its_share(tmp_path: Path) -> None:
    """A 2 MiB table, 64 KiB tasks: the peak of what numpy allocates in the largest task stays under the share
    (tracemalloc sees numpy's allocations; the memmaps' pages are the kernel's)."""
    share = 64 << 10
    store = typed_store(tmp_path, papers=20000, authors=10000, institutions=2768, dim=12, table_dim=16,
                        shard_rows=4096)
    assert store.expected.nbytes == 2 << 20
    jobs = derive_jobs(store.path, store.manifest, store.rules)
    peaks = []
    for job in jobs:
        ranges = task_ranges(job, share)
        assert len(ranges) > 20
        ptr = np.load(tmp_path / job.indptr)
        for lo, hi in ranges:
            tracemalloc.start()
            try:
                derive_rows(job, lo, hi, share)
                peaks.append((tracemalloc.get_traced_memory()[1], int(ptr[hi] - ptr[lo])))
            finally:
                tracemalloc.stop()
    assert max(p for p, _ in peaks) <= share, max(peaks)
    assert max(e for _, e in peaks) > 2 * (share // 2 // jobs[0].costs(4)[1])    # tasks of several edge chunks
    np.testing.assert_allclose(read_table(store), store.expected, rtol=1e-6, atol=1e-6)


def test_bad_rules_and_arrays_are_refused(tmp_path: Path) -> None:
    store = typed_store(tmp_path)
    author, inst = store.rules[1], store.rules[0]
    with pytest.raises(ConfigError, match="reduce is 'sum'"):
        derive_jobs(store.path, store.manifest, [replace(author, reduce="sum")])
    with pytest.raises(ConfigError, match="derived by two rules"):
        derive_jobs(store.path, store.manifest, [author, author])
    with pytest.raises(ConfigError, match="cycle"):
        derive_jobs(store.path, store.manifest, [replace(author, neighbour="institution"), inst])
    with pytest.raises(InputError, match="unknown node type 'venue'"):
        derive_jobs(store.path, store.manifest, [replace(author, type="venue")])
    with pytest.raises(InputError, match="institution-ptr.npy: has 24 entries, expected 212"):
        derive_jobs(store.path, store.manifest, [replace(author, indptr=inst.indptr, indices=inst.indices)])
    with pytest.raises(InputError, match="derived features need a typed store"):
        derive_jobs(store.path, {**store.manifest, "hetero": None}, [author])
    idx = np.load(tmp_path / author.indices)
    idx[-1] = 157
    np.save(tmp_path / author.indices, idx)
    job = derive_jobs(store.path, store.manifest, [author])[0]
    with pytest.raises(InputError, match=r"author-idx.npy: neighbour id 157 among edges .* outside node type 'paper'"):
        derive_rows(job, 0, job.count, 1 << 20)
