"""`diskflow bench hetero`: typed graphs. A MAG240M-shaped graph (papers, authors, institutions) trains a typed
GraphSAGE in memory and out of core, side by side with a homogeneous GraphSAGE on its papers alone, in one run.

The graph is `operators.ingest.synthhetero`'s (papers cite papers, authors write papers, authors are affiliated
with institutions; features, labels and splits on papers only; an author's papers share its field, so the
authors carry class signal the citations alone do not). It is made undirected with PyG's ``ToUndirected`` (the
``rev_`` edge types), written as a typed raw dataset (`from_pyg`) and ingested with two derive rules (`DERIVE`:
an author's row is the mean of its papers', an institution's the mean of its authors'), which fill the
featureless types' rows as Dask tasks (`flow.derive`). The **paper-only baseline** is the same papers as an
ordinary store: their features, labels and splits and the citation edges (undirected), nothing else.

Measured, in one run:

* **Derivation against its floor.** The derivation's wall seconds (the typed store manifest's
  ``stats.derive_seconds``, timed by the ingest) beside a pass over the bytes it reads: every rule's neighbour
  rows of the feature table (all paper rows for the authors' rule, all author rows for the institutions') and
  its CSC (``indptr`` and ``indices``), each file evicted from the page cache (``posix_fadvise(DONTNEED)``)
  and read once, sequentially, with O_DIRECT (`derive_floor`). The derived rows' writes are not in the floor.
  A store reused from an earlier run (same configuration, in ``--workdir``) keeps that run's derive seconds;
  the JSON says so (``derive.store_reused``).
* **Four pipelines** as `bench compare` runs them (`bench.harness`): ``typed_inmemory`` and ``typed_belady``
  train the same GraphSAGE, made heterogeneous by PyG's ``to_hetero``, on the typed store; ``paper_inmemory``
  and ``paper_belady`` a homogeneous GraphSAGE on the paper-only store. The same seed, fanouts, batch size,
  epochs, hidden width and learning rate for all. Per store, belady is prepared with the feature budget
  (``--feature-budget``, 10% of that store's feature bytes: the packed pipelines' ``--cpu-memory``, holding
  the CPU tier, the staging buffers and the I/O buffers) and inmemory trains on belady's stored samples, so
  the losses of inmemory and belady must be identical batch for batch (checked and recorded). Each pipeline
  makes a data-path run (``--model none``: batches built and dropped) and a model run, each a child process
  (the data-path runs ``--repeats`` times, interleaved, the fastest kept, as compare's ``--repeats`` does:
  an epoch of the data path lasts about a second and the machine is shared);
  belady's in a memory cgroup that counts the page cache, limited to the feature budget plus compare's
  allowance for the process itself (the peak RSS of the probe child of that store's samples, plus 25%, plus
  the assembled batches the trainer holds beyond the probe's; `bench.harness.allowance`); inmemory without a
  limit, as in compare. Page cache dropped before every run, each epoch's sample files read before its clock,
  disk bytes from ``/proc/self/io``, evaluation outside the measured epochs (`bench.harness`).
* **Read amplification** is a data path's disk bytes over its useful bytes: the rows belady's plan sends to
  disk (compare's definition). inmemory reads no feature row during an epoch: it has none.

Headline figures: typed test accuracy minus paper-only (inmemory's, in points), belady's data-path epoch over
inmemory's on the typed store (target at most 1.0x), whether typed inmemory's and belady's losses are
identical, and the derivation's seconds, its floor's, and their ratio.

Default size (`PAPERS`, `AUTHORS`, `INSTITUTIONS`): 8M papers, 8M authors (MAG240M's one author per paper)
and 80k institutions, 128 features stored as float16 (``--dtype``; MAG240M ships its features so): a typed
feature table of 16.08M rows = 3.83 GiB after the derivation (1.91 GiB of papers), the bytes of
`bench compare`'s graph. 0.625% of the papers train (50k: 49 batches of 1024 an epoch, compare's count),
0.5% are tested. Fanouts 10,10 (every edge type) give batches of about 140k rows; the trainer's staging
buffers (4 pieces of at most 32 MiB) then take a third of the 10% budget, as in compare, and the CPU tier
the rest. At smaller graphs the staging buffers leave the tier little, and at smaller batches an
in-memory gather is cheap next to a disk read: both make the out-of-core path look worse than it is at
scale. ``--no-model`` re-measures the data paths alone.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import time
from datetime import date
from pathlib import Path
from typing import Any

from ..config import fanouts_option
from ..errors import ConfigError, InputError
from ..operators.formats.diskread import read_span
from ..operators.formats.sizes import format_bytes
from ..operators.options import CPU_SHARE
from .common import drop_page_cache, drop_trees, print_table, read_ahead_kb
from .harness import (
    ALLOWANCE_MARGIN,
    budget_fit,
    launch,
    probe_allowances,
    samples_files,
    seq_read_bw,
    useful_bytes,
)

__all__ = ["DEFAULT_WORKDIR", "DERIVE", "RUNS", "STORES", "TARGETS", "add_arguments", "derive_floor", "derive_reads",
           "run"]

DEFAULT_WORKDIR = Path("bench-data") / "hetero"
DERIVE = ("author=mean:paper__rev_writes__author", "institution=mean:author__affiliated_with__institution")
STORES = ("typed", "paper")
RUNS = ("typed_inmemory", "typed_belady", "paper_inmemory", "paper_belady")    # STORE_PIPELINE
TARGETS = {"typed_minus_paper_points": (">", 0.0), "belady_data_vs_inmemory": ("<=", 1.0)}
PAPERS, AUTHORS, INSTITUTIONS = 8_000_000, 8_000_000, 80_000
DTYPES = ("float16", "float32")
FANOUTS = (10, 10)
BATCH_SIZE = 1024
EPOCHS = 2
TRAIN_FRAC = 0.00625
TEST_FRAC = 0.005
REPEATS = 3
FEATURE_SHARE = f"{CPU_SHARE:.0%}"
# belady's staging pieces: at the default size a 10% budget is 393 MiB, of which the trainer's default pieces
# (4 x 32 MiB) would take a third; 8 MiB pieces leave 100 MiB more to the CPU tier (docs/benchmarks.md)
STAGING_PIECE = "8MiB"
_READ_BLOCK = 4 << 20          # bytes per O_DIRECT read of the derivation's floor
_ALIGN = 4096                  # O_DIRECT offsets and lengths


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `diskflow bench hetero`."""
    p.add_argument("--papers", type=int, default=PAPERS, help=f"papers (default {PAPERS:,})")
    p.add_argument("--authors", type=int, default=AUTHORS, help=f"authors (default {AUTHORS:,})")
    p.add_argument("--institutions", type=int, default=INSTITUTIONS, help=f"institutions (default {INSTITUTIONS:,})")
    p.add_argument("--dim", type=int, default=128, help="paper feature width (default 128)")
    p.add_argument("--dtype", choices=DTYPES, default=DTYPES[0],
                   help=f"the papers' stored feature dtype (default {DTYPES[0]}, as MAG240M ships its features)")
    p.add_argument("--classes", type=int, default=16, help="classes (default 16)")
    p.add_argument("--train-frac", type=float, default=TRAIN_FRAC,
                   help=f"share of the papers trained on (default {TRAIN_FRAC}: 50k, 49 batches of 1024)")
    p.add_argument("--val-frac", type=float, default=0.001, help="share of the papers validated on (default 0.001)")
    p.add_argument("--test-frac", type=float, default=TEST_FRAC,
                   help=f"share of the papers tested on (default {TEST_FRAC})")
    p.add_argument("--seed", type=int, default=0, help="seed of the graph, the samples and the models (default 0)")
    p.add_argument("--fanouts", type=fanouts_option(), default=FANOUTS,
                   help=f"per-hop fanouts, every edge type (default {','.join(map(str, FANOUTS))})")
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE, help=f"seeds per minibatch (default {BATCH_SIZE})")
    p.add_argument("--superbatch-size", type=int, default=8, help="batches per superbatch (default 8)")
    p.add_argument("--epochs", type=int, default=EPOCHS, help=f"epochs of every run (default {EPOCHS})")
    p.add_argument("--hidden", type=int, default=128, help="hidden channels (default 128)")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 3e-3)")
    p.add_argument("--feature-budget", default=FEATURE_SHARE,
                   help="host memory for features, bytes or a share of each store's feature bytes (default "
                        "%(default)s): belady's --cpu-memory, and with the allowance its cgroup limit")
    p.add_argument("--allowance", default=None,
                   help="memory for the process itself inside the cgroup (default: measured per store, as compare)")
    p.add_argument("--queue-depth", type=int, default=2, help="trainer queue depth (default 2)")
    p.add_argument("--staging-piece", default=STAGING_PIECE, metavar="SIZE",
                   help=f"belady's --staging-piece: the most disk-row bytes one staging buffer carries (default "
                        f"{STAGING_PIECE}; 32MiB is the trainer's own default)")
    p.add_argument("--repeats", type=int, default=REPEATS,
                   help=f"data-path runs of each pipeline, interleaved; the fastest is kept (default {REPEATS}; the "
                        "model runs once)")
    p.add_argument("--threads", type=int, default=None, help="torch threads of each run (default: torch's)")
    p.add_argument("--bw-bytes", type=int, default=512 << 20,
                   help="bytes of store shards read to measure the disk's sequential read bandwidth (default 512 MiB)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds one child may take (default 3600)")
    p.add_argument("--no-cgroup", action="store_true",
                   help="run without memory cgroups (no limits: the table says so)")
    p.add_argument("--no-model", action="store_true",
                   help="the data-path runs only (--model none): no GraphSAGE runs, so no model epochs, no accuracy "
                        "and no accuracy target; a re-measure of the data paths alone")
    p.add_argument("--workdir", default=str(DEFAULT_WORKDIR),
                   help=f"where the stores, packed datasets and runs go (default ./{DEFAULT_WORKDIR}; large)")


