"""`diskflow bench compare`: every pipeline on one dataset and one set of samples, side by side, in one run.

The pipelines (``--pipelines``, default all): ``inmemory`` (every feature in RAM, the speed and
accuracy reference), ``mmap`` (PyG+: features gathered through memory maps and the page cache),
``ginex`` (Belady CPU tier, misses read row by row with O_DIRECT), ``diskgnn`` (static tiers +
packed segments), ``belady`` (Belady CPU tier + packed segments), ``belady_outre`` (belady with
OUTRE's partition batches and historical embedding cache, planned offline) and ``outre`` (those
two + a static CPU tier, misses read row by row). The two OUTRE pipelines train on samples of
their own (other batches, pruned subtrees): they are compared by bytes read per epoch and by
test accuracy after the same epochs; ``belady_outre`` also runs at every staleness threshold of
``--staleness-sweep`` (OUTRE's Table 11 on this graph). How they are measured
(docs/design.md, "How it is measured"):

* **One dataset, one set of samples** (for all but the OUTRE pipelines). belady, diskgnn and ginex are prepared (cached in
  ``--workdir``) from the same store with the same fanouts, batch size and seed, so their stored
  samples are identical (checked); inmemory and mmap train on belady's stored samples
  (``samples=PACKED``). Sampling is therefore out of every pipeline's data path, and the losses
  of the exact pipelines must equal inmemory's batch for batch.
* **Out of core.** Each pipeline runs in its own process (``python -m diskflow.bench.harness
  --child``, `bench.harness`), and each out-of-core one in its own memory cgroup (`bench.cgroup`,
  page cache counted) with the SAME limits: an allowance for the process itself plus the feature budget
  (``--feature-budget``, 10% of the feature bytes). The allowance is measured, once per kind of
  run, so that neither leaves the page cache room the run does not need: for the data-path runs
  (``--model none``), the peak RSS of a process that imports torch and PyG and loads the labels
  and every stored sample, plus 25%, plus the assembled batches the trainer holds; for the model
  runs, the peak RSS of that process after it has also run the model forward and backward on
  the largest batch, plus 25%, plus the other assembled batches. The data-path and model runs
  of a pipeline are therefore two child processes, each in its own cgroup. The packed pipelines
  get the feature budget as their ``--cpu-memory`` (CPU tier + staging buffers + I/O buffers);
  mmap may fill it, and whatever the allowance overstates, with page cache. inmemory runs
  without a limit.
* **Cold start.** Before every run (the child does it) the store's and the packed datasets' files are evicted from the
  page cache (``posix_fadvise(DONTNEED)`` per file, `common.drop_page_cache`; not the global
  ``drop_caches``, which would disturb the other users of this machine). At the start of each
  epoch the child reads that epoch's sample files once, before its clock and disk counter start.
* **True disk traffic** is ``read_bytes`` of ``/proc/self/io`` in the child, read at the start and
  the end of each training epoch; read amplification is that over the useful bytes: the rows the
  pipeline's plan sends to disk (belady's plan for mmap: the fewest any reader with this budget
  must fetch). Evaluation (test accuracy) follows the last epoch, after the child has left its
  cgroup: it is not part of any figure but the accuracy.
* **Data path and model.** Each pipeline makes two runs: ``--model none`` (the
  batches are built and dropped: the data path alone) and GraphSAGE; belady's four more: GraphSAGE
  with ``--sequential`` (no overlap between load, assemble and train; the table gives the most
  overlap could save, the shorter of data path and compute), its data path without crc checks,
  and a pipelined / ``--sequential`` pair with ``--io-model`` (default an MLP) and
  ``--io-threads`` torch threads (default 1), a model light enough on this CPU that the disk is
  the bottleneck, where overlap has something to hide.
  ``--repeats R`` runs every pipeline R times, interleaved, and keeps each run's fastest (the
  machine's other users only ever slow a run down). ``--baseline-batches K`` measures the pipelines of
  ``--cut-short`` (default mmap and ginex) on K batches of the first epoch only, scaled to the
  round (the table says so), after ``--baseline-warmup`` unmeasured batches (default two
  superbatches: Belady's CPU tier starts filled with the rows of the first two, so the first
  batches of a round are not typical, and mmap's page cache starts cold).
* **Floors.** The disk's sequential read bandwidth (O_DIRECT over the store's shards) and the
  loader's read bandwidth while reading packed segments (bytes read / busy time of the load
  stage in belady's data-path run; the segments' crc checks run in the assemble stage, and the
  second figure comes from a run without them), in the same run.

* **Encoded rows.** ``--rows float16,int8`` (the default) adds belady with its rows encoded
  (``belady_float16``, ``belady_int8``: `Pipeline(rows=...)`), prepared from the same samples and
  trained with the same seeds under the same limits: the same budget then holds 2x (3.9x) the rows,
  and every miss moves half (about a quarter) of the bytes. They are compared with exact belady by
  disk bytes, data-path epoch, test accuracy and the CPU tier's share of the accesses.

Ratios printed, with the issue's targets: belady data path vs inmemory (<= 1.5x), ginex / belady
and mmap / belady data path (>= 5x, >= 10x), belady model epoch vs inmemory (<= 1.2x), pipelined
vs sequential (>= 1.5x where I/O bound: the ``--io-model`` pair; GraphSAGE's pair is shown too), loader / sequential bandwidth (>= 0.8), and whether the
losses of belady and inmemory are identical epoch by epoch.

The default dataset is bench prepare's (8.4M nodes x 128 float32 = 4.0 GiB of features), reused
from ``bench-data/prepare`` when that cache holds the same synthetic config, else synthesised into
``--workdir``. With fanouts 10,10,10 and batches of 1024 a batch touches about 7% of that graph.
The feature budget holds the CPU tier, the staging buffers (a batch's disk rows pass through them
in pieces of at most 32 MiB, so they do not grow with the batch) and the I/O buffers; the
assembled batches (each a whole batch's feature matrix: the training step's input, in device
memory on a GPU) are part of the process allowance, which adds the ones a CPU trainer holds
beyond the probe's.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..config import fanouts_option
from ..errors import ConfigError, DiskflowError, InputError
from ..operators.formats.checksum import crc32
from ..operators.formats.manifest import read_manifest
from ..operators.options import CPU_SHARE
from .common import (
    add_graph_arguments,
    drop_trees,
    read_ahead_kb,
)
from .harness import (
    ALLOWANCE_MARGIN,
    budget_fit,
    launch,
    probe_allowances,
    samples_files,
    seq_read_bw,
    useful_bytes,
)

__all__ = ["BASELINES", "DEFAULT_WORKDIR", "ENCODED", "ONLINE", "PARTITIONS", "PIPELINES", "RUN_ORDER", "SWEPT",
           "TARGETS", "TOTAL_EPOCHS", "accuracy_gaps", "add_arguments", "encoded_figures", "pipeline_figures", "run"]

PIPELINES = ("inmemory", "mmap", "ginex", "diskgnn", "belady", "gnndrive", "lsmgnn", "belady_outre", "outre")
ONLINE = ("gnndrive", "lsmgnn")      # trained with no preparation, sampling the round's batches on the fly
TOTAL_EPOCHS = (1, 10)               # the table's "time to train E epochs, preparation included"
BASELINES = ("mmap", "ginex")        # the ones --baseline-batches cuts short by default
RUN_ORDER = ("belady", "diskgnn", "ginex", "gnndrive", "lsmgnn", "belady_outre", "outre", "mmap", "inmemory")
SWEPT = "belady_outre"               # the pipeline --staleness-sweep runs at other staleness thresholds
DEFAULT_WORKDIR = Path("bench-data") / "compare"
PARTITIONS = "partitions"            # in the workdir: the OUTRE pipelines' partitions, shared by their prepares
_CHUNK = 8 << 20                     # read size when checksumming sample files
TARGETS = {"belady_data_vs_inmemory": ("<=", 1.5), "ginex_over_belady": (">=", 5.0),
           "mmap_over_belady": (">=", 10.0), "belady_model_vs_inmemory": ("<=", 1.2),
           "pipelined_speedup": (">=", 1.5), "pipelined_speedup_io_bound": (">=", 1.5),
           "loader_over_seq_bw": (">=", 0.8), "belady_over_outre_bytes": (">=", 1.4),
           "outre_acc_gap_points": ("<=", 1.0), "ginex_over_gnndrive": (">=", 1.0),
           "mmap_over_gnndrive": (">=", 5.0), "lsmgnn_misses_over_belady_plan": ("<=", 1.3),
           "belady_float16_bytes_vs_exact": ("<=", 0.55), "belady_float16_data_vs_exact": ("<=", 0.75),
           "belady_float16_acc_gap_points": ("<=", 0.2), "belady_int8_bytes_vs_exact": ("<=", 0.3),
           "belady_int8_acc_gap_points": ("<=", 1.0)}
ENCODED = "belady_{}"                # the name of belady with its rows encoded (`--rows`)



FEATURE_SHARE = f"{CPU_SHARE:.0%}"     # the feature budget's default: the library's CPU share

def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `diskflow bench compare`."""
    from .prepare import DEFAULT_NODES

    p.add_argument("--pipelines", default=",".join(PIPELINES),
                   help=f"comma-separated pipelines to compare (default all: {','.join(PIPELINES)}), built-in names "
                        "or .py files that define a diskflow.Pipeline with the packed loader; belady is "
                        "always prepared, its samples feed inmemory and mmap")
    p.add_argument("--dataset", metavar="STORE", help="an ingested store to use instead of the synthetic graph")
    add_graph_arguments(p, nodes=DEFAULT_NODES, size_note="4.0 GiB of 128-dim float32 features", train_frac=0.006,
                        train_note="~50 batches of 1024")
    p.add_argument("--workers", type=int, default=None,
                   help="Dask worker processes generating the dataset (default one per core; 0 = threads)")
    p.add_argument("--seed", type=int, default=0, help="seed of the graph, the samples and the model")
    p.add_argument("--fanouts", type=fanouts_option(), default=(10, 10, 10), help="per-hop fanouts (default 10,10,10)")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per minibatch (default 1024)")
    p.add_argument("--superbatch-size", type=int, default=8, help="batches per superbatch (default 8)")
    p.add_argument("--epochs", type=int, default=2, help="epochs per run (default 2)")
    p.add_argument("--model", default="sage", metavar="MODEL",
                   help="the model every pipeline trains: sage (default), gcn, gat, mlp, or the path of a .py file "
                        "that defines a diskflow.Model")
    p.add_argument("--hidden", type=int, default=128, help="the model's hidden channels (default 128)")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 3e-3)")
    p.add_argument("--io-model", default="mlp", choices=("mlp", "sage", "gcn", "gat"),   # operators.models.MODELS
                   help="belady's pipelined vs --sequential pair where I/O is the bottleneck trains this model "
                        "(default mlp: on CPU, GraphSAGE's compute dwarfs the disk, so its pair cannot show overlap)")
    p.add_argument("--io-threads", type=int, default=1,
                   help="torch threads of that pair, both runs (default 1: on 2 cores the other one is left to "
                        "the load and assemble stages)")
    p.add_argument("--feature-budget", default=FEATURE_SHARE,
                   help="host memory for features, bytes or a share of the feature bytes (default %(default)s): the "
                        "packed pipelines' --cpu-memory, and with the allowance the cgroup limit of every "
                        "out-of-core pipeline")
    p.add_argument("--allowance", default=None,
                   help="memory for the process itself inside the cgroup (default: measured, see the table)")
    p.add_argument("--queue-depth", type=int, default=2, help="trainer queue depth (default 2)")
    p.add_argument("--baseline-batches", type=int, default=0,
                   help="measure the --cut-short pipelines on K batches of the first epoch only, scaled to the "
                        "round (default 0: whole epochs)")
    p.add_argument("--baseline-warmup", type=int, default=None,
                   help="unmeasured batches before those K (default two superbatches)")
    p.add_argument("--cut-short", default=",".join(BASELINES),
                   help=f"pipelines --baseline-batches applies to (default {','.join(BASELINES)})")
    p.add_argument("--repeats", type=int, default=1,
                   help="run every pipeline this many times, interleaved, and keep each run's fastest (default 1)")
    p.add_argument("--threads", type=int, default=None, help="torch threads of each run (default: torch's)")
    p.add_argument("--bw-bytes", type=int, default=1 << 30,
                   help="bytes of store shards read to measure the sequential read bandwidth (default 1 GiB)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds one run may take (default 3600)")
    p.add_argument("--rows", default="float16,int8", metavar="ENC,...",
                   help="encodings of belady's rows run beside exact belady, each as belady_ENC (default "
                        "float16,int8; empty: none)")
    p.add_argument("--no-model", action="store_true",
                   help="the data-path runs only (--model none): no GraphSAGE runs, so no model epochs and no "
                        "accuracy; a re-measure of the data paths alone")
    p.add_argument("--staleness-sweep", default="1,10,100,1000",
                   help=f"history staleness thresholds {SWEPT} also runs at (bytes, epoch time, accuracy); '' for none "
                        "(default 1,10,100,1000)")
    p.add_argument("--no-cgroup", action="store_true",
                   help="run without memory cgroups (no limits: out-of-core figures are then not out of core; "
                        "the table says so)")
    p.add_argument("--workdir", default=str(DEFAULT_WORKDIR),
                   help=f"where packed datasets and runs go (default ./{DEFAULT_WORKDIR}; large)")
    p.add_argument("--keep", action="store_true",
                   help="keep the run directories, and the packed datasets of the pipelines with samples of their own "
                        "(the OUTRE ones; by default each is removed once its runs are done, so that the disk holds "
                        "one of them at a time; the shared-sample ones are always kept)")


