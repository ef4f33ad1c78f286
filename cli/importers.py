"""`diskflow import {pyg,npy,ogb}`: turn an existing dataset into the raw input format."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..sizes import format_bytes
from .options import byte_size

__all__ = ["register"]

_FORMAT_HELP = "feature shard format: Arrow IPC file or Parquet (default: %(default)s)"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import", help="convert a PyG Data file, .npy files or an OGB dataset to the raw input format",
        description="Write OUT in the raw input format (edges/, features/, nodes/ shards, manifest.json last), "
                    "reading the source in bounded-memory chunks. Then run `diskflow ingest OUT STORE`.")
    isub = p.add_subparsers(dest="source", metavar="SOURCE")
    isub.required = True

    pyg = isub.add_parser(
        "pyg", help="a torch_geometric Data or HeteroData saved with torch.save",
        description="Import a homogeneous torch_geometric Data saved with torch.save (x, edge_index, edge_attr, y, "
                    "train/val/test masks; any other attribute is refused), or a HeteroData as a typed raw dataset "
                    "(per node type x, y and masks, each optional; per edge type edge_index; edge features are "
                    "refused). The file is loaded with torch.load(weights_only=False), which "
                    "runs arbitrary pickled code: only load files you trust.")
    pyg.add_argument("file", metavar="FILE.pt", type=Path, help="the saved Data (only files you trust)")
    pyg.add_argument("--no-split-masks", action="store_true", help="ignore train/val/test masks (all nodes 'none')")
    _common(pyg)
    pyg.set_defaults(func=_run_pyg)

    npy = isub.add_parser(
        "npy", help="numpy .npy arrays (memory-mapped)",
        description="Import .npy arrays, read memory-mapped chunk by chunk. Splits come from --split "
                    "(per-node codes 0 train, 1 val, 2 test, 3 none, or those names) or from index files "
                    "(--train-idx/--val-idx/--test-idx; other nodes get 'none').")
    _common(npy)
    npy.add_argument("--edge-index", type=Path, help="[2, E] (or [E, 2]) integer array of (src, dst)")
    npy.add_argument("--src", type=Path, help="[E] source ids (with --dst, instead of --edge-index)")
    npy.add_argument("--dst", type=Path, help="[E] destination ids")
    npy.add_argument("--features", type=Path, required=True, help="[N, dim] feature matrix")
    npy.add_argument("--edge-features", type=Path, help="[E, D] edge feature matrix, one row per edge of the edge files")
    npy.add_argument("--labels", type=Path, help="[N] integer labels, -1 = unlabeled (default: all -1)")
    npy.add_argument("--split", type=Path, help="[N] split code or name per node")
    npy.add_argument("--train-idx", type=Path, help="node ids of the train split")
    npy.add_argument("--val-idx", type=Path, help="node ids of the val split")
    npy.add_argument("--test-idx", type=Path, help="node ids of the test split")
    npy.set_defaults(func=_run_npy)

    ogb = isub.add_parser(
        "ogb", help="an OGB node-property dataset folder (csv.gz or data.npz layout)",
        description="Import an OGB node-property dataset as OGB stores it on disk: ROOT/raw/*.csv.gz (or "
                    "ROOT/raw/data.npz + node-label.npz for the large ones) and ROOT/split/NAME/*.csv.gz.")
    ogb.add_argument("root", metavar="ROOT", type=Path, help="the dataset folder holding raw/ and split/")
    _common(ogb)
    ogb.add_argument("--split", dest="split_name", metavar="NAME",
                     help="split folder under ROOT/split when there are several")
    ogb.set_defaults(func=_run_ogb)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", metavar="OUT", type=Path, help="raw dataset directory to create")
    p.add_argument("--format", dest="feature_format", choices=("arrow", "parquet"), default="arrow", help=_FORMAT_HELP)
    p.add_argument("--chunk", type=byte_size("--chunk"), default="64MiB",
                   help="source bytes read (and written as one shard) at a time (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="redo the import and replace OUT even if it is not a raw dataset")


def _summary(out: Path) -> int:
    m = json.loads((out / "manifest.json").read_text())
    typed = m.get("hetero")
    kinds = "" if typed is None else \
        f" of {len(typed['node_types'])} node types and {len(typed['edge_types'])} edge types"
    width = "up to " if typed is not None else ""
    print(f"import: {m['num_nodes']:,} nodes, {m['num_edges']:,} edges{kinds}, "
          f"{format_bytes(m['feature_bytes'])} of features ({width}{m['feature_dim']}-dim {m['feature_dtype']}) -> {out}")
    return 0


def _check_out(args: argparse.Namespace) -> None:
    """Refuse an OUT that is not a raw dataset before reading the source (which may be large)."""
    from ..datasets import check_raw_output

    check_raw_output(args.out, args.force)


def _run_pyg(args: argparse.Namespace) -> int:
    from ..datasets import from_pyg, load_pyg_file

    _check_out(args)
    data = load_pyg_file(args.file)
    return _summary(from_pyg(data, args.out, split_masks=not args.no_split_masks, name=str(args.file),
                             feature_format=args.feature_format, chunk_bytes=args.chunk, force=args.force))


def _run_npy(args: argparse.Namespace) -> int:
    from ..datasets import from_npy

    _check_out(args)
    return _summary(from_npy(args.out, features=args.features, edge_index=args.edge_index, src=args.src,
                             dst=args.dst, labels=args.labels, split=args.split, train_idx=args.train_idx,
                             val_idx=args.val_idx, test_idx=args.test_idx, edge_features=args.edge_features,
                             feature_format=args.feature_format,
                             chunk_bytes=args.chunk, force=args.force))


def _run_ogb(args: argparse.Namespace) -> int:
    from ..datasets import from_ogb

    _check_out(args)
    return _summary(from_ogb(args.root, args.out, split=args.split_name, feature_format=args.feature_format,
                             chunk_bytes=args.chunk, force=args.force))
