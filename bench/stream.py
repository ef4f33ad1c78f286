"""`diskflow bench stream`: streaming vs prepare-then-train, on the same cluster and dataset, in one run.

The cluster is the embedded split cluster: `--cpu-workers` single-threaded CPU workers and one
GPU-resource worker (`--device`). Three measurements, in this order, on that one cluster:

* ``prepare_s`` — `belady.prepare` of the whole round (all `--epochs`), its tasks restricted to
  the CPU workers (``dask.annotate(workers=...)``);
* ``train_s`` — `train_packed` of that packed round, as one task on the GPU worker (same process,
  threads and device as the streamed trainer);
* ``stream_s`` — the streamed run (`flow.stream.StreamRun`): from its first submission to the end
  of its last ``train`` task, with ``gpu_idle_fraction`` = 1 - (time in ``train`` tasks) / ``stream_s``.

Streaming overlaps the two machines' work, so its target is ``stream_s <= 1.15 x max(prepare_s,
train_s)`` rather than their sum. The setup, the same for all three runs:

* Two machines on one box: the CPU workers and this process (the client, the embedded
  scheduler, the nannies: what runs on the preprocessing machine of a split run) on the first
  cores, the GPU worker alone on the others (``--no-pin``: no pinning).
* The workers' memory allocator keeps what it frees (`flow.allocator`: glibc's mmap threshold
  32 MiB, trim threshold 256 MiB), set on every worker before anything is measured; the GPU
  worker's plugin does this in any split run. Dask starts its workers with
  ``MALLOC_TRIM_THRESHOLD_=65536``, which fixes glibc's thresholds so that every allocation above
  128 KiB is mapped and unmapped again: training on the CPU device (per-batch tensors of
  megabytes) then spends about half its time in page faults. ``--dask-malloc`` keeps Dask's
  setting on every worker.
* The same model, seed, batches and evaluation (val/test once, after the last epoch) offline
  and streamed; the bench checks that their per-batch losses are identical.
* The machine is shared and noisy: everything is measured ``--repeats`` times (default 5),
  interleaved (prepare, train, stream, prepare, ...), and each measurement's fastest is kept,
  as `diskflow bench compare` does; the raw times are in the JSON (``runs_s``), and the ratio of
  the medians is printed next to the headline (``stream_over_max_median``).
* The default dataset and model are sized so that preparing and training a round take
  comparable time on a 2-core machine (narrow features and a small GraphSAGE: a batch trains
  in about 9 ms), with the streaming default of 32 batches per superbatch; the round has 12
  epochs (24 superbatches), so the stream's fill (the first superbatch must be prepared before
  anything can train, about 5% of the round here) weighs less than in a two-epoch toy, though
  still more than in a real run of hundreds of superbatches. Out of core by default: the CPU
  budget is the trainer's staging and I/O buffers plus a quarter of the features, so that the
  CPU tier holds at most a quarter of the rows (as `--gpus N` sizes it) and the rest is packed,
  shipped and read from the scratch disk; the JSON's ``packed_read_fraction`` is the share of
  the trained rows read from packed files (``--cpu-memory`` gives another budget). Every superbatch costs the GPU worker a fixed share (its ship and train tasks
  and their messages, the transfer, a loader pipeline that drains and refills: about 15 ms on
  this box's one core, as much as two batches' training): ``--superbatch-size 16`` doubles
  that share for the same batches.

Where the streamed run's time goes (`stream_breakdown`, printed): ``fill_s`` (first submission
to the first ``train`` start), ``train_busy_s`` (the ``train`` tasks), ``gaps_s`` (the GPU worker
idle between them; ``starved_s`` of that while the next superbatch had not arrived), with
``stream_s = fill_s + train_busy_s + gaps_s``, and the CPU seconds each side used in every run
(``cpu_s``: the GPU worker, the CPU workers, this process with the scheduler; ``dashboard_overhead.cpu_s``
the same with the page open and without, medians of the repeats): streaming makes
the GPU worker's core also receive and stage every superbatch, and the scheduler's core also
drive a task graph of five tasks per superbatch. Where the cores are not independent (a shared
VM: caches, memory bandwidth, the host's scheduling), training slows down whenever the CPU
workers are busy, which streaming always makes them: the diagnostic ``train_contended_s`` is the
offline training again while the CPU workers prepare the same round over and over, and
``stream_over_max_contended`` = stream_s / max(prepare_s, train_contended_s) is what the stream
achieves against that. It is a diagnostic next to the headline, not a replacement for it.

``dashboard_overhead``: every repeat streams twice, in turns, once with the scheduler's diskflow page
open (headless Chromium where installed, pinned to the preprocessing cores, and an HTTP poller of
its data every 0.5 s, `bench.pageload`) and once without; the training throughput (batches per
second of the streamed run, fastest of the repeats) with the page may be at most 2% lower.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import fanouts_option
from .common import print_table

__all__ = ["PAGE_LIMIT", "TARGET", "add_arguments", "page_cpu_s", "run", "stream_breakdown"]

TARGET = 1.15
PAGE_LIMIT = 0.02       # the diskflow page open and polled may cost at most this share of training throughput

from .pageload import PageWatcher, overhead, page_of
from .stream_gpus import quarter_budget
from .streamsetup import bench_store, pin, set_up_cluster


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Dataset, round, model and cluster of the comparison."""
    p.add_argument("--dataset", default=None, metavar="STORE", help="an ingested store (default: a synthetic graph)")
    p.add_argument("--work", default="bench-data/stream", metavar="DIR",
                   help="where the synthetic store is kept between runs (default bench-data/stream)")
    p.add_argument("--nodes", type=int, default=100_000, help="synthetic graph: nodes (default 100000)")
    p.add_argument("--dim", type=int, default=16, help="synthetic graph: feature dimension (default 16)")
    p.add_argument("--train-frac", type=float, default=0.30, help="synthetic graph: training share (default 0.30)")
    p.add_argument("--fanouts", type=fanouts_option(), default=(15, 10), help="per-hop fanouts (default 15,10)")
    p.add_argument("--batch-size", type=int, default=512, help="seeds per batch (default 512)")
    p.add_argument("--superbatch-size", type=int, default=32,
                   help="batches per superbatch (default 32, as `diskflow run streaming`)")
    p.add_argument("--epochs", type=int, default=12, help="epochs (default 12)")
    p.add_argument("--window", type=int, default=3, help="streaming window, superbatches (default 3)")
    p.add_argument("--model", default="sage", help="model (default sage)")
    p.add_argument("--hidden", type=int, default=4, help="hidden channels (default 4)")
    p.add_argument("--cpu-memory", default=None, metavar="SIZE",
                   help="the trainer's host budget for features (CPU tier + staging + I/O buffers; bytes, '12MiB' or "
                        "'10%%' of the features), as `diskflow run`'s; default: the staging and I/O buffers plus a "
                        "quarter of the features (out of core: the CPU tier holds at most a quarter of the rows)")
    p.add_argument("--cpu-workers", type=int, default=1, help="CPU workers (default 1)")
    p.add_argument("--device", default="cpu", help="the GPU worker's device (default cpu)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the trainer (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the graph, the samples and the model")
    p.add_argument("--no-pin", action="store_true",
                   help="do not pin the preprocessing side (CPU workers, scheduler, driver) and the GPU worker to "
                        "separate cores (pinning emulates two machines on one box)")
    p.add_argument("--dask-malloc", action="store_true",
                   help="keep Dask's allocator setting on the workers (MALLOC_TRIM_THRESHOLD_=65536: every "
                        "allocation above 128 KiB mapped and unmapped again) instead of letting them reuse memory")
    p.add_argument("--no-contended", action="store_true",
                   help="skip the diagnostic third training run, made while the CPU workers prepare the round again")
    p.add_argument("--repeats", type=int, default=5,
                   help="measure everything this many times, interleaved, and keep each measurement's fastest "
                        "(default 5; this machine is shared and noisy)")
    p.add_argument("--gpus", type=int, default=1,
                   help="GPU workers: with N > 1 the bench streams data-parallel on N GPU workers instead (once per "
                        "--cache mode, fastest of --repeats each), its CPU budget by default a quarter of the "
                        "features per worker (so disk reads matter), and reports each worker's idle share, whether "
                        "the models stayed equal and the GPU workers' disk reads (default 1)")
    p.add_argument("--cache", default=None, metavar="MODES",
                   help="--gpus N: the cache modes to run, comma-separated (default: every mode there is)")
    p.add_argument("--page-watcher", choices=("browser", "http"), default="browser",
                   help="dashboard_overhead: watch the diskflow page in headless Chromium (where installed) and over "
                        "HTTP, or over HTTP only (default browser)")
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="keep the fastest streamed run's report and timeline here (report.json, timeline.png)")






