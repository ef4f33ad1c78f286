"""`diskflow demo`: the main job end to end, out of core, at a size that runs in one to two minutes on 2 cores.

The steps are the real ones, each one library call (the functions `diskflow synth`, `ingest`,
`prepare belady`, `train PACKED` and `run inmemory` call), and each prints what it shows:

1. synth, 2. ingest: a synthetic graph written and ingested as Dask graphs on an embedded
   LocalCluster (its dashboard link goes to stderr);
3. prepare belady at ``--cpu-memory`` (10% of the feature bytes): offline sampling of the whole
   round, the GPU/CPU tiers, the Belady-planned CPU cache, batched packing of every miss;
4. the pipelined trainer (load, assemble, graph, train) over direct I/O from the packed dataset:
   where the rows came from (GPU tier, CPU tier, disk), and the bytes it read next to the disk's
   floor (a short O_DIRECT sequential read of the packed files, measured here);
5. the in-memory reference on the same round: its losses must equal the out-of-core run's batch
   for batch (a difference fails the demo, exit 1);
6. an MLP on the same features: the accuracy gap is what the graph adds.

Then a timeline PNG of the job (the Dask workers' tasks, then the trainer's superbatches).
The default sizes make the features (1M nodes x 64 float32, 244 MiB) ten times the budget
while the staging of in-flight batches (small batches, fanouts 5,5) leaves most of the budget to
the CPU tier, and keep the training split small (2%, 20k nodes) so that two GNN runs fit the time.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ..config import PREPARE_DEFAULTS, TrainConfig, fanouts_option
from ..sizes import format_bytes
from .options import integer, positive_int

__all__ = ["DEMO", "FLOOR_BYTES", "SUPERBATCH", "register"]

FLOOR_BYTES = 256 << 20     # the most the floor measurement reads (O_DIRECT, sequential)
SUPERBATCH = 64             # batches per superbatch: prepare's unit of sampling tasks and Belady planning
# The demo's own sizes, unlike the library's defaults on purpose: features ten times the budget, small batches
# and fanouts 5,5 so that staging leaves most of the budget to the CPU tier, a 2% training split and one torch
# thread so that two GNN runs fit one to two minutes on 2 cores (the module's docstring). Its other options
# (--epochs, --seed, --model, --cpu-memory) default to the library's.
DEMO: dict[str, Any] = {"nodes": 1_000_000, "dim": 64, "classes": 8, "train": 0.02, "val": 0.01, "test": 0.01,
                         "fanouts": (5, 5), "batch_size": 128, "hidden": 64, "threads": 1}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="synth -> ingest -> prepare -> train out of core, checked against in-memory "
                                    "(one to two minutes on 2 cores)",
                       description="Make a synthetic graph and ingest it as Dask graphs (watch the dashboard link), "
                                   "prepare it with the belady pipeline at a 10%% feature budget (Belady-planned CPU "
                                   "cache, packed misses), train GraphSAGE out of core with the pipelined trainer "
                                   "over direct I/O, check its losses against the in-memory pipeline's, train an "
                                   "MLP baseline, and print tier hit rates, bytes read against the disk's floor, "
                                   "accuracies and the timeline PNG.")
    p.add_argument("--workdir", default="diskflow-demo", help="where the dataset, store and runs go (default: %(default)s)")
    p.add_argument("--nodes", type=integer("--nodes"), default=DEMO["nodes"], help="synthetic graph size (default: %(default)s)")
    p.add_argument("--dim", type=integer("--dim"), default=DEMO["dim"], help="feature dimension (default: %(default)s)")
    p.add_argument("--classes", type=integer("--classes"), default=DEMO["classes"], help="number of classes (default: %(default)s)")
    p.add_argument("--train", type=float, default=DEMO["train"], help="share of the nodes in the train split (default: %(default)s)")
    p.add_argument("--val", type=float, default=DEMO["val"], help="share in the val split (default: %(default)s)")
    p.add_argument("--test", type=float, default=DEMO["test"], help="share in the test split (default: %(default)s)")
    p.add_argument("--epochs", type=integer("--epochs"), default=TrainConfig.epochs, help="training epochs (default: %(default)s)")
    p.add_argument("--fanouts", type=fanouts_option("--fanouts"), default=DEMO["fanouts"],
                   help=f"neighbours sampled per hop, comma-separated (default: {','.join(map(str, DEMO['fanouts']))})")
    p.add_argument("--batch-size", type=integer("--batch-size"), default=DEMO["batch_size"], help="seeds per batch (default: %(default)s)")
    # prepare's default share, as plain text: the demo refuses a budget too small for its store, as it always has
    p.add_argument("--cpu-memory", default=str(PREPARE_DEFAULTS["cpu_memory"]), metavar="SIZE",
                   help="host memory for features on the trainer (CPU tier + staged misses + I/O buffers), as bytes "
                        "(64MiB) or a share of the feature bytes (default: %(default)s)")
    p.add_argument("--model", choices=("sage", "gcn", "gat"), default=TrainConfig.model, help="GNN model (default: %(default)s)")
    p.add_argument("--hidden", type=integer("--hidden"), default=DEMO["hidden"], help="hidden channels (default: %(default)s)")
    p.add_argument("--threads", type=integer("--threads"), default=DEMO["threads"],
                   help="torch threads of the trainers (default: %(default)s; the pipelined trainer's load, "
                        "assemble and graph stages use the other core)")
    p.add_argument("--workers", type=positive_int("--workers"), default=None, help="Dask worker processes (default: one per core)")
    p.add_argument("--seed", type=int, default=TrainConfig.seed, help="random seed (default: %(default)s)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from .. import load_pipeline
    from ..api import ingest, prepare, prepare_options, synth, train
    from ..cluster import client, register_plugin
    from ..config import SynthConfig
    from ..datasets import Store, check_packed_output
    from ..runs import REPORT, TIMELINE, JobTimeline, new_run_dir, print_epoch
    from ..sizes import byte_budget

    work = Path(args.workdir)
    t0 = time.perf_counter()
    shape = {"nodes": args.nodes, "dim": args.dim, "classes": args.classes, "seed": args.seed,
             "train_frac": args.train, "val_frac": args.val, "test_frac": args.test}
    SynthConfig(num_nodes=args.nodes, feature_dim=args.dim, num_classes=args.classes, seed=args.seed,
                train_frac=args.train, val_frac=args.val, test_frac=args.test)     # bad sizes, a bad budget or
    TrainConfig(model=args.model, hidden=args.hidden, fanouts=tuple(args.fanouts), batch_size=args.batch_size,
                epochs=args.epochs, seed=args.seed, threads=args.threads)         # the same for training options
    byte_budget(args.cpu_memory, "--cpu-memory", args.nodes * args.dim * 4)       # --workdir fail before
    check_packed_output(work / "packed", False)                                   # anything runs
    pipeline = load_pipeline("belady")
    round_ = {"fanouts": tuple(args.fanouts), "batch_size": args.batch_size, "epochs": args.epochs, "seed": args.seed}
    model = {"hidden": args.hidden, "threads": args.threads}
    timeline = JobTimeline()
    with client(n_workers=args.workers) as c, timeline.tasks(c):
        workers = len(c.nthreads())                              # type: ignore[attr-defined]
        register_plugin(c)
        _step(1, f"synth: {args.nodes:,} nodes, {args.dim}-dim float32 features, as a Dask graph on {workers} "
                 f"worker{'s' if workers != 1 else ''}")
        raw, secs = _timed(lambda: synth(work / "raw", **shape))
        _step(2, "ingest: CSC index, feature shards, splits (Dask graph)")
        ingested, ingest_s = _timed(lambda: ingest(raw, work / "store"))
        store = Store(ingested.path)
        print(f"      synth {secs:.1f}s, ingest {ingest_s:.1f}s: {store.num_nodes:,} nodes, {ingested.num_edges:,} "
              f"edges, {format_bytes(store.feature_bytes)} of features")

        options = {"cpu_memory": args.cpu_memory, "superbatch_size": SUPERBATCH, **round_}
        budget = prepare_options(pipeline, store, **options)["cpu_memory"]
        _step(3, f"prepare belady at --cpu-memory {args.cpu_memory} ({format_bytes(budget)}): sample "
                 "the round, tiers, Belady-planned CPU cache, pack the misses (Dask graph)")
        prepared = prepare(store.path, work / "packed", pipeline, force=True, quiet=False, **options)
    _print_prepared(prepared, budget)

    _step(4, "train out of core: pipelined load -> assemble -> graph -> train, direct I/O from the packed dataset")
    ooc_dir = new_run_dir(work / "runs", f"train-belady-{args.model}")
    ooc = train(prepared.path, args.model, run_dir=ooc_dir, progress=True, cpu_memory=budget,
                **timeline.trainer_hooks(SUPERBATCH, on_epoch=print_epoch), **model)
    _print_out_of_core(ooc, prepared.path)

    _step(5, "in-memory reference: the same round with every feature in RAM")
    ref_dir = new_run_dir(work / "runs", f"inmemory-{args.model}")
    ref = train(store.path, args.model, pipeline="inmemory", run_dir=ref_dir, progress=True, **round_, **model)
    if not _print_same_losses(ooc, ref):
        return 1

    _step(6, "MLP baseline: the same features, no graph")
    mlp_dir = new_run_dir(work / "runs", "inmemory-mlp")
    mlp = train(store.path, "mlp", pipeline="inmemory", run_dir=mlp_dir, progress=True, **round_, **model)

    _print_accuracies(args.model, ooc, ref, mlp)
    png = timeline.plot(ooc_dir / TIMELINE, f"diskflow demo: synth, ingest and prepare on {workers} Dask "
                                            f"worker{'s' if workers != 1 else ''}, then the pipelined trainer "
                                            f"({args.model}, out of core)")
    print(f"timeline: {png}")
    print(f"reports: {', '.join(str(d / REPORT) for d in (ooc_dir, ref_dir, mlp_dir))}")
    print(f"total {time.perf_counter() - t0:.1f}s")
    return 0


def _step(n: int, text: str) -> None:
    print(f"[{n}/6] {text}", flush=True)


def _timed(fn: Any) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def _print_prepared(r: Any, budget: int) -> None:
    """Prepare's time by phase, the tiers it chose, and what it packed."""
    f = r.figures
    acc = max(1, int(f["accesses"]))
    rb = int(f["row_bytes"])
    print(f"      {r.seconds:.1f}s ({', '.join(f'{k} {v:.1f}s' for k, v in r.phases.items())}); "
          f"{f['batches']:,} batches, {f['accesses']:,} feature-row accesses")
    print(f"      budget {format_bytes(budget)}: CPU tier {f['cpu_rows']:,} rows ({format_bytes(f['cpu_rows'] * rb)}, "
          f"{f['cpu_hits'] / acc:.1%} of accesses, {f['inserts']:,} Belady inserts) + staged misses "
          f"{format_bytes(f['staging_bytes'])} + I/O buffers {format_bytes(f['io_buffer_bytes'])}; "
          + (f"GPU tier {f['gpu_rows']:,} rows" if f["gpu_rows"] else "no GPU tier (training on the CPU)"))
    print(f"      packed {f['misses']:,} missed rows ({f['misses'] / acc:.1%} of accesses) into per-batch segments: "
          f"{format_bytes(f.get('disk_used_bytes', 0))} -> {r.path}")


