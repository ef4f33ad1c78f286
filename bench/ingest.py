"""`diskflow bench ingest`: ingest throughput next to the disk's sequential read bandwidth.

Ingest reads every raw byte once (plus the spills it writes and reads back), so its
floor is the input size over the disk's sequential read bandwidth. The benchmark
synthesises a raw dataset, evicts it from the page cache, measures the disk's
sequential read bandwidth in the same run (O_DIRECT, on the largest raw feature
file, or on a 1 GiB scratch file when that one is smaller), then ingests on an
embedded Dask cluster and reports input bytes per second and its ratio to the disk.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..operators.formats.sizes import format_bytes
from ..operators.options import INGEST_MEMORY
from .common import drop_page_cache, print_table, sequential_read_bw

__all__ = ["MIN_BW_FILE", "add_arguments", "run"]

MIN_BW_FILE = 1 << 30  # bandwidth is measured on at least this many bytes
_SCRATCH_BLOCK = 64 << 20


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `diskflow bench ingest`."""
    p.add_argument("--nodes", type=int, default=2_000_000, help="synthetic graph: nodes (default 2,000,000)")
    p.add_argument("--dim", type=int, default=128, help="feature dimension (default 128)")
    p.add_argument("--avg-degree", type=float, default=15.0, help="synthetic graph: mean degree (default 15)")
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="feature dtype")
    p.add_argument("--feature-format", choices=("arrow", "parquet"), default="arrow",
                   help="raw feature file format (default arrow)")
    p.add_argument("--memory-budget", default=INGEST_MEMORY,
                   help="ingest memory budget per task (default %(default)s)")
    p.add_argument("--workers", type=int, default=None, help="Dask worker processes (default: one per core)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the synthetic graph")
    p.add_argument("--workdir", default=None,
                   help="where raw/ and store/ go; kept (and raw/ reused by later runs). Default: a temporary "
                        "directory under the current directory, removed afterwards unless --keep")
    p.add_argument("--keep", action="store_true", help="keep the temporary work directory")


def _scratch_file(directory: Path, nbytes: int) -> Path:
    """A file of `nbytes` incompressible bytes, fsynced, for the bandwidth measurement."""
    path = directory / "seq-read-scratch.bin"
    block = os.urandom(_SCRATCH_BLOCK)
    with open(path, "wb") as f:
        f.writelines(block for _ in range(-(-nbytes // _SCRATCH_BLOCK)))  # 64 MiB blocks
        f.flush()
        os.fsync(f.fileno())
    return path


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Synthesise, evict, measure the disk, ingest; print the table and return the figures."""
    from ..flow.cluster import dask_client
    from ..flow.ingest import run_ingest
    from ..flow.synth import run_synth
    from ..operators.ingest.synth import SynthConfig

    if args.nodes < 2:
        raise ConfigError("--nodes", f"must be >= 2, got {args.nodes}")
    if args.dim < 1:
        raise ConfigError("--dim", f"must be >= 1, got {args.dim}")
    temporary = args.workdir is None
    work = Path(tempfile.mkdtemp(prefix=".bench-ingest-", dir=Path.cwd())) if temporary else Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    try:
        cfg = SynthConfig(num_nodes=args.nodes, feature_dim=args.dim, avg_degree=args.avg_degree, dtype=args.dtype,
                          seed=args.seed, feature_format=args.feature_format)
        with dask_client(n_workers=args.workers):
            t0 = time.perf_counter()
            raw = run_synth(cfg, work / "raw")
            synth_s = time.perf_counter() - t0

            inputs = [p for part in ("edges", "features", "nodes") for p in sorted((raw / part).iterdir())]
            largest = max((p for p in inputs if p.parent.name == "features"), key=lambda p: p.stat().st_size)
            bw_file = largest if largest.stat().st_size >= MIN_BW_FILE else _scratch_file(work, MIN_BW_FILE)
            drop_page_cache(bw_file)
            seq_bw = sequential_read_bw(bw_file)
            if bw_file != largest:
                bw_file.unlink()

            for p in inputs:
                drop_page_cache(p)
            result = run_ingest(raw, work / "store", memory_budget=args.memory_budget, force=True)
    finally:
        if temporary and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        elif temporary:
            print(f"work directory kept: {work}")

    rate = result.input_bytes / result.seconds
    figures = {
        "ingest_bytes_per_s": rate,
        "seq_read_bw": seq_bw,
        "ratio": rate / seq_bw,
        "input_bytes": result.input_bytes,
        "seconds": result.seconds,
        "nodes": result.num_nodes,
        "edges": result.num_edges,
    }
    print_table(
        f"ingest of a synthetic graph: {result.num_nodes:,} nodes, {result.num_edges:,} edges, "
        f"{args.dim}-dim {args.dtype} features ({format_bytes(result.feature_bytes)}, {result.num_shards} shards); "
        f"synth took {synth_s:.1f} s",
        [{"input bytes": format_bytes(result.input_bytes), "seconds": result.seconds,
          "ingest B/s": format_bytes(rate) + "/s", "disk seq read B/s": format_bytes(seq_bw) + "/s",
          "ratio": rate / seq_bw}],
        ["input bytes", "seconds", "ingest B/s", "disk seq read B/s", "ratio"],
    )
    print(f"floor: {result.input_bytes / seq_bw:.2f} s to read the input once at the disk's sequential bandwidth")
    return figures