def _check_args(args: argparse.Namespace) -> list[str]:
    """Check the options; the pipelines in run order. Sets ``args.definitions`` (name -> `diskflow.Pipeline`)."""
    from ..config import model_option
    from ..flow.pipeline import load_pipeline, pipeline_names

    args.model = model_option(args.model)
    given = pipeline_names(args.pipelines)
    unknown = [n for n in given if n not in PIPELINES and not n.endswith(".py")]
    if not given or unknown:
        raise ConfigError("--pipelines", f"expected names from {', '.join(PIPELINES)} or .py files defining a "
                                         f"diskflow.Pipeline, got {args.pipelines!r}")
    defs = {n: load_pipeline(n) for n in [*given, "belady"]}
    users = [n for n in given if n.endswith(".py")]
    for path in users:
        d = defs[path]
        if d.loader != "packed":
            raise ConfigError("--pipelines", f"{path}: the {d.name} pipeline uses the {d.loader} loader; compare "
                                             "takes pipelines with the packed loader (inmemory, mmap, gnndrive and "
                                             "lsmgnn are built in)")
        if d.name in PIPELINES or sum(defs[u].name == d.name for u in users) > 1:
            raise ConfigError("--pipelines", f"{path}: its pipeline's name {d.name!r} is taken; give it another name")
    args.definitions = {d.name: d for d in defs.values()}
    names = [defs[n].name for n in given]
    try:
        sweep = [int(x) for x in str(args.staleness_sweep).split(",") if x.strip()]
    except ValueError:
        raise ConfigError("--staleness-sweep", f"expected comma-separated integers >= 1, got {args.staleness_sweep!r}"
                          ) from None
    if any(x < 1 for x in sweep):
        raise ConfigError("--staleness-sweep", f"thresholds must be >= 1, got {args.staleness_sweep!r}")
    args.encoded = _encoded(args, names)
    args.sweep = {}                  # staleness -> the pipeline run at it
    if SWEPT in names:
        base = args.definitions[SWEPT]
        for x in sweep:
            name = SWEPT if x == base.history_staleness else f"{SWEPT}_s{x}"
            args.sweep[x] = name
            if name not in args.definitions:
                args.definitions[name] = base.with_options(name=name, history_staleness=x)
    for option, value in (("--nodes", args.nodes), ("--dim", args.dim), ("--batch-size", args.batch_size),
                          ("--superbatch-size", args.superbatch_size), ("--epochs", args.epochs),
                          ("--hidden", args.hidden), ("--queue-depth", args.queue_depth), ("--repeats", args.repeats),
                          ("--bw-bytes", args.bw_bytes), ("--io-threads", args.io_threads)):
        if value < 1:
            raise ConfigError(option, f"must be >= 1, got {value}")
    if args.baseline_batches < 0:
        raise ConfigError("--baseline-batches", f"must be >= 0, got {args.baseline_batches}")
    if args.baseline_warmup is not None and args.baseline_warmup < 0:
        raise ConfigError("--baseline-warmup", f"must be >= 0, got {args.baseline_warmup}")
    cut = [n.strip() for n in str(args.cut_short).split(",") if n.strip()]
    if any(n not in PIPELINES and n not in args.definitions for n in cut):
        raise ConfigError("--cut-short", f"expected names from {', '.join(args.definitions)}, got {args.cut_short!r}")
    args.cut_short = cut
    if args.threads is not None and args.threads < 1:
        raise ConfigError("--threads", f"must be >= 1, got {args.threads}")
    if not args.timeout > 0:
        raise ConfigError("--timeout", f"must be > 0 seconds, got {args.timeout}")
    order = [*RUN_ORDER[:3], *(defs[u].name for u in users), *RUN_ORDER[3:]]
    swept = [n for n in args.sweep.values() if n != SWEPT]
    order = [m for n in order for m in ([n, *swept] if n == SWEPT else [n, *args.encoded] if n == "belady" else [n])]
    return [n for n in order if n in names or n in swept or n in args.encoded]


