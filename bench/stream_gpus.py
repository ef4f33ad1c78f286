"""`diskflow bench stream --gpus N`: the streamed run on N data-parallel GPU workers, once per cache mode.

The cluster is `bench stream`'s embedded split cluster with N GPU-resource workers (processes, each
its own scratch directory), pinned as there: the CPU workers and this process on the first cores,
the GPU workers on the rest. For each `--cache` mode, `--repeats` streamed runs (interleaved between
the modes; each mode's fastest kept) of the same round, model and seed, each measured for:

* ``stream_s`` and ``gpu_idle_fraction_per_worker``: per GPU worker, 1 - (its time in ``train``
  tasks) / ``stream_s``. A data-parallel ``train`` task also holds its worker while it waits in a
  step's all-reduce for the others: that wait counts as busy, as the GPU would be held by DDP;
  ``allreduce_wait`` is not measured apart.
* ``models_equal``: the GPU workers' weights compared (crc32) after every superbatch
  (`flow.stream.driver`), and the per-batch losses equal across repeats and modes.
* ``disk_read_bytes_<mode>``: what the GPU worker processes read from their disks
  (``read_bytes`` of ``/proc/<pid>/io``: the packed segments, read with direct I/O, and anything
  else that missed the page cache) during the run.

The CPU budget is by default a quarter of the features per worker (the tiers' staging and I/O
buffers on top, sized exactly as the run sizes them: from the first superbatches' largest batch of
each worker's share), so that most rows are packed and read from the scratch disks.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import print_table
from .streamsetup import bench_store as _store
from .streamsetup import pin as _pin
from .streamsetup import set_up_cluster

__all__ = ["IDLE_TARGET", "quarter_budget", "run_gpus"]

IDLE_TARGET = 0.1


def _read_bytes() -> int:
    """Runs on a worker: bytes this process has read from storage (``/proc/self/io`` ``read_bytes``)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def quarter_budget(store: Any, args: argparse.Namespace, gpus: int, staging_batches: int, io_reserve: int) -> int:
    """The host budget whose CPU tier holds a quarter of the features on the worker with the smallest staging
    (so at most a quarter on every worker): the tiers' staging is sized from the largest batch of each worker's
    share of the first superbatches, which are sampled here with the run's seeds (the same batches)."""
    from ..flow.graph import MAX_ROWS_MARGIN
    from ..operators.formats.samples import read_n_ids
    from ..operators.prepare.superbatch import round_layout, sample_superbatch_bytes
    from ..operators.prepare.tiers import staging_piece_bytes

    refs = round_layout(int(store.split_ids("train").shape[0]), args.batch_size, args.superbatch_size, args.epochs)
    largest = [0] * gpus
    for ref in refs[:2]:        # the tier superbatches (StreamConfig.tier_superbatches)
        data, _ = sample_superbatch_bytes(store.path, ref, args.batch_size, list(args.fanouts), args.seed, 1)
        for i, ids in enumerate(read_n_ids(ref.key, np.frombuffer(data, np.uint8))):
            largest[i % gpus] = max(largest[i % gpus], int(ids.shape[0]))
    rows = min(store.num_nodes, math.ceil(min(largest) * MAX_ROWS_MARGIN))
    staging = staging_batches * staging_piece_bytes(rows, store.row_bytes, len(store.shards))
    return staging + io_reserve + store.feature_bytes // 4


