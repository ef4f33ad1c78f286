"""`diskflow train PACKED`: train on a packed dataset with the four-stage pipelined trainer.

Prints a line per epoch (loss, accuracies, time, throughput, bytes read) and a table of
stage busy times, queue waits, I/O and tier hit rates; writes ``report.json`` and
``curves.png`` into a fresh run directory (or ``--run-dir``). ``--resume`` continues the
newest unfinished run of the same PACKED under ``--runs-dir`` from its last checkpoint.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..config import DATA_ONLY, MODELS, PREPARE_DEFAULTS, TASKS, TrainConfig, model_label, model_option
from ..errors import ConfigError, InputError
from ..runs import (
    REPORT,
    final_line,
    fmt,
    new_run_dir,
    no_run_left,
    print_epoch,
    unfinished_run,
    use_run_dir,
    write_run_info,
)
from ..sizes import byte_budget as budget
from ..sizes import format_bytes
from .options import float_at_least, integer

__all__ = ["print_summary", "register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train a GNN on a packed dataset (pipelined: load, assemble, graph, train)",
        description="Train on PACKED (from `diskflow prepare`) with four pipelined stages: direct-I/O load of the "
                    "packed segments, assembly from the GPU/CPU tiers, graph loading, and training. The round in "
                    "PACKED fixes the epochs, batches and samples. Budgets are checked before training starts; a "
                    "checkpoint is saved after every epoch (and on Ctrl-C); --resume continues from it.")
    p.add_argument("packed", metavar="PACKED", help="packed dataset directory")
    d = TrainConfig()       # the defaults, from the one place they are set
    p.add_argument("--model", default=d.model, metavar="MODEL",
                   help=f"{', '.join(MODELS)} (default {d.model}), the path of a .py file that defines a "
                        f"diskflow.Model, or {DATA_ONLY} (the data path only, for timing)")
    p.add_argument("--hidden", type=integer("--hidden"), default=d.hidden,
                   help=f"hidden channels (default {d.hidden})")
    p.add_argument("--num-layers", type=integer("--num-layers"), default=None,
                   help="model layers (default: number of hops)")
    p.add_argument("--lr", type=float, default=d.lr,
                   help=f"learning rate: Adam's, or a model file's optimizer factory's (default {d.lr:g})")
    p.add_argument("--weight-decay", type=float_at_least("--weight-decay", 0.0), default=d.weight_decay,
                   metavar="WD", help=f"weight decay: Adam's, or a model file's optimizer factory's (default "
                                      f"{d.weight_decay:g})")
    p.add_argument("--clip-grad", type=float_at_least("--clip-grad", 0.0, inclusive=False), default=d.clip_grad, metavar="NORM",
                   help="clip the gradients' total L2 norm to NORM before each step (default: the model's own "
                        "clip_grad, else none)")
    p.add_argument("--dropout", type=float, default=d.dropout, help=f"dropout probability (default {d.dropout:g})")
    p.add_argument("--heads", type=integer("--heads"), default=d.heads,
                   help=f"GAT attention heads (default {d.heads})")
    p.add_argument("--seed", type=int, default=None,
                   help="model-initialisation seed (default: the round's sampling seed)")
    p.add_argument("--eval-every", type=integer("--eval-every"), default=d.eval_every,
                   help=f"evaluate val/test every N epochs (default {d.eval_every})")
    p.add_argument("--device", default=PREPARE_DEFAULTS["device"],
                   help=f"cpu or cuda[:N] (default {PREPARE_DEFAULTS['device']})")
    p.add_argument("--cpu-memory", default=None, metavar="SIZE",
                   help="host memory for features (CPU tier + in-flight batches + I/O buffers), as bytes (4GiB) "
                        "or a share of the feature bytes (10%%); checked before training (default: unchecked)")
    p.add_argument("--gpu-memory", default=None, metavar="SIZE", help="GPU memory for the GPU tier (default: unchecked)")
    p.add_argument("--queue-depth", type=integer("--queue-depth"), default=PREPARE_DEFAULTS["queue_depth"],
                   help=f"capacity of each queue between stages (default {PREPARE_DEFAULTS['queue_depth']})")
    p.add_argument("--sequential", action="store_true", help="run the stages one after another (no overlap)")
    p.add_argument("--resume", action="store_true", help="continue the newest unfinished run of PACKED")
    p.add_argument("--runs-dir", default="runs", metavar="DIR", help="where run directories go (default runs)")
    p.add_argument("--run-dir", default=None, metavar="DIR",
                   help="use this run directory (created if missing; one that holds something other than a run "
                        "directory is refused unless --force)")
    p.add_argument("--force", action="store_true",
                   help="let --run-dir replace a directory that is not a run directory (deleting what it holds)")
    p.add_argument("--store", default=None, metavar="STORE",
                   help="the store (evaluation, Ginex rows; default: the path PACKED records)")
    p.add_argument("--no-crc", action="store_true",
                   help="skip the crc32 checks of packed segments and of the store's bytes")
    p.add_argument("--threads", type=integer("--threads"), default=None, help="torch threads")
    p.add_argument("--task", choices=TASKS, default=None,
                   help="the task the packed round was prepared for (default: its own; another is refused)")
    p.add_argument("--hits-k", type=integer("--hits-k"), default=d.hits_k, metavar="K",
                   help="link task: the K of the Hits@K evaluation reports (default %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.set_defaults(func=_run)


def _packed_manifest(path: str) -> dict[str, Any]:
    """PACKED's manifest. A store or a raw dataset given instead is one line saying which it is and what to run."""
    from ..datasets import dataset_kind, read_manifest

    kind = dataset_kind(path)
    if kind == "store":
        raise InputError(path, "a store, not a packed dataset: prepare it first "
                               f"(`diskflow prepare belady --dataset {path} --out PACKED`, then `diskflow train PACKED`), "
                               f"or train on the store itself (`diskflow run inmemory --dataset {path}`)")
    if kind == "raw":
        raise InputError(path, f"a raw dataset, not a packed dataset: ingest it (`diskflow ingest {path} STORE`), "
                               "prepare the store (`diskflow prepare belady --dataset STORE --out PACKED`), then "
                               "`diskflow train PACKED`")
    m = read_manifest(path) if kind == "packed" else None
    if m is None:
        what = "no such directory" if not Path(path).exists() else "no diskflow-packed manifest.json"
        raise InputError(path, f"not a packed dataset ({what}; make one with "
                               "`diskflow prepare belady --dataset STORE --out PACKED`)")
    return m