def _encoded(args: argparse.Namespace, names: list[str]) -> list[str]:
    """The belady_ENC pipelines of ``--rows`` (defined in ``args.definitions``), when belady runs."""
    from ..operators.formats.rowcodec import ENCODINGS

    encodings = [x.strip() for x in str(args.rows).split(",") if x.strip()]
    bad = [x for x in encodings if x not in ENCODINGS or x == "exact"]
    if bad:
        raise ConfigError("--rows", f"expected encodings from {', '.join(e for e in ENCODINGS if e != 'exact')}, "
                                    f"got {args.rows!r}")
    if "belady" not in names:
        return []
    out = []
    for enc in encodings:
        name = ENCODED.format(enc)
        args.definitions[name] = args.definitions["belady"].with_options(name=name, rows=enc)
        out.append(name)
    return out


def _exact(pipeline: Any) -> bool:
    """Whether a pipeline trains on the round's shuffled samples unchanged (so on belady's very samples)."""
    return pipeline.batches == "shuffled" and pipeline.history_memory in (None, 0, "0")


# ---------------------------------------------------------------------------- the dataset and its samples

def _dataset(args: argparse.Namespace, work: Path) -> Any:
    """The store: --dataset, bench prepare's cached synthetic graph when its config matches, else a new one."""
    from ..operators.formats.store import Store
    from ..operators.ingest.synth import SynthConfig
    from .prepare import DEFAULT_WORKDIR as PREPARE_WORKDIR
    from .prepare import TEST_FRAC, VAL_FRAC, make_dataset

    if args.dataset:
        return Store(args.dataset)
    cfg = SynthConfig(num_nodes=args.nodes, feature_dim=args.dim, dtype=args.dtype, avg_degree=args.avg_degree,
                      train_frac=args.train_frac, val_frac=VAL_FRAC, test_frac=TEST_FRAC, seed=args.seed,
                      part_nodes=args.part_nodes)
    shared = PREPARE_WORKDIR.absolute()
    raw = read_manifest(shared / "raw") if (shared / "raw").is_dir() else None
    if raw is not None and raw.get("config") == cfg.as_dict() and read_manifest(shared / "store") is not None:
        return Store(shared / "store")
    return Store(make_dataset(args, work))