def run_gpus(args: argparse.Namespace) -> dict[str, Any]:
    from distributed import get_task_stream

    from ..errors import ConfigError
    from ..flow.roles import stream_client
    from ..flow.runtimes.packed import packed_budgets
    from ..flow.stream import StreamConfig, StreamRun
    from ..flow.stream.config import CACHES
    from ..operators.formats.store import Store
    from ..operators.stream.train import StreamTrainConfig

    if args.repeats < 1:
        raise ConfigError("--repeats", f"expected an integer >= 1, got {args.repeats}")
    modes = list(CACHES) if args.cache is None else [m.strip() for m in str(args.cache).split(",") if m.strip()]
    for m in modes:
        if m not in CACHES:
            raise ConfigError("--cache", f"expected modes among {', '.join(CACHES)}, got {m!r}")
    if args.superbatch_size < args.gpus:
        raise ConfigError("--superbatch-size", f"must be >= --gpus ({args.gpus}): each GPU worker takes its share")
    store = Store(_store(args))
    budgets = packed_budgets(store, args.cpu_memory, 0, None, args.fanouts, args.batch_size)
    cpu_memory = budgets["cpu_memory"] if args.cpu_memory is not None else \
        quarter_budget(store, args, args.gpus, budgets["staging_batches"], budgets["io_reserve"])
    round_opts = {"fanouts": tuple(args.fanouts), "batch_size": args.batch_size, "superbatch_size": args.superbatch_size,
                  "epochs": args.epochs, "seed": args.seed}
    evaluate_once = args.epochs + 1
    tmp = Path(tempfile.mkdtemp(prefix="diskflow-bench-stream-gpus-", dir=args.work if not args.dataset else None))
    affinity = sorted(os.sched_getaffinity(0))
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    losses: list[list[float]] = []
    try:
        with stream_client(None, cpu_workers=args.cpu_workers, scratch=str(tmp / "scratch"), device=args.device,
                           keep_freed_memory=not args.dask_malloc, gpu_workers=args.gpus) as client:
            gpus, _, pinned, allocator = set_up_cluster(client, args)
            tcfg = StreamTrainConfig(model=args.model, hidden=args.hidden, seed=args.seed, epochs=args.epochs,
                                     fanouts=tuple(args.fanouts), batch_size=args.batch_size, cpu_memory=cpu_memory,
                                     threads=args.threads, eval_every=evaluate_once, store=str(store.path))
            for repeat in range(args.repeats):
                for mode in modes:
                    work = tmp / f"r{repeat}-{mode}"
                    work.mkdir()
                    scfg = StreamConfig(train=tcfg, cpu_memory=cpu_memory, io_reserve=budgets["io_reserve"],
                                        staging_batches=budgets["staging_batches"], window=args.window,
                                        checkpoint_every=1_000_000, device=args.device, gpus=args.gpus, cache=mode,
                                        **round_opts)
                    io0 = client.run(_read_bytes, workers=gpus)
                    t = time.perf_counter()
                    with get_task_stream(client) as ts:
                        rep = StreamRun(client, store.path, work, scfg, progress=False).run()
                    wall = time.perf_counter() - t
                    io1 = client.run(_read_bytes, workers=gpus)
                    shipped = sum(int(e.get("bytes") or 0) for e in rep["timeline"])
                    s = rep["stream"]
                    runs[mode].append({
                        "stream_s": float(s["stream_s"]), "wall_s": wall,
                        "gpu_idle_fraction_per_worker": s["gpu_idle_fraction_per_worker"],
                        "models_equal": bool(s["models_equal"]), "models_checked": s["models_checked"],
                        "disk_read_bytes": sum(io1[a] - io0[a] for a in gpus),
                        "disk_read_bytes_by_worker": {a: io1[a] - io0[a] for a in gpus},
                        "shipped_bytes": shipped, "shipped_bytes_per_s": shipped / float(s["stream_s"]),
                        "tasks": len(ts.data), "tasks_per_s": len(ts.data) / float(s["stream_s"]),
                        "host_tier_bytes": [int(ln["tiers"].get("cpu_rows", 0)) * store.row_bytes
                                            + int(ln["tiers"].get("staging_bytes", 0)) for ln in s["lanes"]],
                        "packed_bytes": sum(int(ln.get("figures", {}).get("packed_bytes", 0))
                                            for e in rep["timeline"] for ln in e.get("lanes", [])),
                        "cpu_rows": [ln["tiers"].get("cpu_rows") for ln in s["lanes"]],
                        "superbatches": s["superbatches"], "batches": rep["dataset"]["batches"]})
                    losses.append([x for r in rep["epochs"] for x in r["losses"]])
                    shutil.rmtree(work)
    finally:
        _pin(affinity)
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
    best = {m: min(v, key=lambda r: r["stream_s"]) for m, v in runs.items()}
    first = best[modes[0]]
    figures: dict[str, Any] = {
        "gpus": args.gpus, "cache_modes": modes, "device": args.device, "cpu_workers": args.cpu_workers,
        "cpu_memory": cpu_memory,
        "cpu_tier_share": {m: max(b["cpu_rows"]) / store.num_nodes for m, b in best.items()},
        "gpu_idle_fraction_per_worker": first["gpu_idle_fraction_per_worker"],
        "idle_target": IDLE_TARGET,
        "idle_target_met": all(x is not None and x <= IDLE_TARGET for x in first["gpu_idle_fraction_per_worker"]),
        "models_equal": all(r["models_equal"] for v in runs.values() for r in v),
        "same_losses": all(x == losses[0] for x in losses),
        "stream_s": {m: b["stream_s"] for m, b in best.items()},
        "runs": runs, "repeats": args.repeats, "window": args.window, "epochs": args.epochs,
        "superbatches": first["superbatches"], "batches": first["batches"], "pinned": pinned, "allocator": allocator,
        "dataset": {"store": str(store.path), "nodes": store.num_nodes, "dim": store.feature_dim,
                    "feature_bytes": store.feature_bytes},
    }
    for m, b in best.items():
        figures[f"disk_read_bytes_{m.replace('-', '_')}"] = b["disk_read_bytes"]
    rows = [{"cache": m, "stream s": b["stream_s"], "median s": statistics.median(r["stream_s"] for r in runs[m]),
             "idle per worker": " ".join(f"{x:.3f}" for x in b["gpu_idle_fraction_per_worker"]),
             "disk read MiB": b["disk_read_bytes"] / 2**20, "packed MiB": b["packed_bytes"] / 2**20,
             "shipped MiB/s": b["shipped_bytes_per_s"] / 2**20, "tasks/s": b["tasks_per_s"],
             "CPU tier": f"{figures['cpu_tier_share'][m] * 100:.0f}%" + (" (pooled)" if m == "shared" else " each"),
             "models equal": "yes" if b["models_equal"] else "NO"}
            for m, b in best.items()]
    print_table(f"streaming on {args.gpus} data-parallel GPU workers ({args.device}): {store.num_nodes:,} nodes x "
                f"{store.feature_dim}, {first['batches']} batches in {first['superbatches']} superbatches "
                f"({args.epochs} epochs), CPU budget {cpu_memory / 2**20:.1f} MiB per worker (its CPU tier at most a "
                f"quarter of the rows; shared: the workers' tiers pooled into one); fastest of {args.repeats}", rows,
                ["cache", "stream s", "median s", "idle per worker", "disk read MiB", "packed MiB", "shipped MiB/s",
                 "tasks/s", "CPU tier", "models equal"])
    print(f"\nGPU workers idle: {', '.join(f'{x * 100:.1f}%' for x in figures['gpu_idle_fraction_per_worker'])} "
          f"(target <= {IDLE_TARGET * 100:.0f}% each: {'met' if figures['idle_target_met'] else 'NOT met'});  "
          f"models equal after every superbatch: {figures['models_equal']};  same losses: {figures['same_losses']}")
    return figures
