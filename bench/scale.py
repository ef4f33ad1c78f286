"""`diskflow bench scale`: one run whose node features are larger than this machine's RAM, phase by phase.

The other benchmarks stay inside a tuned corner (features of a few GiB, page cache to spare). This
one writes a graph whose features exceed the machine's memory (default 14M nodes x 512 float32 =
26.7 GiB against 23.5 GiB of RAM; the wide dim keeps the topology under 1 GiB), then runs the four
phases of the pipeline, each in its own child process (``python -m diskflow.bench.scale --child``):

========  =====================================================================================
synth     `flow.synth.run_synth` on an embedded Dask LocalCluster (``--workers`` processes)
ingest    `flow.ingest.run_ingest` on a LocalCluster: raw shards -> store
prepare   belady's `prepare` on a LocalCluster, feature budget ``--feature-budget`` (10% of the
          features) as ``--cpu-memory``: sample, plan, pack
train     one epoch of GraphSAGE with the packed pipeline (`operators.trainer.train_packed`,
          belady's CPU tier = the feature budget), no evaluation
========  =====================================================================================

How it is measured (docs/design.md, "How it is measured"):

* **Memory.** synth, ingest and prepare run in a memory cgroup (`bench.cgroup`, page cache counted)
  the size of a cheap preprocessing box: the topology (indptr + indices) plus ``--worker-memory``
  (2 GiB) per Dask worker. The workers are processes the child starts, so they are in that cgroup
  too (checked: each worker reports its own cgroup). Dask's own per-worker memory limit is off, so
  the kernel's cgroup is the only limit. The peak memory of every task is measured, not assumed
  (`bench.taskmemory`): a worker plugin resets the worker's ``VmHWM`` when a task starts executing
  and reads it when the task ends (one thread per worker, so one task at a time), and a thread
  samples its anonymous memory (``RssAnon + RssShmem``) every 10 ms. RSS also counts mapped file
  pages (the memory-mapped topology of a sample task, shared libraries), which are page cache,
  charged to whichever cgroup read them first; the anonymous peak is what a task itself holds. The
  table shows the largest task per phase and, per task group, both peaks and the worker's baseline
  before any task. train runs in a cgroup of the feature budget plus an allowance measured as
  `bench compare` does (peak RSS of a probe that imports torch and PyG, loads the stored samples and
  trains the largest batch, + 25%, + the other assembled batches the CPU trainer holds); its "task"
  is the trainer process, whose ``VmHWM`` is read after the last batch. Nothing in prepare or train
  can hold O(features): their cgroups are a fraction of the feature bytes.
* **Disk traffic** of a phase is ``read_bytes`` and ``write_bytes - cancelled_write_bytes`` of
  ``/proc/self/io`` in the child, read after its cluster has closed: every worker it reaped has
  added its counters by then (checked against what the workers read themselves just before). The
  disk's floor is the phase's bytes at the sequential read and write bandwidths measured in the same
  run (O_DIRECT, `bench.prepare.disk_bandwidth`). Each phase starts with its input evicted from the
  page cache (``posix_fadvise(DONTNEED)`` per file). CPU time is the child's and its reaped
  descendants' (``wait4``).
* **Disk space.** Before anything is written the byte plan (raw + store + ingest's edge spill at
  ingest's peak; store + a worst-case packed dataset after) is checked against the free space less
  ``DISK_RESERVE``; it fails in one line naming the bytes needed and free. It is checked again with
  the real sizes after synth and after ingest; when the packed dataset would not fit next to the raw
  input and the store, the raw input is deleted after ingest (the table says so).

Defaults are chosen so that one epoch trains in minutes on 2 cores: 0.5% of the nodes are training
seeds (~70k: ~69 batches of 1024), fanouts 10,5, GraphSAGE with 32 hidden channels, one epoch.
``--nodes/--dim`` make it small enough to try (``--nodes 200000 --dim 64``). Everything written
goes to ``--workdir`` and is removed at the end unless ``--keep``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config import fanouts_option
from ..errors import ConfigError, DiskflowError, InputError
from ..flow.options import byte_budget
from ..operators.formats.sizes import format_bytes, parse_bytes
from ..operators.options import CPU_SHARE, INGEST_MEMORY
from .child import read_child_spec, write_child_out
from .common import add_graph_arguments, print_table

__all__ = ["CHILDREN", "DEFAULT_DIM", "DEFAULT_NODES", "DEFAULT_WORKDIR", "DISK_RESERVE", "EDGE_SLACK",
           "MARKER", "OUTPUTS", "PHASES", "RAW_EDGE_BYTES", "RAW_NODE_BYTES", "SMALL_FILES", "TEST_FRAC",
           "VAL_FRAC", "BytePlan", "DiskWatch", "Floors", "add_arguments", "byte_plan", "run",
           "smallest_budget", "worst_batch_rows"]

DEFAULT_NODES = 14_000_000         # x 512 float32 = 26.7 GiB of features
DEFAULT_DIM = 512
DEFAULT_WORKDIR = Path("bench-data") / "scale"
PHASES = ("synth", "ingest", "prepare", "train")
VAL_FRAC = TEST_FRAC = 0.0005      # unused (no evaluation); small so the raw nodes stay cheap
DISK_RESERVE = 2 << 30             # free space the run never plans to use (other users of the disk)
MARKER = "bench-scale.json"        # marks a work directory as this benchmark's (safe to clear)
OUTPUTS = ("raw", "store", "packed", "packed.work", "runs")
# Worst-case bytes of the raw input per edge (src, dst int64 in snappy Parquet; they do compress)
# and per node (node_id and label int64, split code, and the features' node_id column).
RAW_EDGE_BYTES = 16
RAW_NODE_BYTES = 32
EDGE_SLACK = 1.10                  # stored edges over nodes x avg_degree (self-loops and duplicates removed)
SMALL_FILES = 64 << 20             # manifests, tier ids, plans' own overhead


# ---------------------------------------------------------------------------- options


FEATURE_SHARE = f"{CPU_SHARE:.0%}"     # the feature budget's default: the library's CPU share

def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `diskflow bench scale`."""
    add_graph_arguments(p, nodes=DEFAULT_NODES, dim=DEFAULT_DIM, train_frac=0.005,
                        size_note=f"with --dim {DEFAULT_DIM}, 26.7 GiB of float32 features, more than this machine's RAM",
                        train_note="~69 batches of 1024 at the default size, so one epoch takes minutes")
    p.add_argument("--seed", type=int, default=0, help="seed of the graph, the samples and the model")
    p.add_argument("--fanouts", type=fanouts_option(), default=(10, 5), help="per-hop fanouts (default 10,5)")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per minibatch (default 1024)")
    p.add_argument("--superbatch-size", type=int, default=16, help="batches per superbatch (default 16)")
    p.add_argument("--hidden", type=int, default=32, help="GraphSAGE hidden channels (default 32)")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 3e-3)")
    p.add_argument("--threads", type=int, default=None, help="torch threads of the trainer (default: torch's)")
    p.add_argument("--queue-depth", type=int, default=2, help="trainer queue depth (default 2)")
    p.add_argument("--workers", type=int, default=None,
                   help="Dask worker processes of synth, ingest and prepare (default one per core)")
    p.add_argument("--worker-memory", default="2GiB",
                   help="memory per Dask worker: the preprocessing cgroup is the topology plus this per worker "
                        "(default 2GiB)")
    p.add_argument("--memory-budget", default=INGEST_MEMORY,
                   help="ingest's memory budget per task (default %(default)s)")
    p.add_argument("--feature-budget", default=FEATURE_SHARE,
                   help="host memory for features, bytes or a share of the feature bytes (default %(default)s): "
                        "prepare's and the trainer's --cpu-memory, and with the measured allowance the train "
                        "phase's cgroup")
    p.add_argument("--readahead", default="1GiB",
                   help="prepare's --readahead: shard bytes read into the page cache while sampling and "
                        "planning (default 1GiB; 0 = off)")
    p.add_argument("--bw-bytes", type=int, default=1 << 30,
                   help="bytes written and read back (O_DIRECT) to measure the disk's floor (default 1 GiB)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds one phase may take (default 3600)")
    p.add_argument("--no-cgroup", action="store_true",
                   help="run without memory cgroups (no limits; the table says so)")
    p.add_argument("--workdir", default=str(DEFAULT_WORKDIR),
                   help=f"where raw/, store/ and packed/ go (default ./{DEFAULT_WORKDIR}; tens of GiB at the "
                        "default size); a previous run's outputs there are removed first")
    p.add_argument("--keep", action="store_true", help="keep what the run wrote (default: remove it at the end)")