def _print_out_of_core(report: dict[str, Any], packed: Path) -> None:
    """Where the trainer's rows came from, and the bytes it read next to the disk's floor."""
    rows = report["tiers"]["rows"]
    total = max(1, int(report["tiers"]["total"]))
    disk = sum(int(v) for k, v in rows.items() if k not in ("gpu", "cpu"))
    print(f"      rows served: GPU tier {rows.get('gpu', 0) / total:.1%}, CPU tier {rows.get('cpu', 0) / total:.1%}, "
          f"disk {disk / total:.1%} (of {total:,})")
    io = report["io"]
    read, read_s = float(io.get("bytes_read", 0)), float(io.get("seconds", 0))
    amp = io.get("read_amplification")
    print(f"      disk: {format_bytes(read)} read" + (f" ({amp:.3f}x the missed rows' bytes)" if amp else "")
          + f" in {int(io.get('requests', 0)):,} direct-I/O requests ({io.get('backend')}), {read_s:.2f}s of reads")
    bw, probe, part = _floor(packed)
    if part and bw > 0:
        floor_s = read / bw
        print(f"      disk floor: a sequential O_DIRECT read at {format_bytes(bw)}/s (measured now: {format_bytes(probe)} "
              f"of {part}) takes {floor_s:.2f}s for those bytes; the trainer's reads took "
              f"{read_s / floor_s if floor_s > 0 else float('nan'):.2f}x that")
    stages = report["stages"]
    print("      stage busy s: " + ", ".join(f"{k} {v['busy_s']:.2f}" for k, v in stages.items())
          + f"; peak RSS {format_bytes(report['peak_rss_bytes'])}")


