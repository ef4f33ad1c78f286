"""Edge-feature reads as a round of their own: every batch's sampled edge ids (``e_id``) as the ids of a
samples file whose rows are edges.

A sampled batch reads two tables: node features at its ``n_id`` and, where the store has edge features,
edge features at its ``e_id``. Counting, tiering, Belady planning, routing and packing read only a samples
file's ids and a store's row shards, so the edge reads get the same treatment by handing those tasks a
samples file whose ``n_id`` is the batch's ``e_id`` and a store whose rows are the edge features
(`formats.store.Store.edge_table`). The derived batches hold no graph (no edges, no seeds).

Within a batch every ``e_id`` is distinct: a node is expanded at most once per batch, and its in-edges
are drawn without replacement.
"""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import InputError
from ..formats.samples import (
    Buffer,
    id_type,
    list_values,
    open_arrow,
    record_batch,
    samples_bytes,
    write_samples,
)

__all__ = ["edge_reads", "edge_samples", "edge_samples_bytes"]


def edge_reads(sample_path: str | os.PathLike[str], data: Buffer | None = None) -> tuple[list[int], list[np.ndarray]]:
    """(batch numbers, ``e_id`` arrays as stored) of a samples file (`data`: its bytes, held in memory; the path
    then only names it); an InputError naming it when it keeps no edge ids (sampled from a store without
    edge features)."""
    p = Path(sample_path)
    try:
        reader = open_arrow(p, data)
        if reader.schema.get_field_index("e_id") < 0:
            raise InputError(p, "its batches keep no edge ids (e_id): sampled without edge features")
        got = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        return [int(rb.column("batch")[0].as_py()) for rb in got], [list_values(rb, "e_id") for rb in got]
    except (OSError, pa.ArrowInvalid) as e:
        raise InputError(p, f"unreadable samples file ({e})") from e


def _edge_records(numbers: list[int], e_ids: list[np.ndarray], num_rows: int, key: str
                  ) -> tuple[list[pa.RecordBatch], dict[str, Any]]:
    """The derived samples' record batches and their summary in the sample phase's terms (batches, accesses,
    the largest batch's rows), which the tier, plan and pack tasks read."""
    ids = id_type(num_rows)
    empty = np.empty((2, 0), np.int64)
    records = [record_batch(j, SimpleNamespace(n_id=e, edge_index=empty, batch_size=0,
                                               num_sampled_nodes=[int(e.shape[0])], num_sampled_edges=[]), ids)
               for j, e in zip(numbers, e_ids)]
    sizes = [int(e.shape[0]) for e in e_ids]
    return records, {"key": key, "batches": len(sizes), "accesses": int(sum(sizes)),
                     "max_nodes": max(sizes, default=0), "edges": 0}


def edge_samples(sample_path: str | os.PathLike[str], out_path: str | os.PathLike[str], num_rows: int,
                 key: str) -> dict[str, Any]:
    """Write the edge-row samples file of superbatch `key` (its batches' ``e_id`` as ``n_id``, for a table of
    `num_rows` edge rows) to `out_path`; its summary (`_edge_records`)."""
    records, summary = _edge_records(*edge_reads(sample_path), num_rows, key)
    write_samples(out_path, records, {"table": "edge_features"}, parents=False)
    return {**summary, "path": str(out_path)}


def edge_samples_bytes(data: Buffer, num_rows: int, key: str) -> tuple[pa.Buffer, dict[str, Any]]:
    """`edge_samples` in memory: the edge-row samples of a superbatch whose samples file is `data` (a streamed
    run keeps its samples in memory), as samples file bytes, and their summary."""
    records, summary = _edge_records(*edge_reads(f"samples of {key}", data), num_rows, key)
    return samples_bytes(records, {"table": "edge_features"}), summary
