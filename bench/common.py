"""Shared plumbing for `diskflow bench ...`: tables, JSON figures, the disk's physical floor."""
from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..operators.formats.atomic import atomic_path, write_json
from ..operators.formats.diskread import drop_page_cache, sequential_read_bw  # (the benches' and demo's)
from ..operators.formats.outputs import OutputKind, replace_foreign

__all__ = ["BENCH_KIND", "BENCH_MARKER", "add_graph_arguments", "check_workdir", "drop_page_cache",
           "drop_trees", "mark_workdir", "print_table", "read_ahead_kb", "sequential_read_bw",
           "write_figures"]

BENCH_MARKER = ".diskflow-bench.json"
# A benchmark's --workdir: marked by BENCH_MARKER; older ones (no marker) are recognised by
# holding nothing but what the benchmarks write there.
BENCH_KIND = OutputKind(
    "a diskflow benchmark work directory", markers=(BENCH_MARKER,),
    patterns=("raw", "store", "packed", "packed.work", "scratch", "runs", "max-batch-rows-*.json", "calibration.arrow",
              "bw-scratch.bin", "seq-read-scratch.bin", "n*-d*-t*-s*", "diskflow-bench-stream-*", ".*.tmp-*"))


def drop_trees(paths: Sequence[Path]) -> None:
    """Evict every file in the folders `paths` (and their subfolders) from the page cache."""
    for root in paths:
        for p in sorted(root.rglob("*")):
            if p.is_file():
                drop_page_cache(p)


def read_ahead_kb(path: str | os.PathLike[str]) -> int | None:
    """The read-ahead window of the block device holding `path` (what a page fault may read around)."""
    try:
        dev = os.stat(path).st_dev
        sysfs = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
        for q in (sysfs / "queue" / "read_ahead_kb", sysfs / ".." / "queue" / "read_ahead_kb"):
            if q.is_file():
                return int(q.read_text())
    except (OSError, ValueError):
        return None
    return None


def print_table(title: str, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """Print rows as a text table (Dask's `asciitable`) under a title."""
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        if isinstance(v, int):
            return f"{v:,}"
        return str(v)

    from dask.utils import asciitable

    print(f"\n{title}")
    print(asciitable(list(columns), [tuple(fmt(r.get(c, "")) for c in columns) for r in rows]))


def check_workdir(path: str | os.PathLike[str], force: bool = False) -> None:
    """Let a benchmark use `path` only when it is missing, empty or a benchmark work directory;
    anything else is refused (with `force`: deleted, so the benchmark starts from nothing).

    Benchmarks delete and rewrite `raw/`, `store/`, `packed/`, `scratch/` in it, which must
    never hit a user's folder named by mistake.
    """
    replace_foreign(path, force, BENCH_KIND)


def mark_workdir(path: str | os.PathLike[str]) -> None:
    """Mark `path` as a benchmark work directory once a benchmark has put something in it."""
    work = Path(path)
    if work.is_dir() and not (work / BENCH_MARKER).exists() and any(work.iterdir()):
        write_json(work / BENCH_MARKER, {"format": "diskflow-bench-workdir"})


def write_figures(path: str | os.PathLike[str] | None, figures: dict[str, Any]) -> None:
    """With `--json PATH`, write the benchmark's figures (atomically)."""
    if not path:
        return
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(figures, indent=2, sort_keys=True, default=float) + "\n")
    print(f"figures written to {path}")


def add_graph_arguments(p: argparse.ArgumentParser, *, nodes: int, size_note: str, train_frac: float,
                        train_note: str, dim: int = 128) -> None:
    """The synthetic graph's options every bench that makes one takes (its defaults are the bench's own):
    --nodes, --dim, --dtype, --avg-degree, --train-frac and --part-nodes."""
    p.add_argument("--nodes", type=int, default=nodes, help=f"synthetic graph: nodes (default {nodes:,}: {size_note})")
    p.add_argument("--dim", type=int, default=dim, help=f"synthetic graph: feature dimension (default {dim})")
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32",
                   help="synthetic graph: feature dtype (default float32)")
    p.add_argument("--avg-degree", type=float, default=15.0, help="synthetic graph: mean degree (default 15)")
    p.add_argument("--train-frac", type=float, default=train_frac,
                   help=f"synthetic graph: share of training nodes (default {train_frac}: {train_note})")
    p.add_argument("--part-nodes", type=int, default=250_000, help="synthetic graph: nodes per synth task")
