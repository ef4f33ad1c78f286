"""Where preparation's CPU goes, per task group: thread CPU and wall seconds of every task run in this process.

`profile_tasks` is opt-in: while its block runs, tasks built through `flow.graph.delayed_submit`
(every task of `diskflow prepare`) record, per key group (``sample``, ``plan``, ``pack-r0`` ...),
how many ran, the CPU seconds of the thread that ran them and their wall seconds. It sees tasks run
by this process's scheduler threads (Dask's threaded or synchronous scheduler); on a cluster the
tasks run elsewhere and record nothing here. A task's own helper threads (a writer thread, the
sampler's threads) are not in its thread CPU: the process's CPU time, measured around a phase,
counts them.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["AnonPeak", "Profiled", "TaskProfile", "profile_tasks", "profiled"]

_ACTIVE: list[TaskProfile] = []
_LOCK = threading.Lock()


class TaskProfile:
    """Per-group task figures, collected while `profile_tasks` runs."""

    def __init__(self) -> None:
        self.groups: dict[str, dict[str, float]] = {}
        self.spans: list[tuple[str, float, float, str]] = []   # (group, start, end, thread): perf_counter seconds

    def add(self, group: str, cpu_s: float, wall_s: float, start: float | None = None) -> None:
        with _LOCK:
            if start is not None:
                self.spans.append((group, start, start + wall_s, threading.current_thread().name))
            g = self.groups.setdefault(group, {"tasks": 0, "cpu_s": 0.0, "wall_s": 0.0})
            g["tasks"] += 1
            g["cpu_s"] += cpu_s
            g["wall_s"] += wall_s

    def table(self) -> list[dict[str, Any]]:
        """The groups, most CPU first."""
        return [{"group": k, **v} for k, v in sorted(self.groups.items(), key=lambda kv: -kv[1]["cpu_s"])]

    def timeline(self, origin: float) -> list[dict[str, Any]]:
        """Every task's span (seconds after `origin`, a `time.perf_counter` value) and its thread, by start."""
        return [{"group": g, "start": a - origin, "end": b - origin, "thread": th}
                for g, a, b, th in sorted(self.spans, key=lambda s: s[1])]


@contextlib.contextmanager
def profile_tasks() -> Iterator[TaskProfile]:
    """Record the tasks built inside the block (``with profile_tasks() as prof: prepare(...)``)."""
    prof = TaskProfile()
    with _LOCK:
        _ACTIVE.append(prof)
    try:
        yield prof
    finally:
        with _LOCK:
            _ACTIVE.remove(prof)


class Profiled:
    """`fn` recording its thread CPU and wall time under `group` in the active profiles (picklable)."""

    def __init__(self, fn: Callable[..., Any], group: str) -> None:
        self.fn, self.group = fn, group

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        c, t = time.thread_time(), time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            cpu, wall = time.thread_time() - c, time.perf_counter() - t
            with _LOCK:
                active = list(_ACTIVE)
            for prof in active:
                prof.add(self.group, cpu, wall, t)


def profiled(fn: Callable[..., Any], key: str) -> Callable[..., Any]:
    """`fn` wrapped to record under `key`'s group while a profile is active; `fn` itself otherwise."""
    if not _ACTIVE:
        return fn
    from dask.utils import key_split

    return Profiled(fn, key_split(key))


class AnonPeak:
    """The most anonymous memory (``RssAnon + RssShmem`` of this process) above its level at entry,
    sampled every `interval` seconds on a daemon thread while the block runs: what one task holds at
    its peak, where it runs alone in its process (a spike shorter than `interval` can be missed)."""

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self.start = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="diskflow-anon-peak", daemon=True)

    @staticmethod
    def now() -> int:
        """This process's ``RssAnon + RssShmem`` in bytes (0 where /proc is not there)."""
        total = 0
        with contextlib.suppress(OSError), open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("RssAnon:", "RssShmem:")):
                    total += int(line.split()[1]) * 1024
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.now() - self.start)

    def __enter__(self) -> Self:
        self.start = self.now()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now() - self.start)