def _check_args(args: argparse.Namespace) -> None:
    for option, value in (("--papers", args.papers), ("--authors", args.authors),
                          ("--institutions", args.institutions), ("--dim", args.dim),
                          ("--batch-size", args.batch_size), ("--superbatch-size", args.superbatch_size),
                          ("--epochs", args.epochs), ("--hidden", args.hidden), ("--queue-depth", args.queue_depth),
                          ("--bw-bytes", args.bw_bytes), ("--repeats", args.repeats)):
        if value < 1:
            raise ConfigError(option, f"must be >= 1, got {value}")
    if args.threads is not None and args.threads < 1:
        raise ConfigError("--threads", f"must be >= 1, got {args.threads}")
    if not args.timeout > 0:
        raise ConfigError("--timeout", f"must be > 0 seconds, got {args.timeout}")
    from ..operators.prepare.tiers import check_staging_piece
    args.staging_piece = check_staging_piece(args.staging_piece, "--staging-piece")


# ---------------------------------------------------------------------------- the two stores

def _config(args: argparse.Namespace) -> dict[str, Any]:
    """What the stores are a function of (a store in --workdir built from the same is reused)."""
    return {"papers": args.papers, "authors": args.authors, "institutions": args.institutions, "dim": args.dim,
            "dtype": args.dtype,
            "classes": args.classes, "train_frac": args.train_frac, "val_frac": args.val_frac,
            "test_frac": args.test_frac, "seed": args.seed, "derive": list(DERIVE)}


