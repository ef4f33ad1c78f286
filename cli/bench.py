"""`diskflow bench NAME`: side-by-side benchmarks; every one prints a table and takes `--json PATH`.

Each benchmark is a module `diskflow.bench.NAME` with `add_arguments(parser)` and
`run(args) -> dict` (its figures); this command prints nothing of its own beyond them.
"""
from __future__ import annotations

import argparse
import importlib

from ..bench.common import check_workdir, mark_workdir, write_figures

BENCHES = {
    "sampler": "native neighbor sampler vs a vectorised numpy reference (edges/s)",
    "ingest": "ingest throughput next to the disk's sequential read bandwidth",
    "plan": "Belady CPU-cache planner: accesses/s on one core, misses vs the static tier",
    "prepare": "offline preprocessing vs its I/O floor, batched vs naive packing, Belady vs static, disk budget",
    "reader": "direct-I/O reader backends next to fio: sequential MB/s, random 4 KiB IOPS, page-merged rows",
    "stream": "streaming vs prepare-then-train on the split cluster: stream_s, prepare_s, train_s, GPU-worker idle fraction",
    "compare": "every pipeline on one dataset and the same samples, each in its own memory cgroup, side by side",
    "scale": "a run whose features exceed this machine's RAM: synth, ingest, prepare, train, each in a memory cgroup",
    "pyg": "PyG's NodeLoader over diskflow's remote backend vs memory-mapped and in-RAM features, in a memory cgroup",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run a benchmark (prints a table; --json PATH writes its figures)",
                       description="Benchmarks compare implementations side by side in one run.")
    bsub = p.add_subparsers(dest="bench", metavar="NAME")
    bsub.required = True
    for name, text in BENCHES.items():
        bp = bsub.add_parser(name, help=text, description=text)
        bp.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
        importlib.import_module(f"diskflow.bench.{name}").add_arguments(bp)
        if {a.dest for a in bp._actions} & set(_WORKDIRS):
            bp.add_argument("--force", action="store_true",
                            help="use the work directory even when it holds something else (deleting it)")
        bp.set_defaults(func=_run)


_WORKDIRS = ("workdir", "work")     # the benchmarks' work-directory options (`--workdir`, stream's `--work`)


def _run(args: argparse.Namespace) -> int:
    from ..runs import check_run_output

    workdirs = [getattr(args, dest) for dest in _WORKDIRS if getattr(args, dest, None)]
    for work in workdirs:       # refuse a user's folder before a benchmark deletes and rewrites parts of it
        check_workdir(work, args.force)
    if isinstance(getattr(args, "keep", None), str):    # stream's --keep DIR receives a report and a timeline
        check_run_output(args.keep, args.force)
    try:
        figures = importlib.import_module(f"diskflow.bench.{args.bench}").run(args)
    finally:
        for work in workdirs:
            mark_workdir(work)
    write_figures(args.json, figures)
    return 0
