"""Separate processes for the loopback-cluster tests: `python -m diskflow ARGS` (or Dask's own `dask ARGS`, a
worker started by hand) in a session of its own, and stopping them all at the end (SIGTERM, then SIGKILL)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path


def start(args: list[str], log: Path, dask_cli: bool = False) -> subprocess.Popen:
    """Start `args` with its output to `log`."""
    cmd = [str(Path(sys.executable).with_name("dask"))] if dask_cli else [sys.executable, "-m", "diskflow"]
    with open(log, "wb") as out:
        return subprocess.Popen([*cmd, *args], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(procs: Iterable[subprocess.Popen], grace_s: float = 1.0) -> None:
    """SIGTERM every process still running; SIGKILL the process group of any that outlives `grace_s`."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def stop_cluster(procs: dict[str, subprocess.Popen], grace_s: float = 1.0) -> None:
    """`stop` a test cluster's processes, the workers before the ``"scheduler"``: with their scheduler gone,
    workers linger past SIGTERM trying to reach it, and would each cost the whole grace."""
    stop([p for name, p in procs.items() if name != "scheduler"], grace_s)
    stop([p for name, p in procs.items() if name == "scheduler"], grace_s)
