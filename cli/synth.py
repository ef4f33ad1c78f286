"""`diskflow synth OUT`: generate a synthetic raw dataset (power-law graph, communities, noisy features)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..config import SynthConfig
from ..sizes import format_bytes
from .options import add_tls_arguments, integer, positive_int

__all__ = ["register"]

_D = SynthConfig()


# the number-valued flags: (flag, SynthConfig field, help); SynthConfig checks their ranges
SHAPE_FLAGS = (
    ("--avg-degree", "avg_degree", ("mean stored edges per node, both directions counted (default: %(default)s; "
                                   "duplicates removed, so slightly less comes out)")),
    ("--homophily", "homophily", "probability that an edge stays in its source's community (default: %(default)s)"),
    ("--locality", "locality", ("share of the within-community edges drawn to a member near the source, so that small "
                               "dense clusters exist below the communities, as in real graphs (default: %(default)s)")),
    ("--signal", "signal", ("class-signal strength of the features: length of the class centroid added to "
                           "unit-variance noise (default: %(default)s)")),
    ("--noise", "noise", "per-dimension feature noise standard deviation (default: %(default)s)"),
    ("--label-noise", "label_noise", "fraction of nodes given a random label (default: %(default)s)"),
    ("--degree-exponent", "degree_exponent", ("power-law exponent gamma of the degree distribution, > 2 (default: "
                                             "%(default)s)")),
)
SPLIT_FLAGS = (
    ("--train", "train_frac", "fraction of nodes in the train split (default: %(default)s)"),
    ("--val", "val_frac", "fraction in the val split (default: %(default)s)"),
    ("--test", "test_frac", "fraction in the test split; the rest is 'none' (default: %(default)s)"),
)


def _add_numbers(p: argparse.ArgumentParser, flags: tuple[tuple[str, str, str], ...]) -> None:
    for flag, field, text in flags:
        p.add_argument(flag, type=float, default=getattr(_D, field), help=text)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "synth", help="generate a synthetic graph in the raw input format",
        description="Generate a synthetic node-classification graph as a Dask graph (one task per node range, "
                    "bounded memory per task) into OUT: edges/, features/, nodes/ shards and manifest.json. "
                    "Degrees follow a power law (some hot nodes), classes are communities with tunable "
                    "homophily, and features carry a weak class signal, so a GNN clearly beats an MLP. "
                    "Re-running with the same options on a finished OUT does nothing (see --force).")
    p.add_argument("out", metavar="OUT", type=Path, help="output directory (created; replaced only when it is a raw dataset)")
    p.add_argument("--nodes", type=integer("--nodes"), default=_D.num_nodes,
                   help="number of nodes (default: %(default)s)")
    p.add_argument("--dim", type=integer("--dim"), default=_D.feature_dim,
                   help="feature dimension (default: %(default)s)")
    p.add_argument("--classes", type=integer("--classes"), default=_D.num_classes,
                   help="number of classes, one community each (default: %(default)s)")
    _add_numbers(p, SHAPE_FLAGS)
    p.add_argument("--dtype", choices=("float32", "float16"), default=_D.dtype,
                   help="feature dtype (default: %(default)s)")
    p.add_argument("--format", dest="feature_format", choices=("arrow", "parquet"), default=_D.feature_format,
                   help="feature shard format: Arrow IPC file or Parquet (default: %(default)s)")
    _add_numbers(p, SPLIT_FLAGS)
    p.add_argument("--seed", type=int, default=_D.seed, help="random seed (default: %(default)s)")
    p.add_argument("--part-nodes", type=integer("--part-nodes"), default=_D.part_nodes,
                   help="nodes per task; memory per task grows with it (default: %(default)s)")
    p.add_argument("--workers", type=positive_int("--workers"), default=None,
                   help="worker processes of the embedded Dask cluster (default: one per core)")
    p.add_argument("--scheduler", metavar="ADDR", default=None,
                   help="use a running Dask scheduler (tcp://HOST:PORT) instead of an embedded cluster; "
                        "OUT must then be on a filesystem all workers share")
    add_tls_arguments(p)
    p.add_argument("--force", action="store_true",
                   help="regenerate even if OUT is already this dataset, and replace OUT even if it is not a raw dataset")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ..api import synth
    from ..cluster import check_tls, client
    from ..datasets import check_raw_output

    security = check_tls(args.scheduler, args.tls_ca_file, args.tls_cert, args.tls_key).security()
    options = {"avg_degree": args.avg_degree, "homophily": args.homophily, "signal": args.signal, "noise": args.noise,
               "label_noise": args.label_noise, "degree_exponent": args.degree_exponent, "dtype": args.dtype,
               "train_frac": args.train, "val_frac": args.val, "test_frac": args.test, "part_nodes": args.part_nodes,
               "feature_format": args.feature_format, "locality": args.locality}
    shape = {"nodes": args.nodes, "dim": args.dim, "classes": args.classes, "seed": args.seed}
    SynthConfig(num_nodes=args.nodes, feature_dim=args.dim, num_classes=args.classes, seed=args.seed,
                **options).validate()           # a bad option fails before a cluster starts
    check_raw_output(args.out, args.force)      # and so does an OUT that holds something else
    with client(args.scheduler, n_workers=args.workers, security=security):
        out = synth(args.out, force=args.force, **shape, **options)
    m = json.loads((out / "manifest.json").read_text())
    print(f"synth: {m['num_nodes']:,} nodes, {m['num_edges']:,} edges, "
          f"{format_bytes(m['feature_bytes'])} of features ({m['feature_dim']}-dim {m['feature_dtype']}), "
          f"edge homophily {m['edge_homophily']:.2f} -> {out}")
    return 0
