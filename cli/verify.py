"""`diskflow verify PATH`: check a store's checksums, or a packed dataset's checksums and replay its plan against
the store."""
from __future__ import annotations

import argparse
import time

from ..sizes import format_bytes
from .options import positive_int

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify", help="check a store's checksums, or a packed dataset: checksums, sizes, replay against the store",
        description="A store: check every block of every file against the crc32 ingest recorded; exits 2 "
                    "naming the file and block of the first fault. A packed dataset: check every packed "
                    "segment's and disk-cache file's checksum, replay the whole plan (GPU/CPU tiers, CPU "
                    "inserts, packed rows, disk caches) and compare the assembled features of a random sample "
                    "of batches (all with --full, after checking the store's checksums) bit for bit with the "
                    "store's. Exits 2 naming the file, batch and shard of the first fault.")
    p.add_argument("packed", metavar="PATH",
                   help="a store (from `diskflow ingest`) or a packed dataset (from `diskflow prepare`)")
    p.add_argument("--full", action="store_true",
                   help="packed: check the store's checksums, then compare every batch, tier and disk-cache row "
                        "with the store")
    p.add_argument("--batches", type=positive_int("--batches"), default=16, metavar="N",
                   help="batches compared with the store without --full (default 16)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the batch sample (default 0)")
    p.add_argument("--store", metavar="STORE", help="the store, if it moved since packing (default: the manifest's)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ..datasets import verify

    t0 = time.perf_counter()
    out = verify(args.packed, full=args.full, sample_batches=args.batches, seed=args.seed, store_path=args.store)
    if out.get("kind") == "store":
        if not out["checked"]:      # a store written before checksums: it works, and nothing could be checked
            print(out["note"])
            return 0
        print(f"{args.packed}: OK in {time.perf_counter() - t0:.1f}s")
        print(f"  store files checked  {out['files']:,} ({format_bytes(out['bytes'])} in {out['blocks']:,} blocks)")
        return 0
    print(f"{args.packed}: OK in {time.perf_counter() - t0:.1f}s")
    store = out.get("store")
    if store is not None:
        print(f"  store files checked {store['files']:,} ({format_bytes(store['bytes'])})" if store["checked"]
              else f"  {store['note']}")
    print(f"  batches replayed   {out['batches']:,}")
    print(f"  segments checked   {out['segments_checked']:,} ({format_bytes(out['packed_bytes_checked'])})")
    print(f"  disk-cache files   {out['dcache_files']:,} ({format_bytes(out['dcache_bytes_checked'])})")
    print(f"  compared to store  {out['compared_batches']:,} batches, {out['compared_rows']:,} rows")
    return 0