def _check_args(args: argparse.Namespace) -> None:
    for option, value in (("--nodes", args.nodes), ("--dim", args.dim), ("--batch-size", args.batch_size),
                          ("--superbatch-size", args.superbatch_size), ("--hidden", args.hidden),
                          ("--queue-depth", args.queue_depth), ("--part-nodes", args.part_nodes),
                          ("--bw-bytes", args.bw_bytes)):
        if value < 1:
            raise ConfigError(option, f"must be >= 1, got {value}")
    if args.nodes < 2:
        raise ConfigError("--nodes", f"must be >= 2, got {args.nodes}")
    if not 0 < args.train_frac < 1 - VAL_FRAC - TEST_FRAC:
        raise ConfigError("--train-frac", f"must be in (0, {1 - VAL_FRAC - TEST_FRAC}), got {args.train_frac}")
    if not args.avg_degree > 0:
        raise ConfigError("--avg-degree", f"must be > 0, got {args.avg_degree}")
    if args.workers is not None and args.workers < 1:
        raise ConfigError("--workers", f"must be >= 1, got {args.workers}")
    if args.threads is not None and args.threads < 1:
        raise ConfigError("--threads", f"must be >= 1, got {args.threads}")
    if not args.timeout > 0:
        raise ConfigError("--timeout", f"must be > 0 seconds, got {args.timeout}")
    if parse_bytes(args.worker_memory, "--worker-memory") <= 0:
        raise ConfigError("--worker-memory", f"must be > 0, got {args.worker_memory!r}")


# ---------------------------------------------------------------------------- the byte plan

@dataclass(frozen=True)
class BytePlan:
    """Disk bytes the run will hold, estimated before anything is written (upper bounds).

    Attributes:
        raw: the synthetic raw input (features with their node_id column, edges, nodes).
        store: the ingested store (feature shards, topology, labels, splits).
        spill: ingest's edge spill, inside the store's staging directory until ingest ends.
        packed: the packed dataset and prepare's work directory, every access a miss (the bound:
            the real plan hits the CPU tier), plus the CPU tier's initial rows and the samples.
        scratch: the bandwidth measurement's file (written and removed before synth).
        topology: indptr + indices (the preprocessing cgroup holds them).
    """

    raw: int
    store: int
    spill: int
    packed: int
    scratch: int
    topology: int

    @property
    def ingest_peak(self) -> int:
        return self.raw + self.store + self.spill

    def peak(self, free_raw: bool) -> int:
        """Most bytes on disk at once: at ingest's end, or while prepare and train run."""
        return max(self.scratch, self.ingest_peak, (0 if free_raw else self.raw) + self.store + self.packed)

    def needs_free_raw(self, available: int) -> bool:
        """Whether the raw input must go after ingest to make room for the packed dataset."""
        return self.raw + self.store + self.packed > available


