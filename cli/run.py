"""`diskflow run PIPELINE --dataset STORE`: train with a pipeline, print each epoch, write a run directory.

Only the options given on the command line are passed to the pipeline's `run()`, so each
pipeline's own defaults apply to the rest, and an option a pipeline does not take is an
error rather than silently ignored.
"""
from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import load_pipeline
from ..config import (
    ENCODINGS,
    NEG_SAMPLINGS,
    PREPARE_DEFAULTS,
    RUN_DEFAULTS,
    TASKS,
    TrainConfig,
    available_pipelines,
    model_label,
    model_option,
    parse_fanouts,
)
from ..errors import ConfigError
from ..runs import (
    SPLIT_PLOT,
    describe_online,
    describe_split,
    describe_staleness,
    final_line,
    fmt,
    new_run_dir,
    no_run_left,
    print_epoch,
    served_share,
)
from .options import (
    HISTORY_FLAGS,
    ROWS_HELP,
    add_history_arguments,
    parse_batches,
    parse_choice,
    parse_float,
    parse_history_flags,
    parse_int,
)
from .stream_options import RUN_OPTIONS, add_run_arguments, resume_dir

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="train a GNN with a pipeline (e.g. inmemory) and write report.json",
        description="Train with PIPELINE (a built-in name such as "
        f"{', '.join(available_pipelines()) or 'inmemory'}, or the path of a .py file that defines a "
        "diskflow.Pipeline) on an ingested store; prints each epoch and writes "
        "RUNS_DIR/<time>-<pipeline>-<model>/report.json.")
    p.add_argument("pipeline", metavar="PIPELINE",
                   help="a built-in pipeline name, or the path of a .py file that defines a diskflow.Pipeline")
    p.add_argument("--dataset", required=True, metavar="STORE", help="ingested store directory")
    d = TrainConfig()       # the defaults, from the one place they are set (each pipeline's own apply)
    p.add_argument("--model", metavar="MODEL", help=f"{d.model} (default), gcn, gat, mlp (features only), or the path "
                                                    "of a .py file that defines a diskflow.Model")
    p.add_argument("--epochs", metavar="N", help=f"training epochs (default {d.epochs})")
    p.add_argument("--fanouts", metavar="K,K,..",
                   help=f"neighbours per hop, -1 for all (default {','.join(map(str, d.fanouts))})")
    p.add_argument("--batch-size", metavar="N", help=f"seed nodes per batch (default {d.batch_size})")
    p.add_argument("--hidden", metavar="N", help=f"hidden channels (default {d.hidden})")
    p.add_argument("--num-layers", metavar="N", help="model layers (default: number of hops)")
    p.add_argument("--dropout", metavar="P", help=f"dropout probability (default {d.dropout:g})")
    p.add_argument("--lr", metavar="LR",
                   help=f"learning rate: Adam's, or a model file's optimizer factory's (default {d.lr:g})")
    p.add_argument("--weight-decay", metavar="WD", help=f"weight decay: Adam's, or a model file's optimizer "
                                                        f"factory's (default {d.weight_decay:g})")
    p.add_argument("--clip-grad", metavar="NORM", help="clip the gradients' total L2 norm to NORM before each step "
                                                       "(default: the model's own clip_grad, else none)")
    p.add_argument("--seed", metavar="N", help=f"seed of model init, batch order and sampling (default {d.seed})")
    p.add_argument("--eval-every", metavar="N", help=f"evaluate val/test every N epochs (default {d.eval_every})")
    p.add_argument("--device", metavar="DEV", help=f"cpu or cuda[:N] (default {PREPARE_DEFAULTS['device']})")
    p.add_argument("--threads", metavar="N", help="torch and sampler threads")
    p.add_argument("--runs-dir", default="runs", metavar="DIR", help="where run directories go (default runs)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.add_argument("--batches", metavar="ORDER",
                   help="shuffled (default; 'random' is the same) or partition: batches from groups of min-cut parts (OUTRE)")
    p.add_argument("--partitions", metavar="N", help="partition batches: parts of the graph (default eight per "
                                                     "batch: one per batch-size/8 training nodes)")
    p.add_argument("--partition", metavar="FILE",
                   help="partition batches of the memory/mmap pipelines: a parts file (a packed dataset's partition.npy)")
    p.add_argument("--parts-per-group", metavar="N", help="partition batches: parts shuffled together (default "
                                                          f"{PREPARE_DEFAULTS['parts_per_group']})")
    p.add_argument("--group-by", metavar="HOW", help="partition batches: how parts meet in a group, label (parts of "
                                                    "different majority labels together) or random (OUTRE's) "
                                                    f"(default {PREPARE_DEFAULTS['group_by']})")
    p.add_argument("--task", metavar="TASK", help="node (classify the training nodes) or link (score the store's "
                                                  "training edges against negative pairs; needs a store ingested "
                                                  f"with --link-split or a split column) (default {d.task})")
    p.add_argument("--neg-ratio", metavar="R", help=f"link task: negative pairs per positive edge (default "
                                                    f"{d.neg_ratio:g})")
    p.add_argument("--neg-sampling", metavar="HOW", help="link task: a negative pair's ends drawn uniform(ly) or in "
                                                         f"proportion to in-degree (degree) (default {d.neg_sampling})")
    p.add_argument("--hits-k", metavar="K", help=f"link task: the K of the Hits@K evaluation reports (default {d.hits_k})")
    p.add_argument("--rows", metavar="ENC", help=f"packing pipelines: {ROWS_HELP} ({', '.join(ENCODINGS)})")
    p.add_argument("--staging-piece", metavar="SIZE",
                   help="packing and streaming pipelines: the most disk-row bytes one staging buffer carries; a "
                        "smaller one leaves more of --cpu-memory to the CPU tier (default 32MiB)")
    add_history_arguments(p)
    p.add_argument("--extractors", metavar="N",
                   help="online pipelines (gnndrive, lsmgnn): batches whose rows are read at once, a reader each "
                        f"(default {RUN_DEFAULTS['extractors']})")
    p.add_argument("--no-crc", action="store_true",
                   help="skip the check of the store's bytes against its checksums as they are read")
    add_run_arguments(p)
    p.set_defaults(func=_run)