def _prepare_all(store: Any, names: list[str], work: Path, budget: int, fit: dict[str, int],
                 args: argparse.Namespace, belady: bool = True) -> dict[str, dict[str, Any]]:
    """Prepare belady (unless told not to) and the other packed pipelines of `names`, cached under
    `work`/packed.

    The pipelines cut into partition batches share one partition of the store (`PARTITIONS` in
    `work`, kept for the next run like belady's round): computed by the first, linked into the
    caches of the others (`flow.prepare.link_partitions`); each one's preparation time still
    counts the partitioning."""
    import dask

    from ..flow.prepare import link_partitions

    out: dict[str, dict[str, Any]] = {}
    for name in (["belady"] if belady else []) + [n for n in names if n != "belady"]:
        pipeline = args.definitions[name]
        if pipeline.loader != "packed":
            continue
        path = work / "packed" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        cache, partitioned = Path(f"{path}.work"), pipeline.batches == "partition"
        lent = partitioned and bool(link_partitions(work / PARTITIONS, cache))
        if lent:
            print(f"  {name}: the partition of an earlier pipeline ({work / PARTITIONS})", flush=True)
        with dask.config.set(scheduler="threads"):
            r = pipeline.prepare(store.path, path, cpu_memory=budget, io_reserve=fit["io_buffer_bytes"],
                                 staging_batches=fit["staging_buffers"], fanouts=tuple(args.fanouts),
                                 batch_size=args.batch_size, superbatch_size=args.superbatch_size,
                                 epochs=args.epochs, seed=args.seed, history_dim=args.hidden, quiet=True)
        if partitioned:
            link_partitions(cache, work / PARTITIONS)
        reused = float((r.figures.get("partition") or {}).get("seconds", 0.0)) if lent and not r.skipped else 0.0
        out[name] = {"path": path, "skipped": r.skipped, "seconds": r.seconds + reused, "figures": r.figures,
                     "prepare_s": _prepare_seconds(path, r, reused)}
    return out


def _prepare_seconds(path: Path, r: Any, reused: float = 0.0) -> float | None:
    """How long preparing `path` took: this run's time (plus `reused`, the seconds of a partition computed
    by another pipeline's prepare), or, for a cache an earlier run prepared, the time that run recorded for
    the same configuration (in ``WORKDIR/prepare_seconds.json``; None if none did: the totals with
    preparation then say so)."""
    book = path.parent.parent / "prepare_seconds.json"
    try:
        known = json.loads(book.read_text()) if book.is_file() else {}
    except ValueError:
        known = {}
    manifest = read_manifest(path)
    assert manifest is not None                         # a prepared dataset: finished, so it has one
    key = str(manifest.get("config_hash"))
    if not r.skipped:
        known[path.name] = {"config_hash": key, "seconds": float(r.seconds) + reused}
        tmp = book.with_suffix(".tmp")
        tmp.write_text(json.dumps(known, indent=1))
        tmp.replace(book)
        return float(r.seconds) + reused
    entry = known.get(path.name) or {}
    return float(entry["seconds"]) if entry.get("config_hash") == key else None


def _file_crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = crc32(chunk, crc)
    return crc


def _same_samples(prepared: dict[str, dict[str, Any]]) -> bool:
    """Whether every prepared dataset holds byte-identical sample files (the same batches, the same subgraphs)."""
    crcs = {name: [_file_crc(p) for files in samples_files(info["path"]).values() for p in files]
            for name, info in prepared.items()}
    first = next(iter(crcs.values()))
    return all(c == first for c in crcs.values())


# ---------------------------------------------------------------------------- the machine


# ---------------------------------------------------------------------------- figures

def _scaled(run: dict[str, Any], batches: int, epochs: int) -> dict[str, Any] | None:
    """Per-epoch seconds and round disk bytes of a run, scaled from its first batches when cut short."""
    if "error" in run:
        return None
    if run.get("partial"):
        p = run["partial"]
        k, n, w = int(p["batches"]), int(p["of"]), int(p["first"])
        return {"epoch_s": p["seconds"] * n / k, "disk_read_bytes": int(p["read_bytes"] * batches / k),
                "measured_read_bytes": int(p["read_bytes"]), "measured_batches": list(range(w, w + k)),
                "cut": f"batches {w + 1}-{w + k} of {n}, scaled"}
    eps = run.get("epochs") or []       # none: the run never started (its pipeline failed to prepare)
    if len(eps) != epochs:
        return None
    return {"epoch_s": sum(e["seconds"] for e in eps) / len(eps), "disk_read_bytes": int(sum(e["read_bytes"] for e in eps)),
            "measured_read_bytes": int(sum(e["read_bytes"] for e in eps)), "measured_batches": list(range(batches)),
            "cut": None}