def byte_plan(nodes: int, dim: int, itemsize: int, avg_degree: float, train_frac: float, batch_size: int,
              fanouts: tuple[int, ...], budget: int, memory_budget: int, bw_bytes: int) -> BytePlan:
    """The `BytePlan` of a run at these sizes (worst cases where the true figure is not known yet)."""
    from ..operators.formats.packed import ALIGN
    from ..operators.ingest.edges import indices_dtype, is_packed
    from ..operators.ingest.raw import shard_rows_for

    row_bytes = dim * itemsize
    edges = math.ceil(nodes * avg_degree * EDGE_SLACK)
    shards = -(-nodes // shard_rows_for(memory_budget, row_bytes, nodes))
    topology = (nodes + 1) * 8 + edges * np.dtype(indices_dtype(nodes)).itemsize
    raw = nodes * (row_bytes + RAW_NODE_BYTES) + edges * RAW_EDGE_BYTES + SMALL_FILES
    store = nodes * row_bytes + shards * ALIGN + topology + nodes * 9 + SMALL_FILES
    spill = edges * (8 if is_packed(nodes) else 16)
    rows = worst_batch_rows(nodes, batch_size, fanouts)
    batches = -(-math.ceil(nodes * train_frac * 1.05) // batch_size) + 1   # the split is drawn at random
    segments = batches * (rows * row_bytes + shards * ALIGN)
    samples = batches * rows * 8 * 6          # n_id + edge_index in samples, plans, routes and the index
    packed = segments + budget + samples + nodes * 8 + SMALL_FILES
    return BytePlan(raw=raw, store=store, spill=spill, packed=packed, scratch=bw_bytes, topology=topology)


def worst_batch_rows(nodes: int, batch_size: int, fanouts: tuple[int, ...]) -> int:
    """The most nodes a minibatch can hold: every hop multiplies the frontier by 1 + fanout."""
    rows = batch_size
    for f in fanouts:
        rows = min(nodes, rows * (1 + (nodes if f < 0 else f)))
    return rows


def smallest_budget(rows: int, row_bytes: int, shards: int, queue_depth: int) -> int:
    """The least feature budget the trainer can run in: its staging buffers for batches of `rows` rows
    and its I/O buffers, with an empty CPU tier (prepare checks it again with the largest batch it
    sampled)."""
    from ..operators.prepare.tiers import staging_piece_bytes
    from ..operators.train.memory import io_buffer_bytes
    from ..operators.trainbuffers import staging_count

    return staging_count("cpu", queue_depth, False) * staging_piece_bytes(rows, row_bytes, shards) + io_buffer_bytes()


def _no_room(need: int, what: str, work: Path, free: int) -> ConfigError:
    return ConfigError("--workdir", (
        f"the run needs {format_bytes(need)} of disk ({what}) but {work} has {format_bytes(free)} free, "
        f"{format_bytes(DISK_RESERVE)} of which it leaves to others; lower --nodes or --dim, or free space"))


def _free(work: Path) -> int:
    return shutil.disk_usage(work).free


def _du(path: Path) -> int:
    """Bytes allocated on disk under `path` (0 when it does not exist)."""
    if path.is_file():
        return path.stat().st_blocks * 512
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def _files(root: Path) -> dict[str, int]:
    """Every file under `root` with its size (what a phase created is the difference of two of these)."""
    out: dict[str, int] = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            with contextlib.suppress(OSError):
                out[os.path.relpath(p, root)] = os.stat(p).st_size
    return out


class DiskWatch:
    """The most bytes allocated under the work directory beyond what it held at the start, sampled
    every `interval` seconds on a thread (our own files only: other users of the disk, writing or
    freeing, do not move it)."""

    def __init__(self, path: Path, interval: float = 1.0) -> None:
        import threading

        self.path = path
        self.used0 = _du(path)
        self.peak = 0
        self._stop = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._run, name="diskflow-diskwatch", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self._interval)

    def sample(self) -> None:
        with contextlib.suppress(OSError):
            self.peak = max(self.peak, _du(self.path) - self.used0)   # a file gone mid-walk: next sample

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def _mem_total() -> int:
    """This machine's RAM (``MemTotal``), in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------------------- measuring tasks

@contextlib.contextmanager
def _measured_cluster(workers: int) -> Iterator[dict[str, Any]]:
    """A LocalCluster whose workers measure every task; on exit, fills in their reports."""
    from ..flow.cluster import dask_client
    from .taskmemory import TaskMemory, worker_report

    out: dict[str, Any] = {}
    with dask_client(n_workers=workers, memory_limit=0, quiet=True) as client:
        client.register_plugin(TaskMemory())    # type: ignore[attr-defined]
        yield out
        out["workers"] = list(client.run(worker_report).values())  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------- the children

def _child_synth(spec: dict[str, Any]) -> dict[str, Any]:
    from ..flow.synth import run_synth
    from ..operators.formats.manifest import read_manifest
    from ..operators.ingest.synth import SynthConfig

    raw = run_synth(SynthConfig(**spec["synth"]), spec["raw"])
    m = read_manifest(raw) or {}
    return {"num_nodes": m.get("num_nodes"), "num_edges": m.get("num_edges"), "feature_bytes": m.get("feature_bytes"),
            "split_counts": m.get("split_counts")}


def _child_ingest(spec: dict[str, Any]) -> dict[str, Any]:
    from ..flow.ingest import run_ingest

    r = run_ingest(spec["raw"], spec["store"], memory_budget=spec["memory_budget"], force=True)
    return {"num_nodes": r.num_nodes, "num_edges": r.num_edges, "input_bytes": r.input_bytes,
            "feature_bytes": r.feature_bytes, "num_shards": r.num_shards, "seconds": r.seconds}


def _child_prepare(spec: dict[str, Any]) -> dict[str, Any]:
    from ..flow.runtimes.packed import packed_budgets
    from ..operators.formats.store import Store
    from ..pipelines import belady

    store = Store(spec["store"])
    b = packed_budgets(store, spec["cpu_memory"], 0, None, spec["fanouts"], spec["batch_size"], spec["queue_depth"])
    r = belady.prepare(store.path, spec["packed"], cpu_memory=b["cpu_memory"], io_reserve=b["io_reserve"],
                       staging_batches=b["staging_batches"], fanouts=tuple(spec["fanouts"]),
                       batch_size=spec["batch_size"], superbatch_size=spec["superbatch_size"], epochs=1,
                       seed=spec["seed"], readahead=spec["readahead"], force=True, quiet=True)
    return {"seconds": r.seconds, "phases": r.phases, "figures": r.figures}


def _child_train(spec: dict[str, Any]) -> dict[str, Any]:
    """One epoch of the packed pipeline; its own clock, disk counters and peak RSS from inside."""
    from ..operators.train.trainer import train_packed
    from .prepare import proc_io
    from .taskmemory import AnonPeak, rss_parts

    anon = AnonPeak()                       # from the start: loading the CPU tier is part of the task
    st: dict[str, Any] = {"count": 0, "n": 0}

    def on_start(epoch: int, batches: int) -> None:
        st.update(n=batches, io0=proc_io(), t0=time.perf_counter(), cpu0=_cpu_self())

    def on_batch(_: int) -> None:
        st["count"] += 1
        if st["count"] == st["n"]:
            io = proc_io()
            parts = rss_parts()
            st["epoch"] = {"seconds": time.perf_counter() - st["t0"], "cpu_s": _cpu_self() - st["cpu0"],
                           "read_bytes": io.get("read_bytes", 0) - st["io0"].get("read_bytes", 0),
                           "batches": st["count"], "peak_rss_bytes": parts.get("VmHWM", 0),
                           "peak_anon_bytes": anon.peak(), "rss_at_end": parts}

    run_dir = Path(spec["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    report = train_packed(spec["packed"], run_dir, model="sage", hidden=spec["hidden"], lr=spec["lr"],
                          seed=spec["seed"], cpu_memory=spec["cpu_memory"], queue_depth=spec["queue_depth"],
                          threads=spec["threads"], store=spec["store"], evaluate=False, on_start=on_start,
                          on_batch=on_batch)
    rec = report["epochs"][0]
    losses = [float(x) for x in rec["losses"]]
    return {"epoch": st.get("epoch"), "loss": rec["loss"], "train_acc": rec["train_acc"], "losses": losses,
            "batches": len(losses), "epoch_s": rec["epoch_s"], "load_s": report["load_s"],
            "loader_bytes_read": report["io"]["bytes_read"], "useful_bytes": report["io"].get("useful_bytes"),
            "read_amplification": report["io"].get("read_amplification"), "tiers": report["tiers"],
            "memory": report["memory"], "stages": report["stages"]}


CHILDREN = {"synth": _child_synth, "ingest": _child_ingest, "prepare": _child_prepare, "train": _child_train}


def _cpu_self() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _child_main(argv: list[str]) -> int:
    """Entry of a phase's process: ``--child SPEC``; writes its figures to the spec's ``out``."""
    spec = read_child_spec(argv, "diskflow.bench.scale")
    if spec is None:
        return 2
    from .prepare import proc_io
    from .taskmemory import memory_cgroup, status_bytes

    phase = spec["phase"]
    out: dict[str, Any] = {"phase": phase, "cgroup": memory_cgroup()}
    try:
        if phase == "train":
            out["result"] = CHILDREN[phase](spec)
        else:
            with _measured_cluster(spec["workers"]) as cluster:
                out["result"] = CHILDREN[phase](spec)
            out["workers"] = cluster["workers"]
    except DiskflowError as e:
        out["error"] = str(e)
    out["io"] = proc_io()                       # after the cluster closed: the reaped workers' counters are in
    out["driver_peak_rss_bytes"] = status_bytes("VmHWM")
    write_child_out(spec, out)
    return 2 if "error" in out else 0


# ---------------------------------------------------------------------------- the parent

@dataclass
class Floors:
    """The disk's sequential bandwidths, measured in this run."""

    read_bw: float
    write_bw: float

    def seconds(self, read: int, written: int) -> float:
        return read / self.read_bw + written / self.write_bw


def _launch(name: str, spec: dict[str, Any], work: Path, limit: int | None, timeout: float, floors: Floors,
            drop: list[Path]) -> dict[str, Any]:
    """Run phase `name` in a child (in a cgroup of `limit` bytes; None: none); return its figures.

    `drop`: trees evicted from the page cache first (the phase's input, so its reads are the disk's).
    """
    from .cgroup import run_limited
    from .common import drop_trees

    drop_trees([p for p in drop if p.exists()])
    runs = work / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    spec_path, out_path = runs / f"{name}.spec.json", runs / f"{name}.out.json"
    out_path.unlink(missing_ok=True)
    spec_path.write_text(json.dumps({**spec, "phase": name, "out": str(out_path)}))
    before = _files(work)
    r = run_limited([sys.executable, "-m", "diskflow.bench.scale", "--child", str(spec_path)], name=f"scale-{name}",
                    limit_bytes=limit, timeout_s=timeout)
    after = _files(work)
    child: dict[str, Any] = json.loads(out_path.read_text()) if out_path.is_file() else {}
    if r.returncode != 0 or "error" in child:
        why = [child["error"]] if "error" in child else [f"exit status {r.returncode}"]
        if r.oom_kills:
            why.append(f"{r.oom_kills} process(es) killed by the OOM killer of its {format_bytes(limit or 0)} cgroup")
        if r.timed_out:
            why.append(f"timed out after {timeout:.0f} s (--timeout)")
        raise DiskflowError(f"bench scale: the {name} phase failed: {'; '.join(why)}")
    io = child.get("io") or {}
    read = int(io.get("read_bytes", r.read_bytes))
    dirtied = int(io.get("write_bytes", r.write_bytes))
    cancelled = int(io.get("cancelled_write_bytes", 0))
    written = dirtied - cancelled
    workers = child.get("workers") or []
    groups: dict[str, dict[str, Any]] = {}
    for w in workers:
        for g, v in w["groups"].items():
            acc = groups.setdefault(g, {"tasks": 0, "peak_rss_bytes": 0, "peak_anon_bytes": 0, "seconds": 0.0})
            acc["tasks"] += v["tasks"]
            acc["seconds"] += v["seconds"]
            acc["peak_rss_bytes"] = max(acc["peak_rss_bytes"], v["peak_rss_bytes"])
            acc["peak_anon_bytes"] = max(acc["peak_anon_bytes"], v["peak_anon_bytes"])
    result = child.get("result") or {}
    if name == "train":
        ep = result.get("epoch") or {}
        groups = {"train-epoch": {"tasks": 1, "peak_rss_bytes": int(ep.get("peak_rss_bytes", 0)),
                                  "peak_anon_bytes": int(ep.get("peak_anon_bytes", 0)),
                                  "seconds": float(ep.get("seconds", 0.0))}}
    peak_group = max(groups, key=lambda g: groups[g]["peak_rss_bytes"]) if groups else None
    new = sorted(set(after) - set(before))
    floor_s = floors.seconds(read, written)
    return {
        "wall_s": r.wall_s, "cpu_s": r.cpu_s, "read_bytes": read, "write_bytes": written,
        "dirtied_bytes": dirtied, "cancelled_write_bytes": cancelled,
        "wait4_read_bytes": r.read_bytes, "wait4_write_bytes": r.write_bytes,
        "workers_read_bytes": sum(int(w["io"].get("read_bytes", 0)) for w in workers),
        "workers_write_bytes": sum(int(w["io"].get("write_bytes", 0)) for w in workers),
        # the workers' own counters, read just before they exit, must be inside the child's total
        "workers_io_counted": (read >= sum(int(w["io"].get("read_bytes", 0)) for w in workers)
                               and dirtied >= sum(int(w["io"].get("write_bytes", 0)) for w in workers))
        if workers else None,
        "floor_s": floor_s, "over_floor": r.wall_s / floor_s if floor_s > 0 else None,
        "cgroup_limit_bytes": limit, "cgroup_peak_bytes": r.cgroup_peak_bytes, "oom_kills": r.oom_kills,
        "cgroup": r.cgroup, "child_cgroup": child.get("cgroup"),
        "workers": [{k: w[k] for k in ("pid", "threads", "baseline_rss_bytes", "baseline_anon_bytes", "cgroup",
                                       "hwm_resettable")}
                    for w in workers],
        "workers_in_cgroup": all(w["cgroup"] == child.get("cgroup") for w in workers) if workers else None,
        "tasks": groups, "peak_task": peak_group,
        "peak_task_rss_bytes": groups[peak_group]["peak_rss_bytes"] if peak_group else None,
        "peak_task_anon_bytes": max(v["peak_anon_bytes"] for v in groups.values()) if groups else None,
        "driver_peak_rss_bytes": child.get("driver_peak_rss_bytes"),
        "files_created": len(new), "bytes_created": int(sum(after[p] for p in new)),
        "result": result,
    }


def _claim(work: Path) -> None:
    """Make `work` this benchmark's: clear a previous run's outputs, refuse a directory holding others'."""
    work.mkdir(parents=True, exist_ok=True)
    present = [n for n in OUTPUTS if (work / n).exists()]
    if present and not (work / MARKER).is_file():
        raise ConfigError("--workdir", f"{work} already holds {', '.join(present)} that no earlier bench scale "
                                       f"run left (no {MARKER}); choose another --workdir or remove them")
    for n in present:
        shutil.rmtree(work / n, ignore_errors=True)
    (work / MARKER).write_text(json.dumps({"pid": os.getpid(), "started": time.time()}) + "\n")


def _cleanup(work: Path, keep: bool) -> None:
    if keep:
        print(f"kept: {work}")
        return
    for n in (*OUTPUTS, MARKER, "bw-scratch.bin"):
        p = work / n
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        work.rmdir()                            # only when nothing else is left in it


def _allowance(store: Any, packed: Path, budget: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The train cgroup's allowance, measured as bench compare does (a probe child, + 25%, + batches held)."""
    from ..operators.formats.manifest import read_manifest
    from .harness import ALLOWANCE_MARGIN, allowance, budget_fit, launch

    max_rows = int((read_manifest(packed) or {})["round"]["max_batch_rows"])
    fit = budget_fit(store, budget, max_rows, args.queue_depth)
    (work / "runs").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    probe = launch({"pipeline": "probe", "samples": str(packed), "hidden": args.hidden,
                    "fanouts": list(args.fanouts)}, work, None, args.timeout)
    if "error" in probe:
        raise InputError(work / "runs", f"the allowance probe failed ({probe['error']})")
    rss = int(probe["peak_rss_bytes"])
    held = (fit["assembled_batches"] - 1) * fit["assembled_batch_bytes"]
    return {"allowance_bytes": allowance(rss, held), "probe_rss_bytes": rss, "margin": ALLOWANCE_MARGIN,
            "held_bytes": held, "probe_s": time.perf_counter() - t0, "max_batch_rows": max_rows, "budget_split": fit}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Plan the bytes, measure the disk, run the four phases in their cgroups; print and return the figures."""
    from .cgroup import find_hierarchy, unavailable_reason
    from .prepare import disk_bandwidth

    _check_args(args)
    if not args.no_cgroup:
        why = unavailable_reason(find_hierarchy())
        if why is not None:
            raise ConfigError("--no-cgroup", f"memory cgroups are unavailable: {why}; pass --no-cgroup to run "
                                             "without memory limits (the table then says so)")
    workers = args.workers or os.cpu_count() or 1
    worker_memory = parse_bytes(args.worker_memory, "--worker-memory")
    memory_budget = parse_bytes(args.memory_budget, "--memory-budget")
    itemsize = np.dtype(args.dtype).itemsize
    feature_bytes = args.nodes * args.dim * itemsize
    budget = byte_budget(args.feature_budget, "--feature-budget", feature_bytes)
    if not budget or budget <= 0:
        raise ConfigError("--feature-budget", f"must be > 0, got {args.feature_budget!r}")
    readahead = byte_budget(args.readahead, "--readahead", feature_bytes) or 0
    from ..operators.ingest.raw import shard_rows_for

    shards = -(-args.nodes // shard_rows_for(memory_budget, args.dim * itemsize, args.nodes))
    rows = worst_batch_rows(args.nodes, args.batch_size, tuple(args.fanouts))
    least = smallest_budget(rows, args.dim * itemsize, shards, args.queue_depth)
    if budget <= least:
        raise ConfigError("--feature-budget", (
            f"{format_bytes(budget)} ({budget / feature_bytes:.1%} of the {format_bytes(feature_bytes)} of features) "
            f"cannot hold the trainer's staging and I/O buffers for batches of up to {rows:,} rows "
            f"({format_bytes(least)}) and a CPU tier; give more than {least:,} bytes, or "
            "more --nodes or --dim"))
    ram = _mem_total()
    plan = byte_plan(args.nodes, args.dim, itemsize, args.avg_degree, args.train_frac, args.batch_size,
                     tuple(args.fanouts), budget, memory_budget, args.bw_bytes)
    work = Path(args.workdir).absolute()
    _claim(work)
    load0 = os.getloadavg()[0]
    t_run = time.perf_counter()
    watch = DiskWatch(work)
    watch.start()
    try:
        free0 = _free(work)
        available = free0 - DISK_RESERVE
        free_raw = plan.needs_free_raw(available)
        if plan.peak(free_raw) > available:
            what = (f"raw {format_bytes(plan.raw)} + store {format_bytes(plan.store)} + ingest spill "
                    f"{format_bytes(plan.spill)} at ingest's end" if plan.ingest_peak >= plan.store + plan.packed else
                    f"store {format_bytes(plan.store)} + packed, worst case, {format_bytes(plan.packed)} after "
                    "ingest, the raw input deleted")
            raise _no_room(plan.peak(free_raw), what, work, free0)
        print(f"bench scale: {args.nodes:,} nodes x {args.dim} {args.dtype} = {format_bytes(feature_bytes)} of "
              f"features ({feature_bytes / ram:.2f}x this machine's {format_bytes(ram)} of RAM); disk plan: peak "
              f"{format_bytes(plan.peak(free_raw))} of {format_bytes(free0)} free"
              + ("; the raw input is deleted after ingest to make room" if free_raw else ""), flush=True)

        read_bw, write_bw, *_ = disk_bandwidth(work, args.bw_bytes)   # the medians of three writes and three reads
        floors = Floors(read_bw, write_bw)
        phases: dict[str, dict[str, Any]] = {}
        raw, store_dir, packed = work / "raw", work / "store", work / "packed"
        base = {"workers": workers, "raw": str(raw), "store": str(store_dir), "packed": str(packed)}
        pre_limit = None if args.no_cgroup else plan.topology + workers * worker_memory
        synth = {"num_nodes": args.nodes, "feature_dim": args.dim, "dtype": args.dtype, "avg_degree": args.avg_degree,
                 "train_frac": args.train_frac, "val_frac": VAL_FRAC, "test_frac": TEST_FRAC, "seed": args.seed,
                 "part_nodes": args.part_nodes}

        print("synth ...", flush=True)
        phases["synth"] = _launch("synth", {**base, "synth": synth}, work, pre_limit, args.timeout, floors, [])
        raw_bytes = _du(raw)
        if plan.store + plan.spill > _free(work) - DISK_RESERVE:
            raise _no_room(plan.store + plan.spill, f"store {format_bytes(plan.store)} + ingest spill "
                           f"{format_bytes(plan.spill)} next to the raw input's {format_bytes(raw_bytes)}",
                           work, _free(work))

        print("ingest ...", flush=True)
        phases["ingest"] = _launch("ingest", {**base, "memory_budget": memory_budget}, work, pre_limit, args.timeout,
                                   floors, [raw])
        from ..operators.formats.store import Store

        store = Store(store_dir)
        topology = _du(store_dir / "indptr.npy") + _du(store_dir / "indices.npy")
        store_bytes = _du(store_dir)
        raw_freed = 0
        if free_raw or plan.packed > _free(work) - DISK_RESERVE:     # planned, or others took the room since
            if plan.packed > _free(work) + raw_bytes - DISK_RESERVE:
                raise _no_room(plan.packed, f"packed, worst case, {format_bytes(plan.packed)} next to the store's "
                               f"{format_bytes(store_bytes)}, even with the raw input deleted", work, _free(work))
            raw_freed = _du(raw)
            shutil.rmtree(raw)
            print(f"raw input deleted ({format_bytes(raw_freed)}) to make room for the packed dataset", flush=True)

        print("prepare ...", flush=True)
        prep_limit = None if args.no_cgroup else topology + workers * worker_memory
        phases["prepare"] = _launch("prepare", {**base, "cpu_memory": budget, "fanouts": list(args.fanouts),
                                                "batch_size": args.batch_size, "superbatch_size": args.superbatch_size,
                                                "queue_depth": args.queue_depth, "seed": args.seed,
                                                "readahead": readahead}, work, prep_limit, args.timeout, floors,
                                    [store_dir])

        print("train ...", flush=True)
        allowance = _allowance(store, packed, budget, args, work)
        train_limit = None if args.no_cgroup else budget + allowance["allowance_bytes"]
        phases["train"] = _launch("train", {**base, "cpu_memory": budget, "hidden": args.hidden, "lr": args.lr,
                                            "seed": args.seed, "queue_depth": args.queue_depth,
                                            "threads": args.threads, "run_dir": str(work / "runs" / "train")},
                                  work, train_limit, args.timeout, floors, [store_dir, packed])
        packed_bytes = _du(packed) + _du(work / "packed.work")
    finally:
        watch.stop()
        _cleanup(work, args.keep)

    limits_ok = [p["peak_task_rss_bytes"] < p["cgroup_limit_bytes"] for p in phases.values()
                 if p["cgroup_limit_bytes"] is not None and p["peak_task_rss_bytes"] is not None]
    prep = phases["prepare"]["result"]["figures"]
    tr = phases["train"]["result"]
    figures: dict[str, Any] = {
        "phases": phases,
        "peak_task_rss_bytes": max(p["peak_task_rss_bytes"] or 0 for p in phases.values()),
        "peak_task_anon_bytes": max(p["peak_task_anon_bytes"] or 0 for p in phases.values()),
        "peak_task_rss_under_limit": all(limits_ok) if limits_ok else None,
        "cgroup_limit_bytes": pre_limit, "prepare_cgroup_limit_bytes": prep_limit,
        "train_cgroup_limit_bytes": train_limit, "worker_memory_bytes": worker_memory, "workers": workers,
        "topology_bytes": topology, "feature_bytes": feature_bytes, "ram_bytes": ram,
        "features_over_ram": feature_bytes / ram, "feature_budget_bytes": budget, "allowance": allowance,
        "seq_read_bw": read_bw, "seq_write_bw": write_bw, "bw_bytes": args.bw_bytes,
        "byte_plan": {**asdict(plan), "ingest_peak": plan.ingest_peak, "peak": plan.peak(free_raw),
                      "free_bytes": free0, "reserve_bytes": DISK_RESERVE, "free_raw_planned": free_raw},
        "raw_bytes": raw_bytes, "store_bytes": store_bytes, "packed_bytes_on_disk": packed_bytes,
        "raw_freed_bytes": raw_freed, "disk_peak_bytes": watch.peak,
        "no_cgroup": bool(args.no_cgroup), "total_wall_s": time.perf_counter() - t_run,
        "load_avg": [load0, os.getloadavg()[0]], "cores": os.cpu_count(),
        "dataset": {"nodes": store.num_nodes, "edges": store.num_edges, "dim": store.feature_dim,
                    "dtype": str(store.feature_dtype), "shards": len(store.shards),
                    "train": int(phases["synth"]["result"]["split_counts"]["train"])},
        "prepare": {"batches": prep["batches"], "accesses": prep["accesses"], "cpu_rows": prep["cpu_rows"],
                    "cpu_hits": prep["cpu_hits"], "misses": prep["misses"], "plan_miss_bytes": prep["plan_miss_bytes"],
                    "packed_bytes": prep["packed_bytes"], "raw_bytes_read": prep.get("raw_bytes_read"),
                    "max_batch_rows": prep["max_batch_rows"], "phases": phases["prepare"]["result"]["phases"]},
        "train": {"batches": tr["batches"], "loss": tr["loss"], "train_acc": tr["train_acc"],
                  "losses_finite": all(math.isfinite(x) for x in tr["losses"]), "epoch_s": tr["epoch_s"],
                  "epoch": tr["epoch"], "loader_bytes_read": tr["loader_bytes_read"],
                  "read_amplification": tr["read_amplification"]},
        "config": {"fanouts": list(args.fanouts), "batch_size": args.batch_size,
                   "superbatch_size": args.superbatch_size, "hidden": args.hidden, "lr": args.lr, "seed": args.seed,
                   "train_frac": args.train_frac, "avg_degree": args.avg_degree, "epochs": 1,
                   "queue_depth": args.queue_depth, "threads": args.threads, "memory_budget": memory_budget,
                   "readahead": readahead, "part_nodes": args.part_nodes},
    }
    _print(figures)
    return figures


# ---------------------------------------------------------------------------- tables

def _b(n: float | None) -> str:
    return "-" if n is None else format_bytes(n)


def _print(f: dict[str, Any]) -> None:
    ds, c, plan = f["dataset"], f["config"], f["byte_plan"]
    limits = ("NO memory limits (--no-cgroup)" if f["no_cgroup"] else
              f"synth, ingest, prepare in a memory cgroup of topology {_b(f['topology_bytes'])} + {f['workers']} "
              f"workers x {_b(f['worker_memory_bytes'])} = {_b(f['prepare_cgroup_limit_bytes'])} (synth, ingest: "
              f"{_b(f['cgroup_limit_bytes'])} from the planned topology); train in feature budget "
              f"{_b(f['feature_budget_bytes'])} + allowance {_b(f['allowance']['allowance_bytes'])} = "
              f"{_b(f['train_cgroup_limit_bytes'])}; page cache counted")
    title = (f"scale: {ds['nodes']:,} nodes x {ds['dim']} {ds['dtype']} = {_b(f['feature_bytes'])} of features "
             f"({f['features_over_ram']:.2f}x the {_b(f['ram_bytes'])} of RAM), {ds['edges']:,} edges, {ds['shards']} "
             f"shards; {ds['train']:,} training nodes, one epoch of {f['train']['batches']} batches of "
             f"{c['batch_size']}, fanouts {','.join(map(str, c['fanouts']))}, GraphSAGE hidden {c['hidden']}\n{limits}")
    rows = []
    for name, p in f["phases"].items():
        rows.append({"phase": name, "wall s": p["wall_s"], "CPU s": p["cpu_s"],
                     "cgroup limit": _b(p["cgroup_limit_bytes"]), "cgroup peak": _b(p["cgroup_peak_bytes"]),
                     "peak task RSS": _b(p["peak_task_rss_bytes"]), "largest task": p["peak_task"] or "-",
                     "peak task anon": _b(p["peak_task_anon_bytes"]),
                     "disk read": _b(p["read_bytes"]), "disk write": _b(p["write_bytes"]),
                     "floor s": p["floor_s"], "x floor": "-" if p["over_floor"] is None else f"{p['over_floor']:.2f}",
                     "files": p["files_created"], "bytes created": _b(p["bytes_created"])})
    print_table(title, rows, ["phase", "wall s", "CPU s", "cgroup limit", "cgroup peak", "peak task RSS",
                              "largest task", "peak task anon", "disk read", "disk write", "floor s", "x floor", "files",
                              "bytes created"])
    print(f"floor: the phase's disk bytes at the disk's sequential bandwidths measured in this run (read "
          f"{_b(f['seq_read_bw'])}/s, write {_b(f['seq_write_bw'])}/s, O_DIRECT, {_b(f['bw_bytes'])}). disk read/write: "
          "/proc/self/io of the phase's process after its Dask workers were reaped (write: dirtied - cancelled); "
          "inputs evicted from the page cache first. CPU s: the process and its workers (wait4).")
    rows = []
    for name, p in f["phases"].items():
        base = max((w["baseline_rss_bytes"] for w in p["workers"]), default=None)
        for g, v in sorted(p["tasks"].items(), key=lambda kv: -kv[1]["peak_rss_bytes"]):
            rows.append({"phase": name, "task group": g, "tasks": v["tasks"], "peak RSS": _b(v["peak_rss_bytes"]),
                         "peak anon": _b(v["peak_anon_bytes"]), "task s": v["seconds"], "worker baseline": _b(base)})
    print_table("peak RSS per task (Dask workers: VmHWM reset when a task starts, one task per worker at a time; "
                "train: the trainer process up to its last batch); peak anon: RssAnon + RssShmem sampled every "
                "10 ms (RSS also counts mapped page cache: the topology, libraries)", rows,
                ["phase", "task group", "tasks", "peak RSS", "peak anon", "task s", "worker baseline"])
    pr, tr = f["prepare"], f["train"]
    ep = tr["epoch"] or {}
    print(f"prepare: {pr['batches']} batches, {pr['accesses']:,} accesses, CPU tier {pr['cpu_rows']:,} rows, "
          f"{pr['misses']:,} misses = {_b(pr['plan_miss_bytes'])} packed ({_b(pr['packed_bytes'])} with padding); "
          f"train: epoch {tr['epoch_s']:.1f} s, loss {tr['loss']:.4f}, train acc {tr['train_acc']:.3f}, "
          f"epoch disk read {_b(ep.get('read_bytes'))} (loader {_b(tr['loader_bytes_read'])}, read amplification "
          f"{tr['read_amplification'] or float('nan'):.3f})")
    print(f"disk: planned peak {_b(plan['peak'])} of {_b(plan['free_bytes'])} free (raw {_b(plan['raw'])}, store "
          f"{_b(plan['store'])}, spill {_b(plan['spill'])}, packed worst case {_b(plan['packed'])}); observed peak "
          f"{_b(f['disk_peak_bytes'])} (bytes allocated under the work directory, sampled every second); actual raw "
          f"{_b(f['raw_bytes'])}, store {_b(f['store_bytes'])}, packed {_b(f['packed_bytes_on_disk'])}"
          + (f"; raw input deleted after ingest ({_b(f['raw_freed_bytes'])})" if f["raw_freed_bytes"] else "")
          + "; everything removed at the end unless --keep")
    ok = f["peak_task_rss_under_limit"]
    print(f"peak task RSS {_b(f['peak_task_rss_bytes'])}: "
          f"{'-' if ok is None else ('below' if ok else 'NOT below')} its phase's cgroup limit; "
          f"whole run {f['total_wall_s']:.0f} s; machine load average {f['load_avg'][0]:.1f} -> "
          f"{f['load_avg'][1]:.1f} on {f['cores']} cores")


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