# option attribute -> (flag, parser)
_OPTIONS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "model": ("--model", model_option),
    "epochs": ("--epochs", lambda s: parse_int("--epochs", s)),   # (TrainConfig checks the ranges)
    "fanouts": ("--fanouts", parse_fanouts),
    "batch_size": ("--batch-size", lambda s: parse_int("--batch-size", s)),
    "hidden": ("--hidden", lambda s: parse_int("--hidden", s)),
    "num_layers": ("--num-layers", lambda s: parse_int("--num-layers", s)),
    "dropout": ("--dropout", lambda s: parse_float("--dropout", s)),
    "lr": ("--lr", lambda s: parse_float("--lr", s)),
    "weight_decay": ("--weight-decay", lambda s: parse_float("--weight-decay", s, minimum=0.0)),
    "clip_grad": ("--clip-grad", lambda s: parse_float("--clip-grad", s, minimum=0.0, inclusive=False)),
    "seed": ("--seed", lambda s: parse_int("--seed", s)),
    "eval_every": ("--eval-every", lambda s: parse_int("--eval-every", s)),
    "device": ("--device", str),
    "threads": ("--threads", lambda s: parse_int("--threads", s)),
    "batches": ("--batches", lambda s: parse_batches("--batches", s)),
    "partitions": ("--partitions", lambda s: parse_int("--partitions", s, 2)),
    "partition": ("--partition", str),
    "parts_per_group": ("--parts-per-group", lambda s: parse_int("--parts-per-group", s, 1)),
    "group_by": ("--group-by", str),
    "extractors": ("--extractors", lambda s: parse_int("--extractors", s, 1)),
    "task": ("--task", lambda s: parse_choice("--task", s, TASKS)),
    "neg_ratio": ("--neg-ratio", lambda s: parse_float("--neg-ratio", s, minimum=0.0)),
    "neg_sampling": ("--neg-sampling", lambda s: parse_choice("--neg-sampling", s, NEG_SAMPLINGS)),
    "hits_k": ("--hits-k", lambda s: parse_int("--hits-k", s, 1)),
    "rows": ("--rows", lambda s: parse_choice("--rows", s, ENCODINGS)),
    "staging_piece": ("--staging-piece", str),      # (checked with the budgets: `tiers.check_staging_piece`)
}
_OPTIONS.update({k: (flag, parse) for k, (flag, parse, _) in RUN_OPTIONS.items()})
_FLAGS = {**{k: flag for k, (flag, _) in _OPTIONS.items()}, **{k: flag for k, (flag, *_) in HISTORY_FLAGS.items()}}


