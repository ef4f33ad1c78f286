"""Run a command inside a memory cgroup whose limit counts the page cache, and measure what it read from disk.

Out-of-core means out of core (docs/design.md, "How it is measured"): a pipeline whose
features are several times its memory limit must not quietly keep them in the page cache. Both cgroup versions charge a
page-cache page to the cgroup of the process that first reads it, so a limited child can hold no
more page cache than its limit:

* **v1** (a ``cgroup`` mount with the ``memory`` controller, e.g. ``/sys/fs/cgroup/memory``):
  ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes`` when swap is accounted, so swap
  is no way out), peak ``memory.max_usage_in_bytes``, OOM kills from ``memory.oom_control``.
* **v2** (a ``cgroup2`` mount whose root lists ``memory`` in ``cgroup.controllers``):
  ``memory.max`` and ``memory.swap.max = 0``, peak ``memory.peak``, OOM kills from ``memory.events``.

The cgroup ``diskflow-<name>-<pid>`` is made at the top of the hierarchy and removed afterwards.
The child joins it before it runs anything: it is started as ``sh -c 'echo $$ > cgroup.procs &&
exec "$@"' ...``, so the process that writes its pid is the one that becomes the command. Its true
disk traffic, CPU time and peak RSS come from ``wait4``: ``ru_inblock`` and ``ru_oublock`` are
``read_bytes`` and ``write_bytes`` of ``/proc/<pid>/io`` in 512-byte units, summed over the child's
threads and every descendant it waited for (``write_bytes`` counts pages when they are dirtied, so
it includes pages truncated before writeback: ``cancelled_write_bytes``, which rusage lacks);
``ru_utime + ru_stime`` is their CPU time; ``ru_maxrss`` is the largest RSS among them.
"""
from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

__all__ = ["MOUNTS", "PREFIX", "Hierarchy", "LimitedRun", "MemoryCgroup", "current_procs", "find_hierarchy",
           "run_limited", "unavailable_reason"]

MOUNTS = Path("/proc/self/mounts")
PREFIX = "diskflow-"
_POLL_S = 0.1                    # how often a waiting parent checks its child (and the timeout)
_JOIN = 'echo $$ > "$0" && exec "$@"'   # sh: put this shell's pid (the command's, after exec) in the cgroup


@dataclass(frozen=True)
class Hierarchy:
    """Where the memory controller lives: cgroup `version` 1 or 2, mounted at `root`."""

    version: int
    root: Path


@dataclass
class LimitedRun:
    """What one command did: exit status, time, true disk reads, memory peaks, OOM kills.

    `read_bytes` is the block-device read traffic of the child and its waited-for descendants
    (``/proc/<pid>/io`` read_bytes, from ``wait4``'s ``ru_inblock``): page-cache hits do not
    count, O_DIRECT reads and page faults that go to the disk do. `write_bytes` is ``write_bytes``
    of the same processes (pages dirtied, cancelled ones included) and `cpu_s` their user + system
    CPU seconds. `cgroup_peak_bytes` is the cgroup's peak charge (anonymous memory + page cache);
    None without a cgroup.
    """

    returncode: int
    wall_s: float
    read_bytes: int
    peak_rss_bytes: int
    limit_bytes: int | None
    cgroup: str | None
    cgroup_peak_bytes: int | None = None
    oom_kills: int | None = None
    timed_out: bool = False
    write_bytes: int = 0
    cpu_s: float = 0.0


def find_hierarchy(mounts: str | None = None) -> Hierarchy | None:
    """The memory controller's hierarchy from a mount table (default: ``/proc/self/mounts``), or None.

    A v1 ``cgroup`` mount carrying ``memory`` wins (the controller can be in one hierarchy only);
    otherwise a ``cgroup2`` mount whose root offers ``memory`` in ``cgroup.controllers``.
    """
    if mounts is None:
        try:
            mounts = MOUNTS.read_text()
        except OSError:
            return None
    v2: list[Path] = []
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        _, where, fstype, options = fields[:4]
        if fstype == "cgroup" and "memory" in options.split(","):
            return Hierarchy(1, Path(where))
        if fstype == "cgroup2":
            v2.append(Path(where))
    for root in v2:
        with contextlib.suppress(OSError):
            if "memory" in (root / "cgroup.controllers").read_text().split():
                return Hierarchy(2, root)
    return None


