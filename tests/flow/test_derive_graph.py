"""Derived features as a Dask graph: many small tasks over a table far larger than the budget, chained by type."""
from __future__ import annotations

from pathlib import Path

import dask
import numpy as np
import pytest
from dask.core import get_dependencies
from dask.utils import key_split
from diskflow.flow.derive import derive_features, derive_graph, worker_threads
from task_keys import TaskKeys
from typed_derive import read_table, typed_store

from diskflow.errors import ConfigError

BIG = {"papers": 20000, "authors": 10000, "institutions": 2768, "dim": 12, "table_dim": 16, "shard_rows": 4096}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_table_larger_than_the_budget_is_derived_exactly_in_many_tasks(tmp_path: Path, sync_dask: None,
                                                                         dtype: str) -> None:
    store = typed_store(tmp_path, dtype=dtype, **BIG)
    assert store.expected.nbytes >= (1 << 20) and worker_threads() == 1
    with TaskKeys() as keys:
        seconds = derive_features(tmp_path, store.manifest, store.rules, 64 << 10)
    assert seconds > 0
    assert keys.groups() == {"derive-author", "derive-author-done", "derive-institution"}
    assert sum(key_split(k) == "derive-author" for k in keys.keys) > 100
    assert sum(key_split(k) == "derive-institution" for k in keys.keys) > 20
    first_inst = min(i for i, k in enumerate(keys.keys) if k.startswith("derive-institution"))
    assert all(k.startswith("derive-institution") for k in keys.keys[first_inst:])     # authors all done first
    assert keys.keys[first_inst - 1].startswith("derive-author-done-")
    tol = 1e-6 if dtype == "float32" else 1e-3
    np.testing.assert_allclose(read_table(store).astype(np.float64), store.expected.astype(np.float64),
                               rtol=tol, atol=tol)


def test_a_chained_rule_waits_for_every_task_of_the_rule_it_reads(tmp_path: Path) -> None:
    store = typed_store(tmp_path)
    tasks = derive_graph(tmp_path, store.manifest, store.rules, 16 << 10, threads=2, token="t0")
    graph = dict(dask.delayed(tasks).__dask_graph__())
    authors = {k for k in graph if key_split(k) == "derive-author"}
    insts = [k for k in graph if key_split(k) == "derive-institution"]
    assert len(authors) > 1 and len(insts) > 1 and "derive-author-0-t0" in authors
    rules = {"derive-author-rule-t0", "derive-institution-rule-t0"}
    assert {k for k in graph if key_split(k).endswith("-rule")} == rules    # each rule once, as data
    for k in insts:     # an institution task reads its rule and waits for the authors' barrier ...
        assert get_dependencies(graph, k) == {"derive-author-done-t0", "derive-institution-rule-t0"}
    assert get_dependencies(graph, "derive-author-done-t0") == authors      # ... which waits for every author task
    for k in authors:
        assert get_dependencies(graph, k) == {"derive-author-rule-t0"}
    # the share is the budget over the threads: twice the threads, about twice the tasks
    more = derive_graph(tmp_path, store.manifest, store.rules, 16 << 10, threads=4, token="t1")
    assert len(more) > 1.5 * len(tasks)


def test_the_threaded_scheduler_and_a_client(tmp_path: Path) -> None:
    from distributed import Client, LocalCluster, get_task_stream

    store = typed_store(tmp_path / "a", **BIG)
    derive_features(tmp_path / "a", store.manifest, store.rules, "256KiB")
    np.testing.assert_allclose(read_table(store), store.expected, rtol=1e-6, atol=1e-6)
    other = typed_store(tmp_path / "b", seed=3)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        assert worker_threads(client) == 2
        with get_task_stream(client) as stream:
            derive_features(tmp_path / "b", other.manifest, other.rules, 64 << 10, client=client)
        # (on a cluster the rules, data in the graph, are keys of their own)
        assert {key_split(t["key"]) for t in stream.data} == {"derive-author", "derive-author-done",
                                                              "derive-institution", "derive-author-rule",
                                                              "derive-institution-rule"}
    np.testing.assert_allclose(read_table(other), other.expected, rtol=1e-6, atol=1e-6)


def test_a_budget_too_small_for_one_row_is_refused_before_anything_runs(tmp_path: Path, sync_dask: None) -> None:
    store = typed_store(tmp_path, dim=500, table_dim=500)
    with pytest.raises(ConfigError, match="memory_budget"):
        derive_features(tmp_path, store.manifest, store.rules, 8 << 10)
    np.testing.assert_array_equal(read_table(store), store.before)
