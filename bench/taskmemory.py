"""Peak RSS of every Dask task, measured in the worker that runs it (for `bench scale`).

A worker plugin lowers the worker process's ``VmHWM`` (peak resident set) to its current RSS when a
task starts executing (``/proc/self/clear_refs`` 5) and reads it when the task stops, so the figure
is that task's own peak, the worker's baseline included. It is exact with one thread per worker,
where a worker runs one task at a time. Imported only where a cluster is started (it imports
`distributed`).
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from .prepare import proc_io


def status_bytes(field: str) -> int:
    """A ``/proc/self/status`` field (VmHWM, VmRSS) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def reset_hwm() -> bool:
    """Lower this process's VmHWM to its current RSS (``clear_refs`` 5); False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def memory_cgroup() -> str:
    """This process's memory cgroup path (v1 ``memory`` controller, or the v2 unified one)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(",") or controllers == "":
                return path
    return "?"


class TaskMemory(WorkerPlugin):
    """A Dask worker plugin: the peak RSS of every task, by task group.

    When a task starts executing, the worker's ``VmHWM`` (peak RSS) is lowered to its current RSS;
    when it stops, ``VmHWM`` is that task's peak (worker baseline included). Exact with one
    thread per worker (one task at a time); with more threads a task's peak includes its
    neighbours', which `threads` says.
    """

    name = "diskflow-task-memory"

    def setup(self, worker: Any) -> None:
        self.threads = int(getattr(worker.state, "nthreads", 1) or 1)
        self.baseline = status_bytes("VmRSS")
        self.cgroup = memory_cgroup()
        self.resettable = reset_hwm()
        self.groups: dict[str, dict[str, Any]] = {}
        self._t0 = 0.0

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish == "executing":
            reset_hwm()
            self._t0 = time.perf_counter()
        elif start == "executing":
            from dask.utils import key_split

            peak = status_bytes("VmHWM")
            g = self.groups.setdefault(key_split(key), {"tasks": 0, "peak_rss_bytes": 0, "seconds": 0.0})
            g["tasks"] += 1
            g["seconds"] += time.perf_counter() - self._t0
            g["peak_rss_bytes"] = max(g["peak_rss_bytes"], peak)

    def report(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "threads": self.threads, "baseline_rss_bytes": self.baseline,
                "cgroup": self.cgroup, "hwm_resettable": self.resettable, "groups": self.groups,
                "io": proc_io()}


def worker_report(dask_worker: Any) -> dict[str, Any]:
    return dask_worker.plugins[TaskMemory.name].report()