def _run(args: argparse.Namespace) -> int:
    from ..api import train
    from ..cluster import check_tls
    from ..datasets import warn_unchecked

    options = {name: parse(getattr(args, name)) for name, (_, parse) in _OPTIONS.items()
               if getattr(args, name) is not None}
    warn_unchecked(args.dataset)
    options.update(parse_history_flags(args))
    # the scheduler's address against the TLS options, before a run directory is made (the pipeline checks again)
    check_tls(args.scheduler, args.tls_ca_file, args.tls_cert, args.tls_key)
    pipeline = load_pipeline(args.pipeline)
    params = pipeline.parameters()
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for name in options:
        if not takes_any and name not in params:
            raise ConfigError(_FLAGS[name], f"pipeline {args.pipeline!r} does not take this option")
    extras = {"progress": not args.no_progress, "on_epoch": print_epoch}
    options.update({k: v for k, v in extras.items() if takes_any or k in params})

    label = pipeline.name
    run_dir = resume_dir(args) or new_run_dir(args.runs_dir, f"{label}-{model_label(options.get('model', 'sage'))}")
    print(f"run directory: {run_dir}")
    model = options.pop("model", "sage")
    with no_run_left(run_dir, made=True, prepares=True):     # failed before writing anything: no empty run left
        if args.no_crc:
            options["check_crc"] = False
        report = train(args.dataset, model, pipeline=pipeline, run_dir=run_dir, **options)
    if "on_epoch" not in options:
        for record in report.get("epochs", []):
            print_epoch(record)
    _print_summary(report)
    print(f"report: {run_dir / 'report.json'}")
    return 0





def _print_summary(report: dict[str, Any]) -> None:
    epochs = report.get("epochs") or []
    final = report.get("final") or {}
    stages = sorted({k for r in epochs for k in r.get("stage_s", {})},
                    key=lambda k: (["sample", "gather", "train", "eval"] + [k]).index(k))
    if stages:
        total = {k: sum(r["stage_s"].get(k, 0.0) for r in epochs) for k in stages}
        width = max(len(k) for k in stages)
        print("stage times (all epochs):")
        for k in stages:
            print(f"  {k:<{width}}  {total[k]:9.3f} s")
    if final:
        print(final_line(final))
    enc = (report.get("dataset") or {}).get("rows")
    if enc is not None:         # the trade: the bytes every tier, segment and read moved, against exact rows
        print(f"rows: {enc['encoding']}, {enc['row_bytes']} B a row against {enc['exact_row_bytes']} B exact "
              f"({enc['ratio']:.2f}x fewer bytes); the accuracy above is the encoded run's")
    stream = report.get("stream") or {}
    if stream.get("gpus", 1) > 1:
        idle = ", ".join(f"{x * 100:.1f}%" for x in stream.get("gpu_idle_fraction_per_worker") or [] if x is not None)
        print(f"{stream['gpus']} GPU workers ({stream.get('cache')} CPU tier{'s' if stream.get('cache') != 'shared' else ''}, "
              f"{(stream.get('group') or {}).get('backend')}): idle {idle}; models equal after every superbatch: "
              f"{'-' if stream.get('models_equal') is None else 'yes' if stream['models_equal'] else 'no'} "
              f"({stream.get('models_checked')} checked)")
    edge_tiers = stream.get("edge_tiers")
    if edge_tiers:       # a streamed run's edge rows, planned on their own chain (the trainer's figures of them)
        got = ((report.get("trainer") or {}).get("edges") or {}).get("tiers") or {}
        rows, n_read = got.get("rows") or {}, int(got.get("total") or 0)
        served = ", ".join(f"{k} {v / n_read:.1%}" for k, v in rows.items() if v) if n_read else "none read"
        print(f"edge rows: tiers of {edge_tiers.get('gpu_rows', 0):,} (GPU) and {edge_tiers.get('cpu_rows', 0):,} (CPU) "
              f"rows; {n_read:,} read: {served}")
    if report.get("online"):
        print(describe_online(report))
    hist = report.get("history")
    if hist:
        gathered = [r["rows_gathered"] for r in epochs if r.get("rows_gathered") is not None]
        rows = f"; rows gathered per epoch {', '.join(f'{g:,}' for g in gathered)}" if gathered else ""
        print(f"history cache: {hist['rows']:,} embeddings ({hist['bytes'] / 2**20:.1f} MiB), staleness "
              f"{describe_staleness(hist)}, {hist.get('prune', 'subtree')} rule: {hist['pruned']:,} subtrees "
              f"pruned, {hist['pushed']:,} embeddings pushed{rows}")
        print(f"history: {served_share(hist):.1%} of the cached nodes' embeddings in training batches were served "
              f"from history (stale by up to {hist['staleness']} batches), the rest computed afresh")
    split = report.get("prepare", {}).get("figures", {}).get("memory_split")
    if split:
        print(f"memory split: {describe_split(split)} (curve: {Path(report['prepare']['path']) / SPLIT_PLOT})")
    if report.get("peak_rss_bytes"):
        print(f"peak RSS {report['peak_rss_bytes'] / 2**20:.0f} MiB  wall {fmt(report.get('wall_s'), '.1f')} s")