def _stores(args: argparse.Namespace, work: Path) -> tuple[Any, Any, dict[str, Any]]:
    """The typed store and the paper-only store (built, or reused when --workdir holds them for this
    configuration), and how long building took."""
    import dask
    import torch
    import torch_geometric.transforms as T
    from torch_geometric.data import Data

    from ..flow.ingest import run_ingest
    from ..operators.formats.store import Store
    from ..operators.ingest.pygimport import from_pyg
    from ..operators.ingest.synthhetero import CITES, synth_hetero_arrays, to_hetero_data

    config = _config(args)
    book = work / "store" / "config.json"
    typed, paper = work / "store" / "typed", work / "store" / "paper"
    try:
        known = json.loads(book.read_text()) if book.is_file() else None
    except ValueError:
        known = None
    if known == config and (typed / "manifest.json").is_file() and (paper / "manifest.json").is_file():
        return Store(typed), Store(paper), {"reused": True}
    book.unlink(missing_ok=True)
    t0 = time.perf_counter()
    arrays = synth_hetero_arrays(args.papers, args.authors, args.institutions, dim=args.dim, classes=args.classes,
                                 seed=args.seed, train_frac=args.train_frac, val_frac=args.val_frac,
                                 test_frac=args.test_frac)
    graph = T.ToUndirected()(to_hetero_data(arrays))
    graph["paper"].x = graph["paper"].x.to(getattr(torch, args.dtype))     # the stored dtype, derived rows' too
    del arrays
    p = graph["paper"]
    papers = Data(x=p.x, y=p.y, train_mask=p.train_mask, val_mask=p.val_mask, test_mask=p.test_mask,
                  edge_index=graph[CITES].edge_index)       # undirected already (ToUndirected)
    t_synth = time.perf_counter()
    raw = work / "raw"
    from_pyg(graph, raw / "typed", force=True)
    from_pyg(papers, raw / "paper", force=True)
    del graph, papers, p
    t_raw = time.perf_counter()
    with dask.config.set(scheduler="threads"):
        run_ingest(raw / "typed", typed, derive=list(DERIVE), force=True)
        t_typed = time.perf_counter()
        run_ingest(raw / "paper", paper, force=True)
    t_paper = time.perf_counter()
    shutil.rmtree(raw, ignore_errors=True)
    book.write_text(json.dumps(config))
    return Store(typed), Store(paper), {"reused": False, "synth_s": t_synth - t0, "raw_s": t_raw - t_synth,
                                        "ingest_typed_s": t_typed - t_raw, "ingest_paper_s": t_paper - t_typed}