def _best(children: list[dict[str, Any]], kind: str, batches: int, epochs: int
          ) -> tuple[dict[str, Any], dict[str, Any] | None, list[float]]:
    """The fastest repeat of one run kind: (its run, its scaled figures, every repeat's epoch seconds).

    The machine's other users only ever slow a run down, so the fastest repeat is the least disturbed.
    """
    done = [(run, sc) for run in (c["runs"].get(kind, {}) for c in children)
            if (sc := _scaled(run, batches, epochs)) is not None]
    if not done:
        return (children[0]["runs"].get(kind, {}) if children else {}), None, []
    run, sc = min(done, key=lambda x: x[1]["epoch_s"])
    return run, sc, [x[1]["epoch_s"] for x in done]


def pipeline_figures(children: list[dict[str, Any]], batches: int, epochs: int, useful: np.ndarray | None,
             plan_miss: int | None) -> dict[str, Any]:
    """One pipeline's figures from its children (one per repeat): the fastest data-path and model runs."""
    drun, d, data_all = _best(children, "data", batches, epochs)
    model, m, model_all = _best(children, "model", batches, epochs)
    rep = model.get("report") or {}
    amp = None
    if d is not None and useful is not None:
        u = int(useful[d["measured_batches"]].sum())
        amp = d["measured_read_bytes"] / u if u else None
    runs = [r for c in children for r in c["runs"].values()]
    peaks = [r["train_peak_rss_bytes"] for r in runs if r.get("train_peak_rss_bytes")]
    def group(key: str, g: str) -> list[Any]:
        return [c["groups"][g].get(key) for c in children if g in c.get("groups", {})]

    cg = {g: [x for x in group("cgroup_peak_bytes", g) if x is not None] for g in ("data", "model")}
    errors = {f"{k} (repeat {i + 1})": r["error"] for i, c in enumerate(children) for k, r in c["runs"].items()
              if "error" in r}
    losses = [[e["losses"] for e in rr["report"]["epochs"]] for c in children
              if (rr := c["runs"].get("model", {})).get("report")]
    drep = drun.get("report") or {}
    online = [e["online"] for e in drep.get("epochs", []) if "online" in e]
    buffer = drep.get("online") or {}       # the online loader's buffer and reads, as its report gives them
    ds = drep.get("dataset") or {}
    row_bytes = ds["feature_bytes"] // ds["nodes"] if ds.get("nodes") else 0
    return {
        "data_epoch_s": None if d is None else d["epoch_s"],
        "epoch_s": None if m is None else m["epoch_s"],
        "data_epoch_s_repeats": data_all, "epoch_s_repeats": model_all,
        "disk_read_bytes": None if d is None else d["disk_read_bytes"],
        "model_disk_read_bytes": None if m is None else m["disk_read_bytes"],
        "plan_miss_bytes": plan_miss,
        "useful_bytes": None if useful is None else int(useful.sum()),
        "read_amplification": amp,
        "peak_rss_bytes": max(peaks) if peaks else None,
        "cgroup_peak_bytes": max(cg["model"]) if cg["model"] else None,
        "data_cgroup_peak_bytes": max(cg["data"]) if cg["data"] else None,
        "cgroup_limit_bytes": (group("limit_bytes", "model") or [None])[0],
        "data_cgroup_limit_bytes": (group("limit_bytes", "data") or [None])[0],
        "test_acc": (rep.get("final") or {}).get("test_acc"),
        "losses": losses[0] if losses else None,
        "losses_repeatable": all(x == losses[0] for x in losses) if losses else None,
        "cut_short": (d or {}).get("cut") or (m or {}).get("cut"),
        "first_batch_s": ((drun.get("epochs") or [{}])[0]).get("first_batch_s"),
        "online": None if not online else {
            "miss_bytes": sum(e["misses"] for e in online) * row_bytes, "rows": sum(e["rows"] for e in online),
            "hits": sum(e["hits"] for e in online), "misses": sum(e["misses"] for e in online),
            **{k: buffer.get(k) for k in ("memory", "slots", "policy", "window", "read_unit", "gap_bytes")}},
        "process_read_bytes": {g: group("process_read_bytes", g) for g in ("data", "model")},
        "wall_s": {g: group("wall_s", g) for g in ("data", "model")},
        "errors": errors or None,
    }


