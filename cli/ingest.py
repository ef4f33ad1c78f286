"""`diskflow ingest RAW OUT`: turn a raw Arrow/Parquet dataset into a store, on a Dask cluster."""
from __future__ import annotations

import argparse
from typing import Any

from ..config import INGEST_MEMORY, LinkConfig, parse_shares
from ..errors import ConfigError
from ..sizes import format_bytes
from .options import add_tls_arguments, argparse_type, integer, parse_float

__all__ = ["parse_shares", "register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `ingest` subcommand."""
    p = sub.add_parser(
        "ingest", help="ingest a raw dataset (edges/, features/, nodes/) into a store",
        description="Validate a raw dataset and write a store: CSC topology by destination, "
        "row-range feature shards, labels and splits. Runs as Dask tasks (embedded LocalCluster, "
        "or --scheduler); a re-run with unchanged inputs and options does nothing.")
    p.add_argument("raw", metavar="RAW", help="raw dataset directory (edges/*.parquet, features/*, nodes/*.parquet), "
                                              "or its URL: s3://, gs://, hdfs://, any scheme fsspec resolves")
    p.add_argument("out", metavar="OUT", help="store directory to create (an existing store is replaced atomically; "
                                              "anything else there is refused unless --force)")
    p.add_argument("--memory-budget", default=INGEST_MEMORY, metavar="SIZE",
                   help="memory one task may use, e.g. 512MiB (default: %(default)s); sets shard and bucket sizes")
    p.add_argument("--shard-rows", type=int, default=None, metavar="N",
                   help="rows per feature shard (default: from the memory budget)")
    p.add_argument("--to-undirected", action="store_true",
                   help="add every edge reversed and drop repeated edges (a typed dataset: as PyG's ToUndirected, "
                        "a reverse edge type rev_REL for each edge type between two node types)")
    p.add_argument("--derive", action="append", default=[], metavar="TYPE=mean:SRC__REL__DST",
                   help="a typed dataset: give the featureless node type TYPE the mean of its neighbours' feature "
                        "rows over edge type SRC__REL__DST (repeatable)")
    p.add_argument("--allow-nonfinite", action="store_true", help="accept NaN/inf feature values (node and edge)")
    p.add_argument("--link-split", type=argparse_type("--link-split", parse_shares), default=None, metavar="VAL,TEST",
                   help="a seeded random link split with these validation and test shares, e.g. 0.05,0.1 "
                        "(for edges without a split column; val/test edges are left out of the topology)")
    p.add_argument("--disjoint-train-ratio", type=argparse_type("--disjoint-train-ratio", parse_float),
                   default=LinkConfig.disjoint_train_ratio, metavar="R",
                   help="share of the training edges held out of message passing as supervision edges only "
                        "(default: %(default)s)")
    p.add_argument("--link-negatives", type=integer("--link-negatives"), default=LinkConfig.negatives, metavar="K",
                   help="fixed negatives per validation and test edge, for MRR and Hits@K (default: %(default)s)")
    p.add_argument("--link-seed", type=integer("--link-seed"), default=LinkConfig.seed, metavar="SEED",
                   help="seeds the link split, the supervision share and the negatives (default: %(default)s)")
    p.add_argument("--storage-options", type=argparse_type("--storage-options", _storage_options), default=None,
                   metavar="JSON",
                   help="for a URL: fsspec's storage options as a JSON object, as Dask's read_parquet takes them, "
                        "e.g. '{\"endpoint_url\": \"http://host:9000\", \"anon\": true}' (default: credentials "
                        "from the environment and config files)")
    p.add_argument("--force", action="store_true",
                   help="rebuild even when OUT is up to date, and replace OUT even when it is not a store (deleting it)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="worker processes of the embedded cluster (default: one per core)")
    p.add_argument("--scheduler", default=None, metavar="ADDR",
                   help="use a running Dask scheduler (tcp://host:8786) instead of an embedded cluster")
    add_tls_arguments(p)
    p.set_defaults(func=run)


def _storage_options(option: str, text: str) -> dict[str, Any]:
    """--storage-options: a JSON object."""
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(option, f"not JSON ({e.msg} at character {e.pos})") from e
    if not isinstance(value, dict):
        raise ConfigError(option, f"expected a JSON object, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    """Run the ingest and print a one-paragraph summary."""
    from ..api import ingest
    from ..cluster import check_tls

    check_tls(args.scheduler, args.tls_ca_file, args.tls_cert, args.tls_key)
    r = ingest(args.raw, args.out, memory_budget=args.memory_budget, shard_rows=args.shard_rows,
               to_undirected=args.to_undirected, allow_nonfinite=args.allow_nonfinite, force=args.force,
               link_split=args.link_split, disjoint_train_ratio=args.disjoint_train_ratio,
               link_negatives=args.link_negatives, link_seed=args.link_seed,
               scheduler=args.scheduler, workers=0 if args.workers is None else args.workers,
               storage_options=args.storage_options, derive=args.derive,
               tls_ca_file=args.tls_ca_file, tls_cert=args.tls_cert, tls_key=args.tls_key)
    if r.skipped:
        print(f"{r.path}: up to date ({r.num_nodes:,} nodes, {r.num_edges:,} edges; "
              "inputs and options unchanged, --force rebuilds)")
        return 0
    rate = r.input_bytes / r.seconds if r.seconds > 0 else float("nan")
    lines = [f"ingested {args.raw} -> {r.path}",
             f"  nodes          {r.num_nodes:,}",
             f"  edges          {r.num_edges:,}",
             f"  feature bytes  {format_bytes(r.feature_bytes)} in {r.num_shards} shard(s)"]
    if r.edge_feature_bytes:
        lines.append(f"  edge features  {format_bytes(r.edge_feature_bytes)}")
    if r.link_counts is not None:
        lines.append("  link split     " + ", ".join(f"{k} {v:,}" for k, v in r.link_counts.items()))
    lines += [f"  input bytes    {format_bytes(r.input_bytes)}",
              f"  seconds        {r.seconds:.2f} ({format_bytes(rate)}/s)"]
    print("\n".join(lines))
    return 0