def _process_cpu_s() -> float:
    """CPU seconds (user + system) this process has used."""
    t = os.times()
    return t.user + t.system


class _CpuClock:
    """CPU seconds used by the GPU worker, the CPU workers and this process (client, scheduler, nannies)."""

    def __init__(self, client: Any, cpus: list[str], gpu: list[str]) -> None:
        self.client, self.cpus, self.gpu = client, cpus, gpu

    def read(self) -> dict[str, float]:
        per = self.client.run(_process_cpu_s)
        return {"gpu_worker": sum(per[a] for a in self.gpu), "cpu_workers": sum(per[a] for a in self.cpus),
                "scheduler_driver": _process_cpu_s()}

    @staticmethod
    def since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {k: after[k] - before[k] for k in before}


def _prepare_until(stop: threading.Event, store: Path, work: Path, cfg: Any, cpus: list[str]) -> int:
    """Prepare the round again and again on the CPU workers until `stop` is set; how many times it started."""
    import dask

    from ..flow.prepare import prepare

    n = 0
    while not stop.is_set():
        out = work / f"again-{n}"
        n += 1
        with dask.annotate(workers=cpus, allow_other_workers=False):
            prepare(store, out, cfg, quiet=True)
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(f"{out}.work", ignore_errors=True)
    return n