def unavailable_reason(hierarchy: Hierarchy | None = None) -> str | None:
    """Why memory cgroups cannot be used here (None when they can): no hierarchy, or not writable."""
    h = hierarchy if hierarchy is not None else find_hierarchy()
    if h is None:
        return "no memory cgroup hierarchy is mounted (neither a v1 'memory' cgroup nor cgroup2 with 'memory')"
    if not os.access(h.root, os.W_OK):
        return f"cannot create cgroups under {h.root} (run as root)"
    return None


def current_procs(hierarchy: Hierarchy, proc_cgroup: str | None = None) -> Path | None:
    """The ``cgroup.procs`` of the memory cgroup this process is in now (from ``/proc/self/cgroup``).

    A limited child writes its pid there to go back where its parent runs (e.g. to evaluate,
    outside the measured part, without the limit); None when it cannot be told.
    """
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if (hierarchy.version == 1 and "memory" in controllers.split(",")) or \
                (hierarchy.version == 2 and controllers == ""):
            return hierarchy.root / path.lstrip("/") / "cgroup.procs"
    return None


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as e:
        raise ConfigError("--no-cgroup", f"cannot write {value.strip()!r} to {path} ({e.strerror or e}); run as "
                                         "root, or pass --no-cgroup to run without memory limits") from e


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_key(path: Path, key: str) -> int | None:
    """The value of `key` in a ``key value`` per line file (``memory.events``, ``memory.oom_control``)."""
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    except (OSError, ValueError):
        return None
    return None


class MemoryCgroup:
    """A memory cgroup made for one command: create with a limit, wrap the command, read peaks, remove.

    Use `create`; `remove` when done (`run_limited` does both).
    """

    def __init__(self, path: Path, version: int, limit_bytes: int) -> None:
        self.path = path
        self.version = version
        self.limit_bytes = limit_bytes

    def __repr__(self) -> str:
        return f"MemoryCgroup({str(self.path)!r}, v{self.version}, limit={self.limit_bytes})"

    @classmethod
    def create(cls, name: str, limit_bytes: int, hierarchy: Hierarchy | None = None) -> MemoryCgroup:
        """Make ``diskflow-<name>-<pid>`` at the top of the hierarchy with `limit_bytes` (page cache included).

        Raises:
            ConfigError: no memory cgroup hierarchy, not allowed to create one, or the limit is refused
                (the message says to run as root or pass ``--no-cgroup``).
        """
        if limit_bytes <= 0:
            raise ConfigError("--feature-budget", f"a memory limit must be > 0 bytes, got {limit_bytes}")
        h = hierarchy if hierarchy is not None else find_hierarchy()
        why = unavailable_reason(h)
        if why is not None or h is None:
            raise ConfigError("--no-cgroup", f"memory cgroups are unavailable: {why}; pass --no-cgroup to run "
                                             "without memory limits (the table then says so)")
        path = h.root / f"{PREFIX}{name}-{os.getpid()}"
        try:
            path.mkdir()
        except FileExistsError:
            cls(path, h.version, limit_bytes).remove()     # a leftover of this very process: start afresh
            path.mkdir()
        except OSError as e:
            raise ConfigError("--no-cgroup", f"cannot create the cgroup {path} ({e.strerror or e}); run as root, "
                                             "or pass --no-cgroup to run without memory limits") from e
        cg = cls(path, h.version, limit_bytes)
        try:
            cg._limit(h)
        except BaseException:
            cg.remove()
            raise
        return cg

    def _limit(self, h: Hierarchy) -> None:
        limit = str(self.limit_bytes)
        if self.version == 1:
            _write(self.path / "memory.limit_in_bytes", limit)
            if (self.path / "memory.memsw.limit_in_bytes").exists():    # swap accounted: no way out through it
                _write(self.path / "memory.memsw.limit_in_bytes", limit)
            return
        control = h.root / "cgroup.subtree_control"
        with contextlib.suppress(OSError):
            if "memory" not in control.read_text().split():
                _write(control, "+memory")
        _write(self.path / "memory.max", limit)
        if (self.path / "memory.swap.max").exists():
            _write(self.path / "memory.swap.max", "0")

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """`argv` started so that it joins this cgroup before it runs (its pid is written first)."""
        return ["/bin/sh", "-c", _JOIN, str(self.procs), *argv]

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs.read_text().split()]
        except (OSError, ValueError):
            return []

    def peak_bytes(self) -> int | None:
        """The cgroup's peak charge (anonymous memory + page cache) since it was made."""
        return _read_int(self.path / ("memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"))

    def oom_kills(self) -> int | None:
        """Processes the kernel's OOM killer killed in this cgroup (None where the kernel does not say)."""
        return _read_key(self.path / ("memory.oom_control" if self.version == 1 else "memory.events"), "oom_kill")

    def remove(self) -> None:
        """Kill what is left in the cgroup (descendants of the command), then remove it; never raises."""
        for _ in range(50):
            pids = self.pids()
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)         # killed processes leave the cgroup when the kernel has reaped them


