"""Peak memory of every Dask task, measured in the worker that runs it (for `bench scale`).

Two figures per task, the worker's baseline included in both:

* **peak RSS**: the worker plugin lowers the worker process's ``VmHWM`` (peak resident set) to its
  current RSS when a task starts executing (``/proc/self/clear_refs`` 5) and reads it when the
  task stops: exact. RSS also counts file pages the process has mapped (memory-mapped arrays,
  shared libraries), which are page cache: reclaimable, and charged to whichever cgroup first read
  them, so a process's RSS can exceed its cgroup's charge.
* **peak anonymous memory** (``RssAnon + RssShmem``, what the process itself holds and cannot give
  back without freeing it): sampled every `SAMPLE_S` by a thread (`AnonPeak`), so a spike shorter
  than that can be missed.

Both are per task with one thread per worker, where a worker runs one task at a time. Imported
only where a cluster is started (it imports `distributed`).
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from .prepare import proc_io

__all__ = ["SAMPLE_S", "AnonPeak", "TaskMemory", "memory_cgroup", "reset_hwm", "rss_parts", "status_bytes",
           "worker_report"]


def status_bytes(field: str) -> int:
    """A ``/proc/self/status`` field (VmHWM, VmRSS) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


SAMPLE_S = 0.01                    # how often `AnonPeak` reads /proc/self/status


def rss_parts() -> dict[str, int]:
    """``VmRSS``, ``VmHWM``, ``RssAnon``, ``RssFile`` and ``RssShmem`` of this process, in bytes."""
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(rest.split()[0]) * 1024
    return out


class AnonPeak:
    """The most anonymous memory (``RssAnon + RssShmem``) this process held since `reset`, sampled on a
    daemon thread every `interval` seconds (and whenever `peak` is read)."""

    def __init__(self, interval: float = SAMPLE_S) -> None:
        self._interval = interval
        self._max = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="diskflow-anon-peak", daemon=True)
        self._thread.start()

    @staticmethod
    def now() -> int:
        parts = rss_parts()
        return parts.get("RssAnon", 0) + parts.get("RssShmem", 0)

    def _sample(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            v = self.now()
            with self._lock:
                self._max = max(self._max, v)

    def _run(self) -> None:
        while True:
            self._sample()
            time.sleep(self._interval)

    def reset(self) -> None:
        with self._lock:
            self._max = 0
        self._sample()

    def peak(self) -> int:
        self._sample()
        with self._lock:
            return self._max


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
    """A Dask worker plugin: the peak RSS and peak anonymous memory of every task, by task group.

    When a task starts executing, the worker's ``VmHWM`` (peak RSS) is lowered to its current RSS
    and the anonymous-memory sampler is reset; when it stops, both are that task's peaks (worker
    baseline included). One task at a time with one thread per worker; with more threads a task's
    peak includes its neighbours', which `threads` says.
    """

    name = "diskflow-task-memory"

    def setup(self, worker: Any) -> None:
        self.threads = int(getattr(worker.state, "nthreads", 1) or 1)
        self.baseline = status_bytes("VmRSS")
        self.baseline_anon = AnonPeak.now()
        self.anon = AnonPeak()
        self.cgroup = memory_cgroup()
        self.resettable = reset_hwm()
        self.groups: dict[str, dict[str, Any]] = {}
        self._t0 = 0.0

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish == "executing":
            reset_hwm()
            self.anon.reset()
            self._t0 = time.perf_counter()
        elif start == "executing":
            from dask.utils import key_split

            peak, anon = status_bytes("VmHWM"), self.anon.peak()
            g = self.groups.setdefault(key_split(key), {"tasks": 0, "peak_rss_bytes": 0, "peak_anon_bytes": 0,
                                                        "seconds": 0.0})
            g["tasks"] += 1
            g["seconds"] += time.perf_counter() - self._t0
            g["peak_rss_bytes"] = max(g["peak_rss_bytes"], peak)
            g["peak_anon_bytes"] = max(g["peak_anon_bytes"], anon)

    def report(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "threads": self.threads, "baseline_rss_bytes": self.baseline,
                "baseline_anon_bytes": self.baseline_anon,
                "cgroup": self.cgroup, "hwm_resettable": self.resettable, "groups": self.groups,
                "io": proc_io()}


def worker_report(dask_worker: Any) -> dict[str, Any]:
    return dask_worker.plugins[TaskMemory.name].report()