def _loader_bw(run: dict[str, Any]) -> float | None:
    """Bytes the loader read over the busy time of its load stage (a data-path run of the trainer)."""
    rep = run.get("report")
    if not rep:
        return None
    busy = rep["stages"]["load"]["busy_s"]
    return rep["io"]["bytes_read"] / busy if busy > 0 else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _crossover(planned: dict[str, Any] | None, online: dict[str, Any], epoch: str = "epoch_s") -> int | None:
    """The fewest epochs from which the planned pipeline, its preparation included, trains faster than the online
    one (None: it never does, or a figure is missing). `epoch`: the epoch time compared, the SAGE epoch's, or
    ``"data_epoch_s"``: the data path's alone, as with a trainer that costs nothing beside it (a fast GPU)."""
    if planned is None or planned.get("prepare_s") is None or planned.get(epoch) is None \
            or online.get(epoch) is None:
        return None
    gain = online[epoch] - planned[epoch]
    if gain <= 0:
        return None
    return math.floor(planned["prepare_s"] / gain) + 1


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Prepare, measure every pipeline in its own (limited) process, print the tables, return the figures."""
    from ..flow.runtimes.packed import budget as parse_budget
    from .cgroup import current_procs, find_hierarchy, unavailable_reason
    from .comparetables import print_figures
    from .prepare import max_batch_rows

    names = _check_args(args)
    hierarchy = None
    if not args.no_cgroup:
        hierarchy = find_hierarchy()
        why = unavailable_reason(hierarchy)
        if why is not None:
            raise ConfigError("--no-cgroup", f"memory cgroups are unavailable: {why}; pass --no-cgroup to run "
                                             "without memory limits (the table then says so)")
    work = Path(args.workdir).absolute()
    work.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()[0]
    t_setup = time.perf_counter()
    store = _dataset(args, work)
    fb = store.feature_bytes
    budget = parse_budget(args.feature_budget, "--feature-budget", fb)
    if budget is None or budget <= 0:
        raise ConfigError("--feature-budget", f"must be > 0, got {args.feature_budget!r}")
    from ..api import prepare_options
    from ..flow.pipeline import load_pipeline

    belady = load_pipeline("belady")
    base = belady.prepare_config(**prepare_options(belady, store, fanouts=tuple(args.fanouts), batch_size=args.batch_size,
                                                   superbatch_size=args.superbatch_size, epochs=args.epochs,
                                                   seed=args.seed))
    max_rows = max_batch_rows(store, base, work)     # the round's largest batch: the sampling options alone count
    fit = budget_fit(store, budget, max_rows, args.queue_depth)
    # the pipelines with samples of their own are prepared just before their runs and, unless --keep or
    # --repeats, removed after them: at the defaults each packed round is as big as belady's
    transient = [] if args.keep or args.repeats > 1 else \
        [n for n in names if n in args.definitions and not _exact(args.definitions[n])]
    prepared = _prepare_all(store, [n for n in names if n not in transient], work, budget, fit, args)
    setup_s = time.perf_counter() - t_setup
    samples_identical = _same_samples({k: v for k, v in prepared.items() if _exact(args.definitions[k])})
    if not samples_identical:
        raise InputError(work / "packed", "the prepared datasets hold different samples; remove them and re-run")
    ref = prepared["belady"]["path"]
    warm = {str(e): [str(p) for p in files] for e, files in samples_files(ref).items()}
    sample_bytes = sum(Path(p).stat().st_size for files in warm.values() for p in files)
    manifest = read_manifest(ref)
    assert manifest is not None                         # belady's prepared dataset
    batches = int(manifest["round"]["batches"]) // args.epochs     # per epoch

    seq_bw, bw_bytes = seq_read_bw(store, args.bw_bytes)
    droppable = [store.path, work / "packed"]
    runs_dir = work / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    shared = {"store": str(store.path), "samples": str(ref), "model": args.model, "hidden": args.hidden, "lr": args.lr, "seed": args.seed,
              "epochs": args.epochs, "fanouts": list(args.fanouts), "batch_size": args.batch_size,
              "threads": args.threads, "warm": warm, "queue_depth": args.queue_depth, "cpu_memory": budget,
              "sequential": False, "measure": None,
              "home_procs": str(current_procs(hierarchy)) if hierarchy is not None else None}

    allow = probe_allowances(shared, work, fit, args.allowance, args.timeout, runs_dir)
    limits = allow.limits(budget, args.no_cgroup)
    warmup = 2 * args.superbatch_size if args.baseline_warmup is None else args.baseline_warmup
    if args.baseline_batches and warmup + args.baseline_batches >= batches:
        raise ConfigError("--baseline-batches", f"{warmup} warm-up + {args.baseline_batches} measured batches do not "
                                                f"fit in an epoch of {batches} batches; lower them")

    children: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for repeat in range(args.repeats):      # interleaved: every pipeline once per repeat
        for name in names:
            groups: dict[str, list[dict[str, Any]]] = {
                "data": [{"kind": "data", "model": "none", "sequential": False}],
                "model": [{"kind": "model", "model": args.model, "sequential": False}]}
            if name == "belady":
                groups["data"].append({"kind": "data_nocrc", "model": "none", "sequential": False, "check_crc": False})
                groups["model"] += [{"kind": "sequential", "model": args.model, "sequential": True},
                                    {"kind": "io_model", "model": args.io_model, "sequential": False,
                                     "threads": args.io_threads},
                                    {"kind": "io_sequential", "model": args.io_model, "sequential": True,
                                     "threads": args.io_threads}]
            if args.no_model:
                del groups["model"]
            try:
                if name in transient and args.definitions[name].loader == "packed":
                    print(f"preparing {name} ...", flush=True)
                    t_prep = time.perf_counter()
                    try:
                        prepared.update(_prepare_all(store, [name], work, budget, fit, args, belady=False))
                    except DiskflowError as e:      # the other pipelines' runs go on; the table says why
                        print(f"  {name}: prepare failed: {e}", flush=True)
                        children[name].append({"runs": {"prepare": {"error": str(e)}}, "groups": {}})
                        continue
                    finally:
                        setup_s += time.perf_counter() - t_prep
                child: dict[str, Any] = {"runs": {}, "groups": {}}
                own = None if name not in prepared or _exact(args.definitions[name]) else \
                    {str(e): [str(p) for p in files] for e, files in samples_files(prepared[name]["path"]).items()}
                if name in ONLINE:      # they read no stored sample
                    own = {str(e): [] for e in range(args.epochs)}
                for group, runs in groups.items():
                    spec = {**shared, "pipeline": name, "group": group, "drop": [str(p) for p in droppable],
                            **({"warm": own} if own is not None else {}),
                            "packed": str(prepared[name]["path"]) if name in prepared else None,
                            "measure": [warmup, args.baseline_batches] if args.baseline_batches and name in args.cut_short
                            else None,
                            "runs": [{**r, "run_dir": str(runs_dir / f"{name}-{r['kind']}")} for r in runs]}
                    print(f"running {name}: {', '.join(r['kind'] for r in runs)} (repeat {repeat + 1}/{args.repeats}) ...",
                          flush=True)
                    done = launch(spec, work, None if name == "inmemory" else limits[group], args.timeout)
                    child["runs"].update(done.pop("runs"))
                    child["groups"][group] = done
                    if "error" in done:
                        print(f"  {name} ({group}) failed: {done['error']}", flush=True)
                children[name].append(child)
            finally:       # removed even when a run failed: the next pipeline needs the disk
                if name in transient and args.definitions[name].loader == "packed":
                    path = work / "packed" / name
                    if name in prepared and path.is_dir():
                        prepared[name]["useful"] = useful_bytes(path)
                    for gone in (path, Path(f"{path}.work")):
                        shutil.rmtree(gone, ignore_errors=True)
                    print(f"  removed {path} and its cache (--keep keeps them)", flush=True)
    drop_trees(droppable)

    belady_useful = useful_bytes(ref)
    pipelines: dict[str, Any] = {}
    for name in names:
        useful = belady_useful if name == "mmap" else None if name not in prepared else \
            prepared[name]["useful"] if "useful" in prepared[name] else useful_bytes(prepared[name]["path"])
        plan_miss = int(prepared[name]["figures"]["plan_miss_bytes"]) if name in prepared else None
        pipelines[name] = pipeline_figures(children[name], batches * args.epochs, args.epochs, useful, plan_miss)
        definition = args.definitions.get(name)
        pipelines[name]["batches"] = "shuffled" if definition is None else definition.batches
        pipelines[name]["history"] = prepared[name]["figures"].get("history") if name in prepared else None
        split = prepared[name]["figures"].get("memory_split") if name in prepared else None
        pipelines[name]["memory_split"] = None if split is None else \
            {k: split.get(k) for k in ("budget", "staleness", "prune", "curve", "chosen")}
        pipelines[name]["partition"] = prepared[name]["figures"].get("partition") if name in prepared else None
    loader_bw = None
    if "belady" in names:
        bel = pipelines["belady"]
        _, seq, seq_all = _best(children["belady"], "sequential", batches * args.epochs, args.epochs)
        bel["sequential_epoch_s"] = None if seq is None else seq["epoch_s"]
        bel["sequential_epoch_s_repeats"] = seq_all
        if bel["sequential_epoch_s"] and bel["data_epoch_s"]:     # overlap can at best hide the shorter part
            s_, d_ = bel["sequential_epoch_s"], bel["data_epoch_s"]
            bel["pipelined_bound"] = s_ / max(d_, s_ - d_)
        for kind in ("io_model", "io_sequential"):     # the pair where I/O is the bottleneck
            _, sc, every = _best(children["belady"], kind, batches * args.epochs, args.epochs)
            bel[f"{kind}_epoch_s"] = None if sc is None else sc["epoch_s"]
            bel[f"{kind}_epoch_s_repeats"] = every
        bel["io_model"], bel["io_threads"] = args.io_model, args.io_threads
        data_run, _, _ = _best(children["belady"], "data", batches * args.epochs, args.epochs)
        loader_bw = _loader_bw(data_run)
        bel["loader_read_bw_no_crc"] = _loader_bw(_best(children["belady"], "data_nocrc", batches * args.epochs,
                                                        args.epochs)[0])

    for p in pipelines.values():    # the disk's floor for the bytes each data path read, at sequential speed
        p["disk_floor_s"] = None if p["disk_read_bytes"] is None else p["disk_read_bytes"] / args.epochs / seq_bw
    for name, p in pipelines.items():   # time to train E epochs, preparation included
        p["prepare_s"] = prepared[name].get("prepare_s") if name in prepared else 0.0
        p["total_s"] = {str(e): None if p["epoch_s"] is None or p["prepare_s"] is None
                        else p["prepare_s"] + e * p["epoch_s"] for e in TOTAL_EPOCHS}

    def get(name: str, key: str) -> float | None:
        return pipelines.get(name, {}).get(key)

    ratios = {
        "belady_data_vs_inmemory": _ratio(get("belady", "data_epoch_s"), get("inmemory", "data_epoch_s")),
        "ginex_over_belady": _ratio(get("ginex", "data_epoch_s"), get("belady", "data_epoch_s")),
        "mmap_over_belady": _ratio(get("mmap", "data_epoch_s"), get("belady", "data_epoch_s")),
        "belady_model_vs_inmemory": _ratio(get("belady", "epoch_s"), get("inmemory", "epoch_s")),
        "pipelined_speedup": _ratio(get("belady", "sequential_epoch_s"), get("belady", "epoch_s")),
        "pipelined_speedup_io_bound": _ratio(get("belady", "io_sequential_epoch_s"), get("belady", "io_model_epoch_s")),
        "belady_io_model_vs_data": _ratio(get("belady", "io_model_epoch_s"), get("belady", "data_epoch_s")),
        "loader_over_seq_bw": _ratio(loader_bw, seq_bw),
        "belady_data_vs_disk_floor": _ratio(get("belady", "data_epoch_s"), get("belady", "disk_floor_s")),
        "belady_over_outre_bytes": _ratio(get("belady", "disk_read_bytes"), get(SWEPT, "disk_read_bytes")),
        "outre_acc_gap_points": None if get("inmemory", "test_acc") is None or get(SWEPT, "test_acc") is None
        else 100 * (float(get("inmemory", "test_acc") or 0) - float(get(SWEPT, "test_acc") or 0)),
        "ginex_over_gnndrive": _ratio(get("ginex", "data_epoch_s"), get("gnndrive", "data_epoch_s")),
        "mmap_over_gnndrive": _ratio(get("mmap", "data_epoch_s"), get("gnndrive", "data_epoch_s")),
        "lsmgnn_misses_over_belady_plan": _ratio(((pipelines.get("lsmgnn") or {}).get("online") or {}).get("miss_bytes"),
                                                 get("belady", "plan_miss_bytes")),
        "lsmgnn_disk_over_belady_plan": _ratio(get("lsmgnn", "disk_read_bytes"), get("belady", "plan_miss_bytes")),
    }
    encoded = encoded_figures(args, prepared, pipelines)
    for name, enc in encoded.items():
        ratios.update({f"{name}_bytes_vs_exact": enc["bytes_vs_exact"], f"{name}_data_vs_exact": enc["data_vs_exact"],
                       f"{name}_acc_gap_points": enc["acc_gap_points"]})
    il = get("inmemory", "losses")
    online_identical = {n: None if il is None or get(n, "losses") is None else get(n, "losses") == il
                        for n in ONLINE if n in pipelines}
    crossover = {n: _crossover(pipelines.get("belady"), pipelines[n]) for n in ONLINE if n in pipelines}
    crossover_data = {n: _crossover(pipelines.get("belady"), pipelines[n], "data_epoch_s") for n in ONLINE
                      if n in pipelines}
    sweep = [{"staleness": x, "pipeline": n, "disk_read_bytes_per_epoch":
              None if get(n, "disk_read_bytes") is None else float(get(n, "disk_read_bytes") or 0) / args.epochs,
              "data_epoch_s": get(n, "data_epoch_s"), "epoch_s": get(n, "epoch_s"), "test_acc": get(n, "test_acc"),
              "pruned": (pipelines.get(n, {}).get("history") or {}).get("pruned"),
              "history_share": ((pipelines.get(n, {}).get("memory_split") or {}).get("chosen") or {}).get("share")}
             for x, n in sorted(args.sweep.items()) if n in pipelines]
    accuracy = accuracy_gaps(pipelines, args.epochs)
    for x in sweep:
        x["gap_points"] = accuracy["pipelines"][x["pipeline"]]["gap_points"]
    bl, il = get("belady", "losses"), get("inmemory", "losses")
    identical = None if bl is None or il is None else bl == il
    figures: dict[str, Any] = {
        "pipelines": pipelines, "ratios": ratios, "accuracy": accuracy, "losses_identical": identical,
        "encoded_rows": encoded,
        "staleness_sweep": sweep,
        "online_losses_identical": online_identical, "crossover_epochs": crossover,
        "crossover_epochs_data": crossover_data,
        "seq_read_bw": seq_bw, "seq_read_bytes": bw_bytes, "loader_read_bw": loader_bw,
        "feature_bytes": fb, "feature_budget_bytes": budget, "allowance_bytes": allow.model,
        "data_allowance_bytes": allow.data, "allowance_probe_rss_bytes": allow.probe_rss,
        "data_allowance_probe_rss_bytes": allow.data_rss,
        "allowance_margin": ALLOWANCE_MARGIN if allow.probe_rss else None,
        "cgroup_limit_bytes": limits["model"], "data_cgroup_limit_bytes": limits["data"], "cgroup": None if hierarchy is None else f"v{hierarchy.version} {hierarchy.root}",
        "no_cgroup": bool(args.no_cgroup), "page_cache_drop": "posix_fadvise(POSIX_FADV_DONTNEED) on every file of "
        "the store and the packed datasets before each run", "read_ahead_kb": read_ahead_kb(store.shards[0].path),
        "budget_split": fit, "max_batch_rows": max_rows, "samples_identical": samples_identical,
        "sample_bytes": sample_bytes, "batches_per_epoch": batches, "epochs": args.epochs,
        "config": {"fanouts": list(args.fanouts), "batch_size": args.batch_size, "superbatch_size": args.superbatch_size,
                   "hidden": args.hidden, "lr": args.lr, "seed": args.seed, "queue_depth": args.queue_depth,
                   "threads": args.threads, "baseline_batches": args.baseline_batches, "baseline_warmup": warmup,
                   "cut_short": args.cut_short, "repeats": args.repeats, "pipelines": names,
                   "no_model": bool(args.no_model)},
        "dataset": {"store": str(store.path), "nodes": store.num_nodes, "edges": store.num_edges,
                    "dim": store.feature_dim, "dtype": str(store.feature_dtype), "shards": len(store.shards),
                    "train": int(store.split_ids("train").shape[0])},
        "prepare": {k: {"path": str(v["path"]), "skipped": v["skipped"], "seconds": v["seconds"],
                        "cpu_rows": v["figures"].get("cpu_rows"), "misses": v["figures"].get("misses"),
                        "packed_bytes": v["figures"].get("packed_bytes")} for k, v in prepared.items()},
        "setup_s": setup_s, "load_avg": [load0, os.getloadavg()[0]], "cores": os.cpu_count(),
    }
    if not args.keep:
        shutil.rmtree(runs_dir, ignore_errors=True)
    print_figures(figures)
    return figures


def encoded_figures(args: argparse.Namespace, prepared: dict[str, dict[str, Any]], pipelines: dict[str, Any]
                    ) -> dict[str, Any]:
    """Belady with encoded rows against exact belady (same samples, seeds and limits): row bytes, the CPU tier's
    rows and share of the accesses (the plan's), disk bytes and data-path epoch over exact's, test accuracy and
    the gap to exact's in points (positive: accuracy lost)."""
    out: dict[str, Any] = {}
    exact = pipelines.get("belady") or {}
    bf = (prepared.get("belady") or {}).get("figures") or {}
    for name in getattr(args, "encoded", []):
        if name not in pipelines or name not in prepared:
            continue
        p, pf = pipelines[name], prepared[name]["figures"]
        acc, exact_acc = p.get("test_acc"), exact.get("test_acc")
        out[name] = {
            "encoding": (pf.get("rows") or {}).get("encoding"), "row_bytes": pf.get("row_bytes"),
            "exact_row_bytes": bf.get("row_bytes"), "cpu_rows": pf.get("cpu_rows"), "exact_cpu_rows": bf.get("cpu_rows"),
            "cpu_hit_rate": pf["cpu_hits"] / pf["accesses"] if pf.get("accesses") else None,
            "exact_cpu_hit_rate": bf["cpu_hits"] / bf["accesses"] if bf.get("accesses") else None,
            "packed_bytes": pf.get("packed_bytes"), "exact_packed_bytes": bf.get("packed_bytes"),
            "disk_read_bytes": p.get("disk_read_bytes"), "exact_disk_read_bytes": exact.get("disk_read_bytes"),
            "bytes_vs_exact": _ratio(p.get("disk_read_bytes"), exact.get("disk_read_bytes")),
            "data_epoch_s": p.get("data_epoch_s"), "exact_data_epoch_s": exact.get("data_epoch_s"),
            "data_vs_exact": _ratio(p.get("data_epoch_s"), exact.get("data_epoch_s")),
            "epoch_s": p.get("epoch_s"), "exact_epoch_s": exact.get("epoch_s"),
            "test_acc": acc, "exact_test_acc": exact_acc,
            "acc_gap_points": None if acc is None or exact_acc is None else 100 * (float(exact_acc) - float(acc)),
            "read_amplification": p.get("read_amplification")}
    return out


def accuracy_gaps(pipelines: dict[str, Any], epochs: int) -> dict[str, Any]:
    """Each pipeline's test accuracy beside inmemory's after the same `epochs`, and the gap in points
    (inmemory's minus the pipeline's: positive is accuracy lost). The OUTRE pipelines trade accuracy for
    bytes; this is where the trade shows. A pipeline or inmemory without an accuracy has no gap."""
    ref = (pipelines.get("inmemory") or {}).get("test_acc")
    rows = {}
    for name, p in pipelines.items():
        acc = p.get("test_acc")
        rows[name] = {"test_acc": acc, "inmemory_test_acc": ref,
                      "gap_points": None if ref is None or acc is None else 100 * (float(ref) - float(acc))}
    return {"epochs": epochs, "inmemory_test_acc": ref, "pipelines": rows}