def run_limited(argv: Sequence[str], *, name: str, limit_bytes: int | None, env: Mapping[str, str] | None = None,
                cwd: str | os.PathLike[str] | None = None, timeout_s: float | None = None,
                hierarchy: Hierarchy | None = None) -> LimitedRun:
    """Run `argv` to completion in a fresh memory cgroup of `limit_bytes` (None: no cgroup, no limit).

    The child inherits stdout/stderr. On timeout (or Ctrl-C) it and everything it started in the
    cgroup are killed; the cgroup is always removed.

    Raises:
        ConfigError: a limit was asked for and memory cgroups are unavailable (see `MemoryCgroup.create`).
    """
    cg = MemoryCgroup.create(name, limit_bytes, hierarchy) if limit_bytes is not None else None
    try:
        cmd = cg.wrap(argv) if cg is not None else list(argv)
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=None if env is None else dict(env), cwd=cwd)
        status, usage, timed_out = _wait(proc, timeout_s)
        wall_s = time.perf_counter() - t0
        return LimitedRun(
            returncode=os.waitstatus_to_exitcode(status), wall_s=wall_s, read_bytes=int(usage.ru_inblock) * 512,
            peak_rss_bytes=int(usage.ru_maxrss) * 1024, limit_bytes=limit_bytes,
            cgroup=None if cg is None else f"v{cg.version} {cg.path}",
            cgroup_peak_bytes=None if cg is None else cg.peak_bytes(),
            oom_kills=None if cg is None else cg.oom_kills(), timed_out=timed_out,
            write_bytes=int(usage.ru_oublock) * 512, cpu_s=float(usage.ru_utime + usage.ru_stime))
    finally:
        if cg is not None:
            cg.remove()


def _wait(proc: subprocess.Popen[bytes], timeout_s: float | None) -> tuple[int, resource.struct_rusage, bool]:
    """Reap `proc` with wait4 (its rusage covers its waited-for descendants); kill it on timeout or Ctrl-C."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    timed_out = False
    try:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                proc.returncode = os.waitstatus_to_exitcode(status)    # reaped here: Popen must not wait again
                return status, usage, timed_out
            if deadline is not None and time.monotonic() > deadline and not timed_out:
                timed_out = True
                proc.kill()
            time.sleep(_POLL_S)
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            with contextlib.suppress(ChildProcessError):
                os.wait4(proc.pid, 0)
            proc.returncode = -signal.SIGKILL
        raise