def _train_task(packed: str, run_dir: str, options: dict[str, Any]) -> dict[str, Any]:
    """The offline trainer as a task on the GPU worker (its device and threads)."""
    from ..operators.train.trainer import train_packed

    t = time.perf_counter()
    report = train_packed(packed, run_dir, **options)
    return {"seconds": time.perf_counter() - t, "losses": [x for r in report["epochs"] for x in r["losses"]],
            "train_s": report["final"]["train_s"]}






def stream_breakdown(report: dict[str, Any]) -> dict[str, Any]:
    """Where a streamed run's time went, from its report's timeline (stream clock, seconds).

    Returns:
        ``fill_s`` (first submission to the first train start), ``train_busy_s`` (in train
        tasks), ``gaps_s`` (idle between train tasks), ``starved_s`` (of the gaps, the time the
        next superbatch had not been shipped yet), ``max_gap_s``, ``tail_s`` (after the last
        superbatch was shipped: the training nothing could overlap any more), ``train_task_extra_s``
        (train-task time outside the training loops), with stream_s = fill + busy + gaps.
    """
    tl = sorted(report["timeline"], key=lambda e: e["index"])
    spans = [(e["phases"]["train"]["start"], e["phases"]["train"]["end"]) for e in tl]
    gaps = [max(0.0, b[0] - a[1]) for a, b in itertools.pairwise(spans)]
    starved = [max(0.0, min(e["shipped"], b[0]) - a[1]) for a, b, e in zip(spans, spans[1:], tl[1:])]
    busy = sum(b - a for a, b in spans)
    loops = sum(float(r.get("epoch_s") or 0.0) for r in report.get("epochs", []))
    end = spans[-1][1] if spans else 0.0
    return {"fill_s": spans[0][0] if spans else 0.0, "train_busy_s": busy, "gaps_s": sum(gaps),
            "starved_s": sum(starved), "max_gap_s": max(gaps, default=0.0),
            "tail_s": end - max((e["shipped"] for e in tl), default=0.0), "train_task_extra_s": busy - loops,
            "stream_s": end}


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.gpus > 1:
        from .stream_gpus import run_gpus

        return run_gpus(args)
    if args.gpus < 1:
        from ..errors import ConfigError

        raise ConfigError("--gpus", f"expected an integer >= 1, got {args.gpus}")
    if args.cache is not None:
        from ..errors import ConfigError

        raise ConfigError("--cache", "applies to several GPU workers (--gpus N)")
    import dask
    from distributed import get_task_stream

    from ..api import prepare_options
    from ..errors import ConfigError
    from ..flow.pipeline import load_pipeline
    from ..flow.plugin import GPU
    from ..flow.prepare import prepare
    from ..flow.roles import stream_client
    from ..flow.runtimes.packed import packed_budgets
    from ..flow.stream import StreamConfig, StreamRun
    from ..operators.formats.store import Store
    from ..operators.stream.train import StreamTrainConfig

    if args.repeats < 1:
        raise ConfigError("--repeats", f"expected an integer >= 1, got {args.repeats}")
    store = Store(bench_store(args))
    budgets = packed_budgets(store, args.cpu_memory, 0, None, args.fanouts, args.batch_size)
    if args.cpu_memory is None:     # out of core: a CPU tier of at most a quarter of the features, as --gpus N's
        budgets["cpu_memory"] = quarter_budget(store, args, 1, budgets["staging_batches"], budgets["io_reserve"])
    round_opts = {"fanouts": tuple(args.fanouts), "batch_size": args.batch_size, "superbatch_size": args.superbatch_size,
                  "epochs": args.epochs, "seed": args.seed}
    belady = load_pipeline("belady")
    # the budgets above (staging buffers included), as the streamed run's, for the device the round trains on
    options = prepare_options(belady, store, cpu_memory=budgets["cpu_memory"], **round_opts)
    cfg = belady.prepare_config(**{**options, "device": "cuda" if args.device.startswith("cuda") else "cpu"})
    tmp = Path(tempfile.mkdtemp(prefix="diskflow-bench-stream-", dir=args.work if not args.dataset else None))
    evaluate_once = args.epochs + 1      # val/test after the last epoch only, offline and streamed alike
    train_opts = {"model": args.model, "hidden": args.hidden, "lr": 3e-3, "dropout": 0.2, "seed": args.seed,
                  "threads": args.threads, "device": args.device, "eval_every": evaluate_once,
                  "cpu_memory": budgets["cpu_memory"]}
    affinity = sorted(os.sched_getaffinity(0))
    runs: dict[str, list[float]] = {"prepare": [], "train": [], "contended": [], "stream": [], "stream_page": []}
    watched: dict[str, Any] = {}
    losses: list[list[float]] = []         # offline and streamed, every repeat
    cpu: dict[str, list[dict[str, float]]] = {"prepare": [], "train": [], "stream": [], "stream_page": []}
    best: dict[str, Any] = {}
    try:
        with stream_client(None, cpu_workers=args.cpu_workers, scratch=str(tmp / "scratch"), device=args.device,
                           keep_freed_memory=not args.dask_malloc) as client:
            gpu, cpus, pinned, allocator = set_up_cluster(client, args)
            clock = _CpuClock(client, cpus, gpu)
            tcfg = StreamTrainConfig(model=args.model, hidden=args.hidden, seed=args.seed, epochs=args.epochs,
                                     fanouts=tuple(args.fanouts), batch_size=args.batch_size,
                                     cpu_memory=budgets["cpu_memory"], threads=args.threads,
                                     eval_every=evaluate_once, store=str(store.path))
            scfg = StreamConfig(train=tcfg, cpu_memory=budgets["cpu_memory"], io_reserve=budgets["io_reserve"],
                                staging_batches=budgets["staging_batches"], window=args.window,
                                checkpoint_every=1_000_000, device=args.device, **round_opts)
            for repeat in range(args.repeats):      # interleaved: prepare, train, (contended), stream
                work = tmp / f"r{repeat}"
                work.mkdir()
                # -- prepare, then train -------------------------------------------------------------------
                c0 = clock.read()
                t = time.perf_counter()
                with dask.annotate(workers=cpus, allow_other_workers=False), get_task_stream(client) as ts:
                    prepare(store.path, work / "packed", cfg, quiet=True)
                runs["prepare"].append(time.perf_counter() - t)
                cpu["prepare"].append(clock.since(c0, clock.read()))
                leaked = sorted({str(x["key"]) for x in ts.data if x["worker"] in gpu})
                if leaked:
                    raise RuntimeError(f"prepare tasks ran on the GPU worker: {leaked[:3]}")
                (work / "train").mkdir()
                c0 = clock.read()
                offline = client.submit(_train_task, str(work / "packed"), str(work / "train"), train_opts,
                                        resources={GPU: 1}, workers=gpu, pure=False).result()
                runs["train"].append(offline["seconds"])
                cpu["train"].append(clock.since(c0, clock.read()))
                losses.append(offline["losses"])
                if not args.no_contended:     # the same training while the CPU workers prepare (diagnostic)
                    (work / "contended").mkdir()
                    fut = client.submit(_train_task, str(work / "packed"), str(work / "contended"), train_opts,
                                        resources={GPU: 1}, workers=gpu, pure=False)
                    stop = threading.Event()
                    with concurrent.futures.ThreadPoolExecutor(1) as pool:    # submits nothing while it runs
                        again = pool.submit(_prepare_until, stop, store.path, work, cfg, cpus)
                        runs["contended"].append(fut.result()["seconds"])
                        stop.set()
                        again.result()
                shutil.rmtree(work / "packed")
                # -- streaming, and streaming with the diskflow page open (in turns, first one then the other) --
                for watch in (False, True) if repeat % 2 == 0 else (True, False):
                    if watch:
                        c0 = clock.read()
                        with PageWatcher(page_of(client) or "", pinned.get("driver", ()),
                                         browser=args.page_watcher == "browser") as watcher:
                            rep = StreamRun(client, store.path, work / "stream-page", scfg, progress=False).run()
                        cpu["stream_page"].append(clock.since(c0, clock.read()))
                        runs["stream_page"].append(float(rep["stream"]["stream_s"]))
                        watched = watcher.figures()
                        losses.append([x for r in rep["epochs"] for x in r["losses"]])
                        continue
                    c0 = clock.read()
                    rep = StreamRun(client, store.path, work / "stream", scfg, progress=False).run()
                    cpu["stream"].append(clock.since(c0, clock.read()))
                    runs["stream"].append(float(rep["stream"]["stream_s"]))
                    losses.append([x for r in rep["epochs"] for x in r["losses"]])
                    if rep["stream"]["stream_s"] <= min(runs["stream"]):
                        best = rep
                shutil.rmtree(work)
                print(f"repeat {repeat + 1}/{args.repeats}: " + ", ".join(     # a long bench shows it is alive
                    f"{name} {runs[name][-1]:.2f} s" for name in runs if runs[name]), file=sys.stderr, flush=True)
            if args.keep:
                from ..flow.rundir import write_report
                from ..flow.timeline import plot_timeline

                keep = Path(args.keep)
                keep.mkdir(parents=True, exist_ok=True)
                write_report(keep, best)
                plot_timeline(keep, best)
    finally:
        pin(affinity)
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
    rep = best
    prepare_s, train_s, stream_s = min(runs["prepare"]), min(runs["train"]), min(runs["stream"])
    contended_s = min(runs["contended"]) if runs["contended"] else None
    parts = stream_breakdown(rep)
    same = all(x == losses[0] for x in losses)
    longest = max(prepare_s, train_s)
    longest_contended = max(prepare_s, contended_s) if contended_s is not None else None
    figures = {
        "stream_s": stream_s, "prepare_s": prepare_s, "train_s": train_s,
        "gpu_idle_fraction": rep["stream"]["gpu_idle_fraction"],
        "sum_s": prepare_s + train_s, "stream_over_max": stream_s / longest,
        "stream_over_max_median": statistics.median(runs["stream"]) / max(statistics.median(runs["prepare"]),
                                                                          statistics.median(runs["train"])),
        "stream_over_sum": stream_s / (prepare_s + train_s), "target": TARGET,
        "target_met": stream_s <= TARGET * longest, "same_losses": same,
        "superbatches": rep["stream"]["superbatches"], "window": args.window, "epochs": args.epochs,
        "batches": rep["dataset"]["batches"], "cpu_workers": args.cpu_workers, "device": args.device,
        "dataset": {"store": str(store.path), "nodes": store.num_nodes, "dim": store.feature_dim,
                    "feature_bytes": store.feature_bytes},
        "scratch_peak_bytes": rep["stream"]["scratch"].get("peak_disk"),
        "pinned": pinned, "allocator": allocator, "train_contended_s": contended_s,
        "stream_over_max_contended": stream_s / longest_contended if longest_contended else None,
        "repeats": args.repeats, "runs_s": runs,
        "cpu_s": {k: v[runs[k].index(min(runs[k]))] for k, v in cpu.items()},     # of each fastest run
        "ship_busy_s": sum(e["phases"]["ship"]["end"] - e["phases"]["ship"]["start"] for e in rep["timeline"]),
        "breakdown": parts, "streamed_train_over_offline": parts["train_busy_s"] / train_s,
        "features": _feature_tiers(rep, store.num_nodes),
        "packed_read_fraction": _packed_read_fraction(rep),
        "dashboard_overhead": {**overhead(runs["stream_page"], runs["stream"], rep["dataset"]["batches"],
                                          PAGE_LIMIT), **watched,
                               "cpu_s": page_cpu_s(cpu["stream_page"], cpu["stream"])},
    }
    # The CPU side's throughput beside the GPU worker's consumption, in feature accesses (rows read, any tier).
    acc = figures["features"]["accesses"]
    prep_cpu = figures["cpu_s"]["prepare"]["cpu_workers"]
    figures["throughput"] = {
        "accesses": acc, "prepare_accesses_per_s": acc / prepare_s,
        "prepare_accesses_per_cpu_s": acc / prep_cpu if prep_cpu > 0 else None,
        "train_accesses_per_s": acc / train_s, "streamed_train_accesses_per_s": acc / parts["train_busy_s"]
        if parts["train_busy_s"] > 0 else None, "prepare_over_train_rate": train_s / prepare_s}
    rows = [
        {"run": "prepare (offline, whole round)", "seconds": prepare_s, "x max": prepare_s / longest},
        {"run": "train (offline, whole round)", "seconds": train_s, "x max": train_s / longest},
        {"run": "prepare, then train", "seconds": prepare_s + train_s, "x max": (prepare_s + train_s) / longest},
        {"run": f"streaming (window {args.window})", "seconds": stream_s, "x max": stream_s / longest},
    ]
    if contended_s is not None:
        rows.insert(2, {"run": "train while the CPU workers prepare (diagnostic)", "seconds": contended_s,
                        "x max": contended_s / longest})
    print_table(f"streaming vs prepare-then-train: {store.num_nodes:,} nodes x {store.feature_dim}, "
                f"{figures['batches']} batches in {figures['superbatches']} superbatches ({args.epochs} epochs), "
                f"{args.cpu_workers} CPU worker(s) + 1 GPU worker ({args.device}); cores "
                f"{_cores(pinned, cpus, gpu)}; allocator: {allocator}"
                + (f"; fastest of {args.repeats} interleaved repeats" if args.repeats > 1 else ""),
                rows, ["run", "seconds", "x max"])
    print(f"\nGPU worker idle while streaming: {figures['gpu_idle_fraction'] * 100:.1f}%   "
          f"target stream <= {TARGET} x max(prepare, train): {'met' if figures['target_met'] else 'NOT met'} "
          f"({figures['stream_over_max']:.2f} x)   same losses: {same}")
    if args.repeats > 1:
        print(f"spread of the {args.repeats} repeats (seconds): " + ", ".join(
            f"{k} {min(v):.2f}-{max(v):.2f}" for k, v in runs.items() if v)
            + f"; the medians' ratio stream / max(prepare, train) is {figures['stream_over_max_median']:.2f} x")
    print(f"streamed run = fill {parts['fill_s']:.2f} s (tiers and the first superbatch prepared and shipped) + "
          f"training {parts['train_busy_s']:.2f} s ({figures['streamed_train_over_offline']:.2f} x the offline "
          f"training) + gaps {parts['gaps_s']:.2f} s (waiting for a superbatch {parts['starved_s']:.2f} s, "
          f"longest gap {parts['max_gap_s']:.3f} s)")
    f = figures["features"]
    print(f"features: CPU tier {f['cpu_rows']:,} of {store.num_nodes:,} rows ({f['cpu_share'] * 100:.0f}%), GPU tier "
          f"{f['gpu_rows']:,}; packed (read from the scratch disk) while streaming: {f['packed_bytes'] / 2**20:.1f} MiB, "
          f"{f['packed_share'] * 100:.1f}% of the feature reads; bundles {f['bundle_bytes'] / 2**20:.1f} MiB per superbatch, "
          f"{f['held_bytes'] / 2**20:.1f} MiB of it index and samples held in the GPU worker's memory")
    th = figures["throughput"]
    print(f"feature accesses: the CPU workers prepare {th['prepare_accesses_per_s']:,.0f} per second "
          f"({th['prepare_accesses_per_cpu_s'] or 0:,.0f} per CPU second of the CPU workers); the GPU worker consumes "
          f"{th['train_accesses_per_s']:,.0f} per second training offline"
          + (f", {th['streamed_train_accesses_per_s']:,.0f} while streaming" if th["streamed_train_accesses_per_s"]
             else "") + f" ({th['accesses']:,} accesses in the round; preparation runs at "
          f"{th['prepare_over_train_rate']:.2f} x the training's rate)")
    d = figures["dashboard_overhead"]
    print(f"packed reads: {figures['packed_read_fraction'] * 100:.1f}% of the rows the GPU worker trained on came "
          f"from packed files on its scratch disk (CPU tier {f['cpu_share'] * 100:.0f}% of the features)")
    print(f"dashboard overhead: {d['batches_per_s_with_page']:.1f} batches/s with the diskflow page open "
          f"({d['watcher']}, {d['polls']} polls of its data) vs {d['batches_per_s_without']:.1f} without: "
          f"{d['throughput_cost'] * 100:+.1f}% (limit {PAGE_LIMIT * 100:.0f}%: "
          f"{'met' if d['within_limit'] else 'NOT met'})")
    pc = d["cpu_s"]
    print("the page's cost in CPU seconds (medians of the repeats, with the page / without): GPU worker "
          f"{pc['gpu_worker']['with_page']:.2f} / {pc['gpu_worker']['without']:.2f}, scheduler, nannies and driver "
          f"{pc['scheduler_driver']['with_page']:.2f} / {pc['scheduler_driver']['without']:.2f}")
    c = figures["cpu_s"]
    print("CPU seconds used (GPU worker / CPU workers / scheduler, nannies and driver): "
          + ", ".join(f"{k} {c[k]['gpu_worker']:.2f} / {c[k]['cpu_workers']:.2f} / {c[k]['scheduler_driver']:.2f}"
                      for k in ("prepare", "train", "stream"))
          + f"; ship tasks on the GPU worker {figures['ship_busy_s']:.2f} s")
    if contended_s is not None:
        print(f"diagnostic: training while the CPU workers prepared took {contended_s / train_s:.2f} x its time alone "
              f"(where cores are not independent, streaming, which runs both at once, pays this); against "
              f"max(prepare, train while preparing) = {longest_contended:.2f} s the stream takes "
              f"{figures['stream_over_max_contended']:.2f} x")
    return figures


