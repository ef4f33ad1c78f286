"""Datasets on disk: raw datasets (from the importers or `diskflow.synth`), stores and packed datasets.

The importers write a raw dataset (``edges/``, ``features/``, ``nodes/`` shards and a manifest) from a PyG
``Data``, ``.npy`` arrays or an OGB dataset folder, reading the source in bounded-memory chunks; `Store`
reads an ingested store; `verify` checks a store against its checksums, or a packed dataset against its store. The ``check_*_output``
functions refuse an output path that holds something else before a long job starts writing it.

    from diskflow.datasets import from_npy, verify

    from_npy("raw", features="x.npy", edge_index="edges.npy", labels="y.npy", split="split.npy")
    verify("packed", full=True)
"""
from __future__ import annotations

import os

from .operators.formats.manifest import read_manifest
from .operators.formats.packed import budget_bytes
from .operators.formats.store import Store
from .operators.formats.verify import verify, verify_store
from .operators.ingest.npyimport import from_npy
from .operators.ingest.ogbimport import from_ogb
from .operators.ingest.pygimport import from_pyg, load_pyg_file

__all__ = ["Store", "budget_bytes", "check_packed_output", "check_raw_output", "dataset_kind", "from_npy", "from_ogb",
           "from_pyg", "load_pyg_file", "read_manifest", "unchecked_note", "verify", "verify_store", "warn_unchecked"]


def unchecked_note(path: str | os.PathLike[str]) -> str | None:
    """The one line that says a store has no checksums (written before them) and how to re-ingest it; None
    for a store with checksums, or anything that is not a store."""
    from .operators.formats.store import STORE_FORMAT
    from .operators.formats.storecheck import CHECKSUMS, UNCHECKED

    manifest = read_manifest(path) if os.path.isdir(path) else None
    if manifest is None or manifest.get("format") != STORE_FORMAT or CHECKSUMS in manifest:
        return None
    return f"{path}: {UNCHECKED}"


def warn_unchecked(path: str | os.PathLike[str]) -> None:
    """Print `unchecked_note` to stderr where there is one (a command about to read an unchecked store)."""
    import sys

    note = unchecked_note(path)
    if note:
        print(f"warning: {note}", file=sys.stderr)


def dataset_kind(path: str | os.PathLike[str]) -> str | None:
    """What `path` holds, by its manifest: ``"raw"`` (a raw dataset), ``"store"`` (an ingested store),
    ``"packed"`` (a packed dataset), or None (none of them: no such directory, or no diskflow manifest),
    so that a command given the wrong one can say which it got and what takes it.

    Raises:
        InputError: its manifest is unreadable.
    """
    from .operators.formats.packed import PACKED_FORMAT
    from .operators.formats.store import STORE_FORMAT
    from .operators.ingest.rawwriter import RAW_FORMAT

    manifest = read_manifest(path) if os.path.isdir(path) else None
    found = (manifest or {}).get("format")
    kinds = {RAW_FORMAT: "raw", STORE_FORMAT: "store", PACKED_FORMAT: "packed"}
    return kinds.get(found) if isinstance(found, str) else None


def check_raw_output(out: str | os.PathLike[str], force: bool) -> None:
    """Refuse `out` unless it is missing, empty or a raw dataset (`force`: allow replacing it), before an
    importer or synth reads a possibly large source.

    Raises:
        InputError: `out` holds something else, naming what.
    """
    from .operators.formats.outputs import check_replaceable
    from .operators.ingest.rawwriter import RAW_KIND

    check_replaceable(out, force, RAW_KIND)


def check_packed_output(out: str | os.PathLike[str], force: bool) -> None:
    """Refuse `out` (and its cache ``out.work``) unless missing, empty or a packed dataset and prepare cache
    (`force`: allow replacing them), before preparing into it starts a cluster.

    Raises:
        InputError: either holds something else, naming what.
    """
    from .flow.prepare import check_outputs

    check_outputs(out, force)