def _floor(packed: Path) -> tuple[float, int, str]:
    """The disk's sequential read bandwidth (bytes/s) over the packed part files, largest first, up to
    `FLOOR_BYTES`, each read with O_DIRECT (`bench.common.sequential_read_bw`); the bytes read to
    measure it and which files (nan, 0, "" where nothing was packed)."""
    from ..bench.common import sequential_read_bw

    parts = sorted(packed.glob("round-*/part-*.bin"), key=lambda p: p.stat().st_size, reverse=True)
    done, seconds, used = 0, 0.0, []
    for part in parts:
        n = min(part.stat().st_size, FLOOR_BYTES - done)
        if n <= 0:
            break
        bw = sequential_read_bw(part, max_bytes=n)
        if not bw > 0:
            continue
        done, seconds = done + n, seconds + n / bw
        used.append(part)
    what = (str(used[0].relative_to(packed.parent)) if len(used) == 1 else
            f"{len(used)} part files of {packed.name}" if used else "")
    return (done / seconds if seconds > 0 else float("nan")), done, what


def _print_same_losses(ooc: dict[str, Any], ref: dict[str, Any]) -> bool:
    """Whether every batch's loss of the two runs is the same float; says so, or which first differs."""
    a, b = [e["losses"] for e in ooc["epochs"]], [e["losses"] for e in ref["epochs"]]
    if a == b:
        print(f"      losses identical to in-memory: yes, {len(a)} epochs x {len(a[0]) if a else 0} batches")
        return True
    where = next(((e, i, x, y) for e, (ea, eb) in enumerate(zip(a, b)) for i, (x, y) in enumerate(zip(ea, eb))
                  if x != y), None)
    what = (f"epoch {where[0] + 1} batch {where[1] + 1}: {where[2]!r} vs {where[3]!r}" if where is not None
            else f"{sum(map(len, a))} vs {sum(map(len, b))} batches")
    print(f"diskflow demo: the out-of-core losses differ from the in-memory ones ({what})", file=sys.stderr)
    return False


def _print_accuracies(name: str, ooc: dict[str, Any], ref: dict[str, Any], mlp: dict[str, Any]) -> None:
    """Test accuracy of the three runs, chance, and what the graph adds."""
    from dask.utils import asciitable

    chance = 1.0 / max(1, int(ref["dataset"]["num_classes"]))
    print()
    rows = [(label, f"{rep['final']['test_acc']:.4f}", f"{rep['final']['best_val_acc']:.4f}",
             f"{sum(e['stage_s'].get('train', 0.0) for e in rep['epochs']):.2f}")
            for label, rep in ((f"{name} out of core", ooc), (f"{name} in memory", ref), ("mlp in memory", mlp))]
    print(asciitable(["run", "test acc", "best val", "train s"], rows))
    print(f"chance = {chance:.4f}; GNN over MLP: {ref['final']['test_acc'] - mlp['final']['test_acc']:+.4f}")
