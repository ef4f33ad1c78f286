"""Derived features as a Dask graph: featureless node types of a typed store get the mean of a neighbour
type's rows (`operators.ingest.derive`; docs/design.md, "Typed graphs").

One graph for all rules. A rule is cut into row ranges of its derived type (`task_ranges`), one task each
(``derive-{type}-{i}-{token}``), sized so that a task holds at most the memory budget over the worker
threads that run them at once. A rule whose neighbour type is itself derived (institutions from authors,
authors from papers) waits for every task of that rule; independent rules run side by side. The typed
ingest calls `derive_features` once the topology and the feature table (derived rows reserved as zeros)
are written and before the manifest is.
"""
from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dask

from ..operators.ingest.derive import DeriveRuleLike, derive_jobs, derive_rows, task_ranges
from ..operators.ingest.raw import check_memory_budget
from .progress import active_client, compute

__all__ = ["derive_features", "derive_graph", "worker_threads"]


def worker_threads(client: Any = None) -> int:
    """How many tasks may run at once where the graph will run: `client`'s (else the active client's) worker
    threads, else the local scheduler's (1 for the synchronous one, else ``num_workers`` or the CPUs)."""
    client = client if client is not None else active_client()
    if client is not None:
        return max(1, sum(client.nthreads().values()))
    chosen = dask.config.get("scheduler", None)
    if isinstance(chosen, str) and chosen.lower() in ("sync", "synchronous", "single-threaded"):
        return 1
    from dask.system import CPU_COUNT

    return max(1, int(dask.config.get("num_workers", None) or CPU_COUNT))


def _after(_done: Any, fn: Any, *args: Any) -> Any:
    """`fn(*args)`, run once the task `_done` stands for has finished (the chain of derived types)."""
    return fn(*args)


def _barrier(_tasks: Sequence[Any]) -> None:
    """Nothing: the one task a chained rule waits on, once every task of the rule it reads has run (one
    dependency per chained task, not one per task of the rule before)."""


def derive_graph(store_dir: str | os.PathLike[str], manifest: dict[str, Any], rules: Sequence[DeriveRuleLike],
                 memory_budget: int, threads: int, token: str | None = None) -> list[Any]:
    """The derive tasks of `rules` as Dask delayed objects, in dependency order.

    Args:
        store_dir, manifest, rules: as `derive_features`'s.
        memory_budget: bytes all the derive tasks running at once may hold.
        threads: how many run at once; each task gets ``memory_budget // threads``.
        token: ends every key, so that two runs may share a cluster (default: a fresh one).

    Raises:
        ConfigError: the budget's share cannot hold one row and one edge of some rule, or the rules are bad
            (`derive_jobs`).
        InputError: a rule that does not fit the store.
    """
    token = token or uuid.uuid4().hex[:8]
    share = memory_budget // max(1, threads)
    d = dask.delayed
    tasks: list[Any] = []
    done: dict[str, Any] = {}
    for job in derive_jobs(store_dir, manifest, rules):     # a loop per rule
        before = done[job.after] if job.after is not None else None
        # the rule once in the graph, each task a reference to it: a task's arguments are not walked (a
        # dataclass holding the shard list) nor shipped with it
        rule = d(job, name=f"derive-{job.type}-rule-{token}", traverse=False)
        mine = [d(_after, pure=False)(before, derive_rows, rule, lo, hi, share,
                                      dask_key_name=f"derive-{job.type}-{i}-{token}")
                for i, (lo, hi) in enumerate(task_ranges(job, share))]
        done[job.type] = d(_barrier, pure=False)(mine, dask_key_name=f"derive-{job.type}-done-{token}")
        tasks.extend(mine)
    return tasks


def derive_features(store_dir: Path, manifest: dict[str, Any], rules: Sequence[DeriveRuleLike], memory_budget: int | str,
                    client: Any = None) -> float:
    """Fill the derived node types' rows of a typed store's feature table, in place, as one Dask graph.

    Args:
        store_dir: the store being written (its feature shards and the rules' CSC arrays are there).
        manifest: the store's manifest as it will be written (``features`` and ``hetero`` entries); not read
            from disk.
        rules: what to derive (the ingest's `DeriveRule`s, or any objects with their attributes:
            `operators.ingest.derive.DeriveRuleLike`).
        memory_budget: bytes the derive tasks running at once may hold (an int, or a size like "256MiB").
        client: the `distributed.Client` to run on; by default the active one, else the local scheduler (as
            the ingest runs).

    Returns:
        The wall seconds the call took.

    Raises:
        ConfigError: a bad rule, or a budget too small for one row and one edge per task.
        InputError: a rule that does not fit the store, or a CSC that is not one (naming the file).
    """
    t0 = time.perf_counter()
    budget = check_memory_budget(memory_budget)
    tasks = derive_graph(store_dir, manifest, rules, budget, worker_threads(client))
    if tasks:
        if client is not None:
            with client.as_current():        # `compute` runs on the client it finds current
                compute(tasks, desc="ingest: derive")
        else:
            compute(tasks, desc="ingest: derive")
    return time.perf_counter() - t0
