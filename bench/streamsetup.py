"""The streaming benchmarks' shared set-up: the dataset they run on, and a cluster made ready before anything is
measured (the plugin on every worker, cores pinned, the GPU workers' trainer imported). `bench stream` and
`bench stream --gpus N` (`bench.stream_gpus`) both use it, so neither imports the other's internals."""
from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Any

__all__ = ["bench_store", "pin", "set_up_cluster", "warm_up"]


def bench_store(args: argparse.Namespace) -> Path:
    if args.dataset:
        return Path(args.dataset)
    import dask

    from ..flow.ingest import run_ingest
    from ..flow.synth import run_synth
    from ..operators.formats.manifest import read_manifest
    from ..operators.ingest.synth import SynthConfig

    work = Path(args.work) / f"n{args.nodes}-d{args.dim}-t{args.train_frac}-s{args.seed}"
    if read_manifest(work / "store") is None:
        cfg = SynthConfig(num_nodes=args.nodes, feature_dim=args.dim, train_frac=args.train_frac, val_frac=0.01,
                          test_frac=0.01, seed=args.seed)
        with dask.config.set(scheduler="threads"):
            raw = run_synth(cfg, work / "raw")
            run_ingest(raw, work / "store")
        shutil.rmtree(work / "raw", ignore_errors=True)
    return work / "store"


def pin(cores: list[int]) -> list[int]:
    """Restrict every thread of this process (and threads it starts later) to `cores`; the cores it had."""
    before = sorted(os.sched_getaffinity(0))
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:     # a thread that just ended
            pass
    return before


def warm_up() -> bool:
    """Runs on the GPU worker: import the trainer (torch, PyG) before anything is measured."""
    from ..operators.stream import train as stream_train  # noqa: F401
    from ..operators.train import trainer  # noqa: F401

    return True


def _pin_cluster(client: Any, cpus: list[str], gpu: list[str]) -> dict[str, list[int]]:
    """The preprocessing side (CPU workers, one core each while there are enough, and this process with the
    scheduler) on the first cores, the GPU worker on the rest; the cores each got."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return {}
    n = min(max(len(cpus), 1), len(cores) - 1)
    plan = {a: [cores[i % n]] for i, a in enumerate(cpus)}
    plan.update({a: cores[n:] for a in gpu})
    pinned = {}
    for a, c in plan.items():
        client.run(pin, c, workers=[a])
        pinned[a] = c
    pin(cores[:n])
    pinned["driver"] = cores[:n]
    return pinned


def set_up_cluster(client: Any, args: argparse.Namespace) -> tuple[list[str], list[str], dict[str, list[int]], str]:
    """Before anything is measured: the plugin on every worker, the GPU workers' trainer imported, the cores
    pinned (unless ``--no-pin``) and the allocator set. Returns (GPU workers, CPU workers, pinned cores, the
    allocator's description)."""
    from ..flow.allocator import describe as describe_allocator
    from ..flow.allocator import keep_freed_memory
    from ..flow.plugin import GPU, DiskflowPlugin

    client.register_plugin(DiskflowPlugin())
    table = client.run_on_scheduler(lambda dask_scheduler: {a: dict(w.resources) for a, w in
                                                            dask_scheduler.workers.items()})
    gpus = sorted(a for a, r in table.items() if r.get(GPU))
    cpus = sorted(a for a, r in table.items() if not r.get(GPU))
    pinned = _pin_cluster(client, cpus, gpus) if not args.no_pin else {}
    client.run(warm_up, workers=gpus)
    # the GPU workers' plugin does this itself (flow.allocator); the CPU workers get it too, so that both sides
    # run as they would in a split run's setup
    allocator = describe_allocator(not args.dask_malloc and all(client.run(keep_freed_memory).values()))
    return gpus, cpus, pinned, allocator
