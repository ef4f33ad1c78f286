"""`diskflow bench compare` with its children in the test's own process.

Compare runs each pipeline's data-path and model runs as child processes (``python -m
diskflow.bench.harness --child SPEC``), each paying some 5 CPU seconds of importing torch and PyG before
its first batch. A test of what compare computes from those runs can have them run here instead:
within `compare_children_in_this_process`, `cgroup.run_limited` runs `harness.child_main` in this process. Only
without cgroups (``--no-cgroup``): a child's memory limit cannot be had in-process. Peak RSS figures are
then this process's.
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest


def _child_here(argv: Sequence[str], *, name: str, limit_bytes: int | None, **_: Any) -> Any:
    import importlib

    import torch
    from diskflow.bench import cgroup, harness, link

    children = {harness.CHILD: harness, link.CHILD: link}     # the benches whose children may run here
    assert argv[1] == "-m" and argv[2] in children and argv[3] == "--child" and limit_bytes is None, (name, argv)
    module = importlib.import_module(argv[2])
    threads = torch.get_num_threads()
    t0 = time.perf_counter()
    try:
        rc = module.child_main(list(argv[3:]))
    finally:
        torch.set_num_threads(threads)      # a run sets its own
    return cgroup.LimitedRun(returncode=rc, wall_s=time.perf_counter() - t0, read_bytes=0, peak_rss_bytes=0,
                             limit_bytes=None, cgroup=None)


@contextmanager
def compare_children_in_this_process() -> Iterator[None]:
    """Within: compare's (and bench link's) children (run with --no-cgroup) run in this process."""
    from diskflow.bench import cgroup

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cgroup, "run_limited", _child_here)
        yield
