"""`diskflow ingest RAW OUT`: turn a raw Arrow/Parquet dataset into a store, on a Dask cluster."""
from __future__ import annotations

import argparse

from ..config import INGEST_MEMORY
from ..sizes import format_bytes
from .options import add_tls_arguments

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `ingest` subcommand."""
    p = sub.add_parser(
        "ingest", help="ingest a raw dataset (edges/, features/, nodes/) into a store",
        description="Validate a raw dataset and write a store: CSC topology by destination, "
        "row-range feature shards, labels and splits. Runs as Dask tasks (embedded LocalCluster, "
        "or --scheduler); a re-run with unchanged inputs and options does nothing.")
    p.add_argument("raw", metavar="RAW", help="raw dataset directory (edges/*.parquet, features/*, nodes/*.parquet)")
    p.add_argument("out", metavar="OUT", help="store directory to create (an existing store is replaced atomically; "
                                              "anything else there is refused unless --force)")
    p.add_argument("--memory-budget", default=INGEST_MEMORY, metavar="SIZE",
                   help="memory one task may use, e.g. 512MiB (default: %(default)s); sets shard and bucket sizes")
    p.add_argument("--shard-rows", type=int, default=None, metavar="N",
                   help="rows per feature shard (default: from the memory budget)")
    p.add_argument("--to-undirected", action="store_true",
                   help="add every edge reversed and drop repeated edges")
    p.add_argument("--allow-nonfinite", action="store_true", help="accept NaN/inf feature values")
    p.add_argument("--force", action="store_true",
                   help="rebuild even when OUT is up to date, and replace OUT even when it is not a store (deleting it)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="worker processes of the embedded cluster (default: one per core)")
    p.add_argument("--scheduler", default=None, metavar="ADDR",
                   help="use a running Dask scheduler (tcp://host:8786) instead of an embedded cluster")
    add_tls_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the ingest and print a one-paragraph summary."""
    from ..api import ingest
    from ..cluster import check_tls

    check_tls(args.scheduler, args.tls_ca_file, args.tls_cert, args.tls_key)
    r = ingest(args.raw, args.out, memory_budget=args.memory_budget, shard_rows=args.shard_rows,
               to_undirected=args.to_undirected, allow_nonfinite=args.allow_nonfinite, force=args.force,
               scheduler=args.scheduler, workers=0 if args.workers is None else args.workers,
               tls_ca_file=args.tls_ca_file, tls_cert=args.tls_cert, tls_key=args.tls_key)
    if r.skipped:
        print(f"{r.path}: up to date ({r.num_nodes:,} nodes, {r.num_edges:,} edges; "
              "inputs and options unchanged, --force rebuilds)")
        return 0
    rate = r.input_bytes / r.seconds if r.seconds > 0 else float("nan")
    print(f"ingested {args.raw} -> {r.path}\n"
          f"  nodes          {r.num_nodes:,}\n"
          f"  edges          {r.num_edges:,}\n"
          f"  feature bytes  {format_bytes(r.feature_bytes)} in {r.num_shards} shard(s)\n"
          f"  input bytes    {format_bytes(r.input_bytes)}\n"
          f"  seconds        {r.seconds:.2f} ({format_bytes(rate)}/s)")
    return 0
