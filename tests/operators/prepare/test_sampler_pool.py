"""Samplers leased from the process's pool: reused for the same store, fanouts and threads only,
never kept after a failure, no more kept than were leased at once, and giving what a fresh sampler
gives."""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from diskflow.operators.formats.store import Store
from diskflow.operators.formats.storecheck import CHECKSUMS, record_checksums
from diskflow.operators.prepare import sampler_pool
from diskflow.operators.prepare.sample import NeighborSampler
from diskflow.operators.prepare.sampler_pool import drop_idle_samplers, idle_samplers, leased_sampler
from diskflow.operators.prepare.superbatch import round_layout, sample_superbatch_records


@pytest.fixture(autouse=True)
def empty_pool() -> Iterator[None]:
    drop_idle_samplers()
    yield
    drop_idle_samplers()


def _sample(pooled: sampler_pool.PooledSampler, seed: int) -> tuple[np.ndarray, np.ndarray]:
    s = pooled.sampler.sample(pooled.split_ids("train")[:37], seed)
    return np.asarray(s.n_id), np.asarray(s.edge_index)


def test_a_returned_sampler_serves_the_next_lease_and_samples_like_a_fresh_one(tiny_store: Path) -> None:
    with leased_sampler(tiny_store, [4, 3], 1) as first:
        a = _sample(first, 11)
    assert idle_samplers() == 1
    with leased_sampler(tiny_store, [4, 3], 1) as second:
        assert second is first
        assert idle_samplers() == 0                       # leased: no other task gets it meanwhile
        b = _sample(second, 12)
    st = Store(tiny_store)
    fresh = NeighborSampler(st.indptr, st.indices, [4, 3], num_threads=1)
    for got, seed in ((a, 11), (b, 12)):
        want = fresh.sample(st.split_ids("train")[:37], seed)
        np.testing.assert_array_equal(got[0], want.n_id)
        np.testing.assert_array_equal(got[1], want.edge_index)


def test_other_fanouts_or_threads_get_their_own_sampler(tiny_store: Path) -> None:
    with leased_sampler(tiny_store, [4, 3], 1) as a:
        pass
    with leased_sampler(tiny_store, [4], 1) as b, leased_sampler(tiny_store, [4, 3], 2) as c:
        assert b is not a and b.sampler.fanouts == [4]
        assert c is not a and c is not b and c.sampler.num_threads == 2
    with leased_sampler(tiny_store, [4, 3], 2) as again:      # two leased at once: two kept, b and c
        assert again is c
    with leased_sampler(tiny_store, [4], 1) as again:
        assert again is b


def test_concurrent_leases_get_different_samplers_and_as_many_are_kept(tiny_store: Path) -> None:
    with leased_sampler(tiny_store, [4, 3], 1) as a, leased_sampler(tiny_store, [4, 3], 1) as b, \
            leased_sampler(tiny_store, [4, 3], 1) as c:
        assert len({id(a), id(b), id(c)}) == 3
    assert idle_samplers() == 3                     # three sampled at once: three are kept
    with leased_sampler(tiny_store, [4, 3], 1) as d, leased_sampler(tiny_store, [4, 3], 1) as e:
        assert {id(d), id(e)} == {id(a), id(b)}     # given back c, b, a: the most recently returned first
    assert drop_idle_samplers() == 3 and idle_samplers() == 0


def test_no_more_are_kept_than_were_leased_at_once(tiny_store: Path) -> None:
    for fanouts in ([4, 3], [4], [2, 2], [3]):      # one at a time: one kept, the last returned
        with leased_sampler(tiny_store, fanouts, 1) as last:
            pass
    assert idle_samplers() == 1
    with leased_sampler(tiny_store, [3], 1) as again:
        assert again is last
    with leased_sampler(tiny_store, [4], 1), leased_sampler(tiny_store, [2, 2], 1):
        pass
    assert idle_samplers() == 2
    drop_idle_samplers()                            # and the count starts again
    with leased_sampler(tiny_store, [4], 1):
        pass
    with leased_sampler(tiny_store, [2, 2], 1):
        pass
    assert idle_samplers() == 1


def test_a_sampler_whose_task_failed_is_not_kept(tiny_store: Path) -> None:
    with pytest.raises(ValueError, match="out of range"), leased_sampler(tiny_store, [4, 3], 1) as pooled:
        pooled.sampler.sample(np.array([10 ** 9]), 1)
    assert idle_samplers() == 0


def test_a_store_replaced_at_the_same_path_gets_a_new_sampler(tiny_store: Path, tmp_path: Path) -> None:
    path = tmp_path / "store"
    shutil.copytree(tiny_store, path)
    with leased_sampler(path, [4, 3], 1) as old:
        before = _sample(old, 5)
    # re-ingest in miniature: every node's in-neighbours reversed, the manifest (with the checksums of what
    # was written) rewritten last
    st = Store(path)
    indptr, indices = np.asarray(st.indptr), np.array(st.indices)
    for v in range(st.num_nodes):
        indices[indptr[v]:indptr[v + 1]] = indices[indptr[v]:indptr[v + 1]][::-1].copy()
    rel = st.manifest["topology"]["indices"]
    np.save(path / "indices.tmp.npy", indices)
    os.replace(path / "indices.tmp.npy", path / rel)
    manifest = record_checksums(path, {k: v for k, v in st.manifest.items() if k != CHECKSUMS}, [])
    (path / "manifest.tmp").write_text(json.dumps(manifest))
    os.replace(path / "manifest.tmp", path / "manifest.json")

    with leased_sampler(path, [4, 3], 1) as new:
        assert new is not old
        after = _sample(new, 5)
    fresh = NeighborSampler(indptr, indices, [4, 3], num_threads=1)
    want = fresh.sample(st.split_ids("train")[:37], 5)
    np.testing.assert_array_equal(after[0], want.n_id)
    np.testing.assert_array_equal(after[1], want.edge_index)
    assert not np.array_equal(before[1], after[1])


def test_split_ids_are_shared_read_only(tiny_store: Path) -> None:
    with leased_sampler(tiny_store, [4, 3], 1) as pooled:
        ids = pooled.split_ids("train")
        assert pooled.split_ids("train") is ids
        np.testing.assert_array_equal(ids, Store(tiny_store).split_ids("train"))
        with pytest.raises(ValueError, match="read-only"):
            ids[0] = 1


def test_superbatch_sampling_leases_and_matches_a_fresh_process_pool(tiny_store: Path) -> None:
    refs = round_layout(Store(tiny_store).split_ids("train").shape[0], 64, 2, 1)
    first, _, _ = sample_superbatch_records(tiny_store, refs[0], 64, [5, 3], 3, 1)
    assert idle_samplers() == 1
    again, _, _ = sample_superbatch_records(tiny_store, refs[0], 64, [5, 3], 3, 1)   # the pooled sampler
    drop_idle_samplers()
    fresh, _, _ = sample_superbatch_records(tiny_store, refs[0], 64, [5, 3], 3, 1)   # a new one
    assert [r.to_pydict() for r in first] == [r.to_pydict() for r in again] == [r.to_pydict() for r in fresh]