# ---------------------------------------------------------------------------- the derivation's floor

def derive_reads(store: Any) -> list[dict[str, Any]]:
    """The byte ranges the derivation of a typed store read: per derived node type, its neighbour type's rows
    of the feature table (each shard's slice) and the CSC grouped by the derived type (``indptr``, ``indices``:
    the edge type's own where the derived type is its destination, else the derivation's ``derive/<k>/``).
    Each: ``{"type", "what", "path", "start", "stop"}``."""
    from ..operators.ingest.heterotypes import derive_paths

    layout = store.hetero
    if layout is None:
        raise InputError(store.path, "not a typed store (no hetero entry in its manifest)")
    out: list[dict[str, Any]] = []
    for t in layout.node_types:                 # a loop per node type
        if t.derived is None:
            continue
        src = layout.node(str(t.derived["from"]))
        et = tuple(t.derived["edge_type"])
        k = layout.edge_index(et)               # type: ignore[arg-type]
        info = layout.edge_types[k]
        csc = (info.indptr, info.indices) if info.dst == t.name else derive_paths(k)
        for what, rel in zip(("indptr", "indices"), csc):
            path = store.path / rel
            out.append({"type": t.name, "what": what, "path": path, "start": 0, "stop": path.stat().st_size})
        for s in store.shards:                  # a loop per shard
            lo, hi = max(s.row_start, src.offset), min(s.row_stop, src.stop)
            if lo < hi:
                out.append({"type": t.name, "what": f"{src.name} rows", "path": s.path,
                            "start": s.offset + (lo - s.row_start) * store.row_bytes,
                            "stop": s.offset + (hi - s.row_start) * store.row_bytes})
    return out