def _run(args: argparse.Namespace) -> int:
    from ..api import train
    from ..datasets import budget_bytes

    model_option(args.model)
    manifest = _packed_manifest(args.packed)
    packed = Path(args.packed).resolve()
    feature_bytes = budget_bytes(manifest)
    budget(args.cpu_memory, "--cpu-memory", feature_bytes)     # a bad budget fails before a run directory is made
    budget(args.gpu_memory, "--gpu-memory", feature_bytes)
    label = f"train-{manifest.get('pipeline', 'packed')}-{model_label(args.model)}"
    if args.run_dir is not None:
        run_dir = use_run_dir(args.run_dir, args.force)
    elif args.resume:
        found = unfinished_run(args.runs_dir, packed)
        if found is None:
            raise ConfigError("--resume", f"no unfinished run of {packed} under {args.runs_dir}/ "
                                          "(give its --run-dir, or start without --resume)")
        run_dir = found
    else:
        run_dir = new_run_dir(args.runs_dir, label)
    fresh = not any(run_dir.iterdir())
    write_run_info(run_dir, packed, args.model)
    print(f"run directory: {run_dir}")
    with no_run_left(run_dir, made=fresh, prepares=False):      # failed before training: leave no run behind
        report = train(packed, args.model, run_dir=run_dir, progress=not args.no_progress, on_epoch=print_epoch,
                       hidden=args.hidden, num_layers=args.num_layers, lr=args.lr, weight_decay=args.weight_decay,
                       clip_grad=args.clip_grad, dropout=args.dropout,
                       heads=args.heads, seed=args.seed, device=args.device, eval_every=args.eval_every,
                       cpu_memory=args.cpu_memory, gpu_memory=args.gpu_memory, queue_depth=args.queue_depth,
                       sequential=args.sequential, check_crc=not args.no_crc, resume=args.resume, store=args.store,
                       threads=args.threads, task=args.task, hits_k=args.hits_k)
    print_summary(report)
    print(f"report: {run_dir / REPORT}")
    return 0





def print_summary(report: dict[str, Any]) -> None:
    """Stage busy/starved/blocked seconds, I/O, tier hit rates, memory: a short table."""
    from dask.utils import asciitable

    print(asciitable(["stage", "busy s", "starved s", "blocked s"],
                     [(name, f"{c['busy_s']:.3f}", f"{c['starved_s']:.3f}", f"{c['blocked_s']:.3f}")
                      for name, c in report["stages"].items()]))
    io = report["io"]
    amp = io.get("read_amplification")
    print(f"io: {format_bytes(io.get('bytes_read', 0))} read in {int(io.get('requests', 0)):,} requests "
          f"({io.get('backend')}), {format_bytes(io.get('useful_bytes', 0))} useful"
          + (f", amplification {amp:.2f}" if amp else ""))
    rates = report["tiers"]["rates"]
    print("rows from: " + ", ".join(f"{k} {v:.1%}" for k, v in rates.items() if v))
    final = report.get("final") or {}
    if final.get("test_acc") is not None or final.get("test_mrr") is not None:
        print(final_line(final))
    enc = (report.get("dataset") or {}).get("rows")
    if enc is not None:         # prepared with --rows: the bytes every tier, segment and read moved, against exact
        print(f"rows: {enc['encoding']}, {enc['row_bytes']} B a row against {enc['exact_row_bytes']} B exact "
              f"({enc['ratio']:.2f}x fewer bytes)")
    mem = report["memory"]
    print(f"memory: features {format_bytes(mem['host_bytes'])} host (CPU tier {format_bytes(mem['cpu_tier_bytes'])}, "
          f"staged misses {format_bytes(mem['staging_bytes'])} in {mem['staging_buffers']} buffers, I/O buffers "
          f"{format_bytes(mem['io_buffer_bytes'])}); assembled batches {format_bytes(mem['assembled_bytes'])} "
          f"({mem['assembled_batches']} on the {mem['assembled_on']}); "
          f"peak RSS {format_bytes(report['peak_rss_bytes'])}, wall {fmt(report.get('wall_s'), '.1f')} s")
