"""`diskflow verify PACKED`: check a packed dataset's checksums and replay its plan against the store."""
from __future__ import annotations

import argparse
import time

from ..sizes import format_bytes
from .options import positive_int

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify", help="check a packed dataset: checksums, file sizes, bit-exact replay against the store",
        description="Check every packed segment's and disk-cache file's checksum, replay the whole plan "
                    "(GPU/CPU tiers, CPU inserts, packed rows, disk caches) and compare the assembled features "
                    "of a random sample of batches (all with --full) bit for bit with the store's. "
                    "Exits 2 naming the file, batch and shard of the first fault.")
    p.add_argument("packed", metavar="PACKED", help="packed dataset directory (from `diskflow prepare`)")
    p.add_argument("--full", action="store_true",
                   help="compare every batch, and every tier and disk-cache row, with the store")
    p.add_argument("--batches", type=positive_int("--batches"), default=16, metavar="N",
                   help="batches compared with the store without --full (default 16)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the batch sample (default 0)")
    p.add_argument("--store", metavar="STORE", help="the store, if it moved since packing (default: the manifest's)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ..datasets import verify

    t0 = time.perf_counter()
    out = verify(args.packed, full=args.full, sample_batches=args.batches, seed=args.seed, store_path=args.store)
    print(f"{args.packed}: OK in {time.perf_counter() - t0:.1f}s")
    print(f"  batches replayed   {out['batches']:,}")
    print(f"  segments checked   {out['segments_checked']:,} ({format_bytes(out['packed_bytes_checked'])})")
    print(f"  disk-cache files   {out['dcache_files']:,} ({format_bytes(out['dcache_bytes_checked'])})")
    print(f"  compared to store  {out['compared_batches']:,} batches, {out['compared_rows']:,} rows")
    return 0