def _read_range(path: Path, start: int, stop: int) -> tuple[int, float]:
    """Read bytes [start, stop) of `path` once, sequentially, with O_DIRECT (the range widened to whole 4 KiB
    blocks), after evicting the file from the page cache; (bytes read, seconds). Buffered reads where the
    filesystem refuses O_DIRECT (tmpfs)."""
    drop_page_cache(path)
    lo = start - start % _ALIGN
    hi = min(-(-stop // _ALIGN) * _ALIGN, path.stat().st_size)
    done, seconds = read_span(path, lo, hi, _READ_BLOCK)
    return min(done, hi - lo), seconds


def derive_floor(store: Any) -> dict[str, Any]:
    """A pass over the bytes the derivation reads (`derive_reads`), each range read once with O_DIRECT after its
    file was evicted from the page cache: bytes, seconds, and both per derived type."""
    per: dict[str, dict[str, float]] = {}
    total, seconds = 0, 0.0
    for r in derive_reads(store):
        n, s = _read_range(r["path"], r["start"], r["stop"])
        total, seconds = total + n, seconds + s
        part = per.setdefault(r["type"], {"bytes": 0, "seconds": 0.0, "row_bytes": 0, "csc_bytes": 0})
        part["bytes"] += n
        part["seconds"] += s
        part["csc_bytes" if r["what"] in ("indptr", "indices") else "row_bytes"] += n
    return {"bytes": total, "seconds": seconds, "read_bw": total / seconds if seconds > 0 else None, "types": per,
            "how": "every rule's neighbour rows and CSC read once, sequentially, with O_DIRECT, each file evicted "
                   "from the page cache (posix_fadvise DONTNEED) first"}


# ---------------------------------------------------------------------------- one store's runs

def _prepare(store: Any, packed: Path, budget: int, fit: dict[str, int], args: argparse.Namespace) -> dict[str, Any]:
    """belady prepared for `store` as `bench compare` prepares it (cached in `packed` for this configuration)."""
    import dask

    from ..flow.pipeline import load_pipeline

    packed.parent.mkdir(parents=True, exist_ok=True)
    with dask.config.set(scheduler="threads"):
        r = load_pipeline("belady").prepare(store.path, packed, cpu_memory=budget, io_reserve=fit["io_buffer_bytes"],
                                            staging_batches=fit["staging_buffers"], staging_piece=args.staging_piece,
                                            fanouts=tuple(args.fanouts),
                                            batch_size=args.batch_size, superbatch_size=args.superbatch_size,
                                            epochs=args.epochs, seed=args.seed, quiet=True)
    return {"path": packed, "skipped": r.skipped, "seconds": r.seconds, "figures": r.figures}


def _store_runs(kind: str, store: Any, work: Path, args: argparse.Namespace, hierarchy: Any) -> dict[str, Any]:
    """Prepare belady on one store, measure the allowance, run belady and inmemory (data path and model) in their
    children; the store's figures."""
    from ..api import prepare_options
    from ..flow.pipeline import load_pipeline
    from ..flow.runtimes.packed import budget as parse_budget
    from ..operators.formats.manifest import read_manifest
    from .cgroup import current_procs
    from .compare import pipeline_figures
    from .prepare import max_batch_rows

    fb = store.feature_bytes
    budget = parse_budget(args.feature_budget, "--feature-budget", fb)
    if budget is None or budget <= 0:
        raise ConfigError("--feature-budget", f"must be > 0, got {args.feature_budget!r}")
    belady = load_pipeline("belady")
    base = belady.prepare_config(**prepare_options(belady, store, fanouts=tuple(args.fanouts),
                                                   batch_size=args.batch_size, superbatch_size=args.superbatch_size,
                                                   epochs=args.epochs, seed=args.seed))
    max_rows = max_batch_rows(store, base, work)
    try:
        fit = budget_fit(store, budget, max_rows, args.queue_depth, args.staging_piece)
    except ConfigError as e:
        raise ConfigError("--feature-budget", f"the {kind} store: {e.fault}") from None
    print(f"{kind}: preparing belady ({format_bytes(fb)} of features, budget {format_bytes(budget)}) ...", flush=True)
    t0 = time.perf_counter()
    prep = _prepare(store, work / "packed" / f"{kind}-belady", budget, fit, args)
    prepare_s = time.perf_counter() - t0
    ref = prep["path"]
    warm = {str(e): [str(p) for p in files] for e, files in samples_files(ref).items()}
    manifest = read_manifest(ref)
    assert manifest is not None                         # a prepared dataset
    batches = int(manifest["round"]["batches"]) // args.epochs
    runs_dir = work / "runs" / kind
    droppable = [store.path, ref.parent]
    shared = {"store": str(store.path), "samples": str(ref), "model": "sage", "hidden": args.hidden, "lr": args.lr,
              "seed": args.seed, "epochs": args.epochs, "fanouts": list(args.fanouts), "batch_size": args.batch_size,
              "threads": args.threads, "warm": warm, "queue_depth": args.queue_depth, "cpu_memory": budget,
              "sequential": False, "measure": None,
              "home_procs": str(current_procs(hierarchy)) if hierarchy is not None else None}
    allow = probe_allowances(shared, runs_dir, fit, args.allowance, args.timeout, runs_dir,  # compare's rule
                             f"the allowance probe of the {kind} store")
    limits = allow.limits(budget, args.no_cgroup)
    children: dict[str, list[dict[str, Any]]] = {"belady": [], "inmemory": []}
    for repeat in range(args.repeats):      # interleaved; the model runs once, in the first repeat
        for name in ("belady", "inmemory"):     # compare's order
            child: dict[str, Any] = {"runs": {}, "groups": {}}
            groups = [("data", "none"), ("model", "sage")] if repeat == 0 and not args.no_model else [("data", "none")]
            for group, model in groups:
                spec = {**shared, "pipeline": name, "group": group, "drop": [str(p) for p in droppable],
                        "packed": str(ref) if name == "belady" else None,
                        "runs": [{"kind": group, "model": model, "sequential": False,
                                  "run_dir": str(runs_dir / f"{name}-{group}-{repeat + 1}")}]}
                print(f"running {kind}_{name}: {group} (repeat {repeat + 1}/{args.repeats}) ...", flush=True)
                done = launch(spec, runs_dir, None if name == "inmemory" else limits[group], args.timeout)
                child["runs"].update(done.pop("runs"))
                child["groups"][group] = done
                if "error" in done:
                    print(f"  {kind}_{name} ({group}) failed: {done['error']}", flush=True)
            children[name].append(child)
    pipelines: dict[str, Any] = {}
    for name, runs in children.items():
        useful = useful_bytes(ref) if name == "belady" else None
        plan_miss = int(prep["figures"]["plan_miss_bytes"]) if name == "belady" else None
        f = pipeline_figures(runs, batches * args.epochs, args.epochs, useful, plan_miss)
        pipelines[name] = {"store": kind, "pipeline": name, "model": "sage" if kind == "paper" else "sage (to_hetero)",
                           **f}
    drop_trees(droppable)
    pf = prep["figures"]
    return {"pipelines": pipelines, "feature_bytes": fb, "feature_budget_bytes": budget, "budget_split": fit,
            "max_batch_rows": max_rows, "batches_per_epoch": batches, "allowance_bytes": allow.model,
            "data_allowance_bytes": allow.data, "allowance_probe_rss_bytes": allow.probe_rss,
            "data_allowance_probe_rss_bytes": allow.data_rss, "cgroup_limit_bytes": limits["model"],
            "data_cgroup_limit_bytes": limits["data"],
            "prepare": {"seconds": prepare_s, "skipped": prep["skipped"], "cpu_rows": pf.get("cpu_rows"),
                        "misses": pf.get("misses"), "plan_miss_bytes": pf.get("plan_miss_bytes"),
                        "packed_bytes": pf.get("packed_bytes"), "accesses": pf.get("accesses"),
                        "cpu_hits": pf.get("cpu_hits")},
            "dataset": {"store": str(store.path), "nodes": store.num_nodes, "edges": store.num_edges,
                        "dim": store.feature_dim, "dtype": str(store.feature_dtype), "shards": len(store.shards),
                        "train": int(store.split_ids("train").shape[0]),
                        "test": int(store.split_ids("test").shape[0]),
                        "node_types": None if store.hetero is None else
                        {t.name: t.count for t in store.hetero.node_types},
                        "edge_types": None if store.hetero is None else
                        {"__".join(e.key): e.num_edges for e in store.hetero.edge_types}}}


# ---------------------------------------------------------------------------- the run

def _ratio(a: Any, b: Any) -> float | None:
    return float(a) / float(b) if a is not None and b else None


def _met(value: float | None, op: str, bound: float) -> bool | None:
    if value is None:
        return None
    return bool(value > bound) if op == ">" else bool(value <= bound)


def machine() -> dict[str, Any]:
    """This machine in a few words (cores, memory, CPU, Python, torch), as the results files describe it."""
    import torch

    try:
        mem = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError):
        mem = None
    cpu = None
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), None)
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cores": os.cpu_count(), "memory_bytes": mem, "cpu": cpu, "gpu": gpu, "python": platform.python_version(),
            "torch": torch.__version__, "platform": platform.platform(),
            "summary": f"{os.cpu_count()} cores, {format_bytes(mem or 0)}, {'GPU ' + gpu if gpu else 'no GPU'}"}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build both stores, time the derivation against its floor, run the four pipelines; print and return the
    figures."""
    from .cgroup import find_hierarchy, unavailable_reason

    _check_args(args)
    hierarchy = None
    if not args.no_cgroup:
        hierarchy = find_hierarchy()
        why = unavailable_reason(hierarchy)
        if why is not None:
            raise ConfigError("--no-cgroup", f"memory cgroups are unavailable: {why}; pass --no-cgroup to run "
                                             "without memory limits (the table then says so)")
    work = Path(args.workdir).absolute()
    (work / "store").mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    print("building the typed and the paper-only stores ...", flush=True)
    typed, paper, build = _stores(args, work)
    derive_s = float((typed.manifest.get("stats") or {}).get("derive_seconds") or 0.0)
    floor = derive_floor(typed)
    seq_bw, bw_bytes = seq_read_bw(typed, args.bw_bytes)
    stores = {"typed": _store_runs("typed", typed, work, args, hierarchy),
              "paper": _store_runs("paper", paper, work, args, hierarchy)}
    shutil.rmtree(work / "runs", ignore_errors=True)
    pipelines = {f"{k}_{n}": p for k, s in stores.items() for n, p in s["pipelines"].items()}
    for p in pipelines.values():
        p["disk_floor_s"] = None if p["disk_read_bytes"] is None else p["disk_read_bytes"] / args.epochs / seq_bw

    def get(name: str, key: str) -> Any:
        return pipelines.get(name, {}).get(key)

    ti, pi = get("typed_inmemory", "test_acc"), get("paper_inmemory", "test_acc")
    tl, bl = get("typed_inmemory", "losses"), get("typed_belady", "losses")
    pl, pbl = get("paper_inmemory", "losses"), get("paper_belady", "losses")
    headline = {
        "typed_minus_paper_points": None if ti is None or pi is None else 100 * (float(ti) - float(pi)),
        "typed_belady_minus_paper_belady_points": None if get("typed_belady", "test_acc") is None or
        get("paper_belady", "test_acc") is None else
        100 * (float(get("typed_belady", "test_acc")) - float(get("paper_belady", "test_acc"))),
        "belady_data_vs_inmemory": _ratio(get("typed_belady", "data_epoch_s"), get("typed_inmemory", "data_epoch_s")),
        "paper_belady_data_vs_inmemory": _ratio(get("paper_belady", "data_epoch_s"),
                                                get("paper_inmemory", "data_epoch_s")),
        "typed_data_vs_paper_data": _ratio(get("typed_inmemory", "data_epoch_s"), get("paper_inmemory", "data_epoch_s")),
        "typed_model_vs_paper_model": _ratio(get("typed_inmemory", "epoch_s"), get("paper_inmemory", "epoch_s")),
        "losses_identical": None if tl is None or bl is None else tl == bl,
        "paper_losses_identical": None if pl is None or pbl is None else pl == pbl,
        "derive_s": derive_s, "derive_floor_s": floor["seconds"],
        "derive_over_floor": _ratio(derive_s, floor["seconds"]),
    }
    targets = {k: {"value": headline[k], "op": op, "bound": bound, "met": _met(headline[k], op, bound)}
               for k, (op, bound) in TARGETS.items()}
    m = machine()
    figures: dict[str, Any] = {
        "bench": "hetero", "date": date.today().isoformat(), "machine": m["summary"], "machine_detail": m,
        "headline": headline, "targets": targets, "pipelines": pipelines,
        "derive": {"seconds": derive_s, "floor": floor, "rules": list(DERIVE), "store_reused": build["reused"]},
        "stores": {k: {x: v for x, v in s.items() if x != "pipelines"} for k, s in stores.items()},
        "build": build, "seq_read_bw": seq_bw, "seq_read_bytes": bw_bytes,
        "cgroup": None if hierarchy is None else f"v{hierarchy.version} {hierarchy.root}",
        "no_cgroup": bool(args.no_cgroup), "allowance_margin": ALLOWANCE_MARGIN,
        "page_cache_drop": "posix_fadvise(POSIX_FADV_DONTNEED) on every file of the store and the packed dataset "
                           "before each run", "read_ahead_kb": read_ahead_kb(typed.shards[0].path),
        "epochs": args.epochs,
        "config": {**_config(args), "fanouts": list(args.fanouts), "batch_size": args.batch_size,
                   "superbatch_size": args.superbatch_size, "epochs": args.epochs, "hidden": args.hidden,
                   "lr": args.lr, "queue_depth": args.queue_depth, "threads": args.threads, "repeats": args.repeats,
                   "feature_budget": args.feature_budget, "no_model": bool(args.no_model),
                   "staging_piece": args.staging_piece},
        "wall_s": time.perf_counter() - t0, "load_avg": [load0, os.getloadavg()[0]], "cores": os.cpu_count(),
    }
    print_figures(figures)
    return figures


def print_figures(f: dict[str, Any]) -> None:
    """The run's table and headline lines."""
    def mib(v: Any) -> str:
        return "-" if v is None else format_bytes(int(v))

    rows = []
    for name, p in f["pipelines"].items():
        limit = p.get("cgroup_limit_bytes")
        rows.append({"run": name, "test acc": p.get("test_acc"), "data epoch s": p.get("data_epoch_s"),
                     "sage epoch s": p.get("epoch_s"), "disk read": mib(p.get("disk_read_bytes")),
                     "useful": mib(p.get("useful_bytes")), "read amp": p.get("read_amplification") or "-",
                     "limit (model)": "none" if limit is None else mib(limit)})
    print_table(f"typed graphs: {f['epochs']} epochs each, same samples per store",
                rows, ["run", "test acc", "data epoch s", "sage epoch s", "disk read", "useful", "read amp",
                       "limit (model)"])
    h, d = f["headline"], f["derive"]

    def num(v: Any, fmt: str = ".3g") -> str:
        return "n/a" if v is None else format(v, fmt)

    print(f"typed - paper-only test accuracy (inmemory): {num(h['typed_minus_paper_points'], '+.2f')} points")
    print(f"typed belady / inmemory data-path epoch: {num(h['belady_data_vs_inmemory'])}x (target <= 1.0x)")
    print(f"typed inmemory and belady losses identical: {h['losses_identical']}; "
          f"paper-only: {h['paper_losses_identical']}")
    print(f"derivation {num(d['seconds'])} s against a pass over its {mib(d['floor']['bytes'])} "
          f"(O_DIRECT, page cache dropped) in {num(d['floor']['seconds'])} s: {num(h['derive_over_floor'])}x"
          + (" (store reused: derive seconds from the run that built it)" if d["store_reused"] else ""))
    if f["no_cgroup"]:
        print("NO memory limits (--no-cgroup): the out-of-core figures are not out of core")