def page_cpu_s(with_page: Sequence[dict[str, float]], without: Sequence[dict[str, float]]
               ) -> dict[str, dict[str, float]]:
    """The CPU seconds each side spent on a streamed run with the page open and without it (medians of the
    repeats, per side of `_CpuClock`). Wall time spreads more between repeats than the page can cost; CPU
    seconds spread less, and say on which side the page's work lands."""
    return {side: {"with_page": statistics.median(c[side] for c in with_page),
                   "without": statistics.median(c[side] for c in without)}
            for side in with_page[0]}


def _feature_tiers(report: dict[str, Any], num_nodes: int) -> dict[str, Any]:
    """Where the streamed run's feature rows came from: tier sizes, packed rows and bytes, bundle sizes (and the
    part of them the GPU worker held in memory instead of staging it on disk)."""
    tiers = report["stream"].get("tiers", {})
    figs = [e.get("figures", {}) for e in report["timeline"]]
    packed_rows = sum(int(f.get("packed_rows", 0)) for f in figs)
    reads = packed_rows + sum(int(f.get("cpu_hits", 0)) + int(f.get("gpu_hits", 0)) for f in figs)
    bundles = [int(e.get("bytes", 0)) for e in report["timeline"]]
    held = [int(e.get("held_bytes") or 0) for e in report["timeline"]]
    return {"accesses": reads, "cpu_rows": int(tiers.get("cpu_rows", 0)), "gpu_rows": int(tiers.get("gpu_rows", 0)),
            "cpu_share": int(tiers.get("cpu_rows", 0)) / num_nodes if num_nodes else 0.0,
            "packed_rows": packed_rows, "packed_bytes": sum(int(f.get("packed_bytes", 0)) for f in figs),
            "packed_share": packed_rows / reads if reads else 0.0,
            "bundle_bytes": statistics.mean(bundles) if bundles else 0.0,
            "held_bytes": statistics.mean(held) if held else 0.0}


def _packed_read_fraction(report: dict[str, Any]) -> float:
    """Of the feature rows the streamed run's trainer assembled, the share read from packed files on the scratch
    disk (its loader's rows per tier, report.json's ``trainer.tiers``)."""
    rows = (report.get("trainer") or {}).get("tiers", {}).get("rows", {})
    total = sum(int(v) for v in rows.values())
    return int(rows.get("packed", 0)) / total if total else 0.0


def _cores(pinned: dict[str, list[int]], cpus: list[str], gpu: list[str]) -> str:
    if not pinned:
        return "not pinned"
    prep = sorted({c for a in [*cpus, "driver"] for c in pinned.get(a, [])})
    train = sorted({c for a in gpu for c in pinned.get(a, [])})
    return f"{prep} preprocessing + scheduler, {train} GPU worker"
