"""`diskflow bench NAME`: side-by-side benchmarks; every one prints a table and takes `--json PATH`.

Each benchmark is a module `diskflow.bench.NAME` with `add_arguments(parser)` and
`run(args) -> dict` (its figures); this command prints nothing of its own beyond them. A benchmark's
module is imported only when its command parses or prints its help (`bench_module`): ``diskflow --help``
and ``diskflow bench --help`` import none, ``diskflow bench compare ...`` imports compare alone.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["BENCHES", "bench_module", "register"]

BENCHES = {
    "sampler": "native neighbor sampler vs a vectorised numpy reference (edges/s)",
    "ingest": "ingest throughput next to the disk's sequential read bandwidth",
    "plan": "Belady CPU-cache planner: accesses/s on one core, misses vs the static tier",
    "prepare": "offline preprocessing vs its I/O floor, batched vs naive packing, Belady vs static, disk budget",
    "reader": "direct-I/O reader backends next to fio: sequential MB/s, random 4 KiB IOPS, page-merged rows",
    "stream": "streaming vs prepare-then-train on the split cluster: stream_s, prepare_s, train_s, GPU-worker idle fraction",
    "compare": "every pipeline on one dataset and the same samples, each in its own memory cgroup, side by side",
    "scale": "a run whose features exceed this machine's RAM: synth, ingest, prepare, train, each in a memory cgroup",
    "link": "link prediction: inmemory, belady, an online pipeline and a features-only MLP, in memory cgroups",
    "hetero": "typed graphs: to_hetero GraphSAGE in memory and out of core vs a paper-only GraphSAGE; derivation vs its floor",
    "pyg": "PyG's NodeLoader over diskflow's remote backend vs memory-mapped and in-RAM features, in a memory cgroup",
}


def bench_module(name: str) -> ModuleType:
    """The module of the benchmark `name` (one of `BENCHES`), imported now."""
    if name == "sampler":
        from ..bench import sampler
        return sampler
    if name == "ingest":
        from ..bench import ingest
        return ingest
    if name == "plan":
        from ..bench import plan
        return plan
    if name == "prepare":
        from ..bench import prepare
        return prepare
    if name == "reader":
        from ..bench import reader
        return reader
    if name == "stream":
        from ..bench import stream
        return stream
    if name == "compare":
        from ..bench import compare
        return compare
    if name == "scale":
        from ..bench import scale
        return scale
    if name == "link":
        from ..bench import link
        return link
    if name == "hetero":
        from ..bench import hetero
        return hetero
    if name == "pyg":
        from ..bench import pyg
        return pyg
    raise KeyError(name)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run a benchmark (prints a table; --json PATH writes its figures)",
                       description="Benchmarks compare implementations side by side in one run.")
    bsub = p.add_subparsers(dest="bench", metavar="NAME", parser_class=_BenchParser)
    bsub.required = True
    for name, text in BENCHES.items():
        bp = bsub.add_parser(name, help=text, description=text, bench=name)
        bp.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
        bp.set_defaults(func=_run)


_WORKDIRS = ("workdir", "work")     # the benchmarks' work-directory options (`--workdir`, stream's `--work`)


class _BenchParser(argparse.ArgumentParser):
    """A benchmark's parser, whose own arguments (and module) come when it first parses or formats its help."""

    def __init__(self, *args: Any, bench: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bench = bench
        self._complete = False

    def complete(self) -> None:
        """Add the benchmark's arguments (`add_arguments` of its module) and, where it has a work directory,
        ``--force``; once."""
        if self._complete:
            return
        self._complete = True
        bench_module(self.bench).add_arguments(self)
        if {a.dest for a in self._actions} & set(_WORKDIRS):
            self.add_argument("--force", action="store_true",
                              help="use the work directory even when it holds something else (deleting it)")

    def parse_known_args(self, args: Sequence[str] | None = None,       # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        self.complete()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self.complete()
        return super().format_usage()

    def format_help(self) -> str:
        self.complete()
        return super().format_help()


def _run(args: argparse.Namespace) -> int:
    from ..bench.common import check_workdir, mark_workdir, write_figures
    from ..runs import check_run_output

    workdirs = [getattr(args, dest) for dest in _WORKDIRS if getattr(args, dest, None)]
    for work in workdirs:       # refuse a user's folder before a benchmark deletes and rewrites parts of it
        check_workdir(work, args.force)
    if isinstance(getattr(args, "keep", None), str):    # stream's --keep DIR receives a report and a timeline
        check_run_output(args.keep, args.force)
    try:
        figures = bench_module(args.bench).run(args)
    finally:
        for work in workdirs:
            mark_workdir(work)
    write_figures(args.json, figures)
    return 0
