"""The int8 row codec's column scales of a store, as a Dask graph: each column's absolute maximum over every
feature row (`operators.prepare.scales`), divided into 127 steps (`operators.formats.rowcodec.column_scales`).

    scales-p{p}-{tok}               feature shard p read once (memory-mapped): its columns' absolute maxima
    scales-merge-{l}-{i}-{tok}      a pairwise tree of merges (elementwise maxima): the store's

The tasks pass only the maxima (dim floats); the shards are read where the tasks run, so every worker must
see the store. A NaN or infinite feature fails its shard's task, naming the shard file and row.

A graph of its own, over a store, as `flow.ingest` and `flow.synth` are: no `prepare` round builds it yet.
Once `prepare` encodes rows as int8 with column scales, these tasks become a phase of its graph, in
``flow/prepare/`` beside the others, and docs/design.md names their groups (tests/test_design_doc.py holds
every key written there to both).
"""
from __future__ import annotations

import contextlib
import os
import uuid
from typing import Any

import numpy as np

from ..operators.formats.rowcodec import column_scales
from ..operators.formats.store import Store
from ..operators.prepare.scales import ColumnStats, combine_stats, shard_stats
from .graph import Submit, delayed_submit
from .progress import compute

__all__ = ["int8_scales", "scales_graph", "scales_merge_task", "scales_task", "store_absmax"]


def scales_task(store_path: str, p: int) -> dict[str, Any]:
    """Feature shard p's statistics (`shard_stats`) and the bytes read (reported to Dask: `Metered`)."""
    stats = shard_stats(store_path, p)
    return {"stats": stats, "bytes_read": stats.bytes_read}


def scales_merge_task(*parts: dict[str, Any]) -> dict[str, Any]:
    """Partial statistics merged (`combine_stats`); their bytes were reported by the shard tasks."""
    return {"stats": combine_stats(*(part["stats"] for part in parts))}


def scales_graph(store_path: str, shards: int, tok: str, submit: Submit = delayed_submit) -> Any:
    """The node of a store's column statistics: one task per feature shard and a pairwise tree of merges,
    under the keys of the module docstring (`tok`: the run's token, ending every key). Its result is
    ``{"stats": ColumnStats}``."""
    if shards < 1:
        raise ValueError(f"shards: a store's statistics need at least one shard, got {shards}")
    parts = [submit(scales_task, store_path, p, key=f"scales-p{p}-{tok}") for p in range(shards)]
    level = 0
    while len(parts) > 1:
        parts = [submit(scales_merge_task, *parts[i:i + 2], key=f"scales-merge-{level}-{i // 2}-{tok}")
                 if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
        level += 1
    return parts[0]


def store_absmax(store_path: str | os.PathLike[str], client: Any = None, *, quiet: bool = True) -> ColumnStats:
    """Every feature column's absolute maximum over the store (`scales_graph`), computed on `client` (a
    `distributed.Client`), else on the active client or Dask's local scheduler (`flow.progress.compute`).
    `quiet`: no progress bar.

    Raises:
        InputError: a NaN or infinite feature (naming the shard file and row), or an unreadable store.
    """
    store = Store(store_path)
    if not store.shards:
        return ColumnStats(np.zeros(store.feature_dim, dtype=np.float32), 0)
    tok = f"{uuid.uuid4().int % 10**8:08d}"
    root = scales_graph(str(store.path), len(store.shards), tok)
    with client.as_current() if client is not None else contextlib.nullcontext():
        (result,) = compute([root], desc="int8 scales", disable=True if quiet else None)
    stats: ColumnStats = result["stats"]
    return stats


def int8_scales(store_path: str | os.PathLike[str], client: Any = None, *, quiet: bool = True) -> np.ndarray:
    """The int8 "column" scales of a store's features: float32 [dim], each column's absolute maximum over
    every row / 127, rounded up (`column_scales`; 0 for a zero column), computed as a Dask graph
    (`store_absmax`: on `client`, else the active client or the local scheduler).

    Raises:
        InputError: a NaN or infinite feature (naming the shard file and row), or an unreadable store.
    """
    return column_scales(store_absmax(store_path, client, quiet=quiet).absmax)
