"""Offline samples on disk: one Arrow IPC file per (epoch, superbatch), one record batch per minibatch.

Each record batch has a single row with the fields PyG's NeighborLoader puts on a batch
(ids only, no features): ``batch`` (index within the epoch), ``batch_size``, ``n_id``
(seeds first), ``row``/``col`` (the local ``edge_index``, source -> target),
``num_sampled_nodes`` and ``num_sampled_edges``. List columns keep every minibatch one
record batch, and reading back is zero-copy (``.values`` of each list column).

A round planned with a historical embedding cache (`operators.prepare.history`) adds four
list columns per minibatch, ``hist_prune``/``hist_prune_slot`` and ``hist_push``/``hist_push_slot``:
the local positions in ``n_id`` of the one-hop nodes whose subtrees were pruned (a cached
embedding stands in) or whose embeddings are pushed to the cache, and their cache slots.

A round whose store has edge features adds ``e_id``: each sampled edge's position in the store's
CSC edge order (its row of the edge features), aligned with ``row``/``col``. A link task's round adds
``label_row``/``label_col`` (the scored pairs' local positions in ``n_id``, positives first) and
``edge_label`` (1 for a positive edge, 0 for a negative pair): PyG's ``edge_label_index`` and
``edge_label``.

``n_id`` is int32 for a graph of up to 2**31 nodes (`id_type`) and int64 beyond: the ids
are about 40% of a samples file, which every plan, pack and (streamed) training machine
reads, so half their bytes is a fifth of the file. Readers take either and hand back the ids
as stored; whoever needs int64 (the native planner, torch) converts.
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from ...errors import InputError
from .directwrite import arrow_file_bytes, write_arrow_file

__all__ = ["HISTORY_FIELDS", "ID_LIMIT", "LINK_FIELDS", "SCHEMA", "SCHEMAS", "SCHEMA_INT32", "Buffer", "SampleRecord",
           "id_type", "list_values", "open_arrow", "read_n_ids", "read_samples", "record_batch",
           "samples_bytes", "samples_schema", "select_batches", "write_samples"]

Buffer = bytes | memoryview | np.ndarray     # a file's content held in memory

ID_LIMIT = 2**31        # node ids below it are stored as int32


def id_type(num_nodes: int) -> pa.DataType:
    """How a graph of `num_nodes` nodes stores node ids (and addresses bounded by them): int32 up to
    2**31 nodes, int64 beyond."""
    return pa.int32() if num_nodes <= ID_LIMIT else pa.int64()


HISTORY_FIELDS = ("hist_prune", "hist_prune_slot", "hist_push", "hist_push_slot")
LINK_FIELDS = ("label_row", "label_col", "edge_label")


def samples_schema(ids: pa.DataType, history: bool = False, edges: pa.DataType | None = None,
                   link: bool = False) -> pa.Schema:
    """The samples file schema with node ids of type `ids` (int32 or int64), with the history plan's
    columns when `history`, the sampled edges' ids (``e_id``, of type `edges`) when given, and a link
    task's scored pairs when `link`."""
    extra = [(name, pa.large_list(pa.int32())) for name in HISTORY_FIELDS] if history else []
    if edges is not None:
        extra.append(("e_id", pa.large_list(edges)))
    if link:
        extra += [("label_row", pa.large_list(pa.int32())), ("label_col", pa.large_list(pa.int32())),
                  ("edge_label", pa.large_list(pa.float32()))]
    return pa.schema([
        ("batch", pa.int64()),
        ("batch_size", pa.int64()),
        ("n_id", pa.large_list(ids)),
        ("row", pa.large_list(pa.int32())),
        ("col", pa.large_list(pa.int32())),
        ("num_sampled_nodes", pa.list_(pa.int64())),
        ("num_sampled_edges", pa.list_(pa.int64())),
        *extra,
    ])


SCHEMA = samples_schema(pa.int64())
SCHEMA_INT32 = samples_schema(pa.int32())
SCHEMAS = tuple(samples_schema(ids, history, edges, link) for ids in (pa.int64(), pa.int32())
                for history in (False, True) for edges in (None, pa.int32(), pa.int64()) for link in (False, True))


@dataclass
class SampleRecord:
    """One minibatch's sample, as read back from disk."""

    batch: int
    batch_size: int
    n_id: np.ndarray            # int32 or int64 (as stored) [n], seeds first
    edge_index: np.ndarray      # int64 [2, e], local, source -> target
    num_sampled_nodes: list[int]
    num_sampled_edges: list[int]
    history: tuple[np.ndarray, ...] | None = None    # the history plan's four int64 arrays, if any
    e_id: np.ndarray | None = None              # int32 or int64 (as stored) [e]: each edge's CSC position
    edge_label_index: np.ndarray | None = None  # int64 [2, l]: a link task's scored pairs, local
    edge_label: np.ndarray | None = None        # float32 [l]: 1 positive, 0 negative
    typed: bool = False         # a typed store's flat sample: e_id tells the edge types (set by the reader's caller)


def _list_array(values: np.ndarray, typ: pa.DataType) -> pa.Array:
    offsets = np.array([0, len(values)], dtype=np.int64 if pa.types.is_large_list(typ) else np.int32)
    return type(pa.array([], type=typ)).from_arrays(pa.array(offsets), pa.array(values, type=typ.value_type))


def record_batch(batch: int, sampled: object, ids: pa.DataType | None = None,
                 edges: pa.DataType | None = None) -> pa.RecordBatch:
    """A one-row record batch from a `SampledBatch` (fields n_id, edge_index, num_sampled_*, batch_size).

    `ids`: the node id type (`id_type` of the graph); int64 when not given. A sample with a history
    plan (``sampled.history``, four arrays) gets the history columns. `edges`: the edge id type
    (`id_type` of the edge count) when the round keeps the sampled edges' ids (``sampled.e_id``). A
    link task's sample (``sampled.edge_label_index`` and ``sampled.edge_label``) gets its pairs.
    """
    plan = getattr(sampled, "history", None)
    label_index = getattr(sampled, "edge_label_index", None)
    schema = samples_schema(pa.int32() if ids == pa.int32() else pa.int64(), plan is not None, edges,
                            label_index is not None)
    n_id = np.asarray(sampled.n_id)  # type: ignore[attr-defined]
    ei = np.asarray(sampled.edge_index)  # type: ignore[attr-defined]
    if n_id.shape[0] >= 2**31:
        raise ValueError("a minibatch with >= 2**31 nodes cannot use int32 local indices")
    if schema.field("n_id").type.value_type == pa.int32() and n_id.size and (int(n_id.max()) >= ID_LIMIT or int(n_id.min()) < 0):
        raise ValueError(f"node ids outside [0, 2**31) cannot be stored as int32 (batch {batch})")
    n_id = n_id.astype(schema.field("n_id").type.value_type.to_pandas_dtype(), copy=False)
    cols = [
        pa.array([batch], type=pa.int64()),
        pa.array([int(sampled.batch_size)], type=pa.int64()),  # type: ignore[attr-defined]
        _list_array(n_id, schema.field("n_id").type),
        _list_array(ei[0].astype(np.int32, copy=False), schema.field("row").type),
        _list_array(ei[1].astype(np.int32, copy=False), schema.field("col").type),
        _list_array(np.asarray(sampled.num_sampled_nodes, dtype=np.int64), schema.field("num_sampled_nodes").type),  # type: ignore[attr-defined]
        _list_array(np.asarray(sampled.num_sampled_edges, dtype=np.int64), schema.field("num_sampled_edges").type),  # type: ignore[attr-defined]
    ]
    if plan is not None:
        cols += [_list_array(np.asarray(v).astype(np.int32), schema.field(name).type)
                 for name, v in zip(HISTORY_FIELDS, plan)]
    if edges is not None:
        e_id = getattr(sampled, "e_id", None)
        if e_id is None:
            raise ValueError(f"batch {batch}: the round keeps the sampled edges' ids, and this sample has none")
        cols.append(_list_array(np.asarray(e_id).astype(edges.to_pandas_dtype(), copy=False), schema.field("e_id").type))
    if label_index is not None:
        pairs = np.asarray(label_index)
        cols += [_list_array(pairs[0].astype(np.int32), schema.field("label_row").type),
                 _list_array(pairs[1].astype(np.int32), schema.field("label_col").type),
                 _list_array(np.asarray(sampled.edge_label, dtype=np.float32),  # type: ignore[attr-defined]
                             schema.field("edge_label").type)]
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def samples_bytes(batches: Sequence[pa.RecordBatch], metadata: dict[str, str] | None = None) -> pa.Buffer:
    """The record batches (all of one id type) as the bytes of an Arrow IPC samples file, built in memory."""
    return arrow_file_bytes(batches[0].schema if batches else SCHEMA, batches, metadata)


def write_samples(path: str | os.PathLike[str], batches: Sequence[pa.RecordBatch],
                  metadata: dict[str, str] | None = None, parents: bool = True) -> int:
    """Write record batches to an Arrow IPC file atomically, past the page cache where the file system
    allows (`directwrite.write_arrow_file`), except the node ids: counting, tracing, planning and routing read
    them back next, the edges only training does. Returns the file's size. `parents=False`: never create
    the directory."""
    return write_arrow_file(path, batches[0].schema if batches else SCHEMA, batches, metadata, parents=parents,
                            warm=("n_id",))


def list_values(rb: pa.RecordBatch, name: str) -> np.ndarray:
    """The values of a one-row record batch's list column `name` (zero-copy where the type allows)."""
    return rb.column(name).values.to_numpy(zero_copy_only=False)


def open_arrow(path: Path, data: Buffer | None) -> pa.ipc.RecordBatchFileReader:
    """An Arrow IPC file reader over `data` (the file's content held in memory) or, without it, the file
    memory-mapped; zero-copy either way."""
    return pa.ipc.open_file(pa.BufferReader(pa.py_buffer(data)) if data is not None else pa.memory_map(str(path), "r"))


def read_samples(path: str | os.PathLike[str], data: Buffer | None = None) -> Iterator[SampleRecord]:
    """Iterate the minibatch samples of one superbatch file, in order (memory-mapped).

    `data`: the file's content when it is held in memory instead (a staged superbatch on the
    training machine); `path` then only names it in errors.
    """
    p = Path(path)
    try:
        reader = open_arrow(p, data)
    except (OSError, pa.ArrowInvalid) as e:
        raise InputError(p, f"unreadable samples file ({e})") from e
    schema = reader.schema.remove_metadata()
    if not any(schema.equals(known) for known in SCHEMAS):
        raise InputError(p, f"unexpected samples schema: {reader.schema}")
    history = schema.get_field_index(HISTORY_FIELDS[0]) >= 0
    has_edges = schema.get_field_index("e_id") >= 0
    link = schema.get_field_index("edge_label") >= 0
    for i in range(reader.num_record_batches):
        rb = reader.get_batch(i)
        row = list_values(rb, "row").astype(np.int64)
        col = list_values(rb, "col").astype(np.int64)
        yield SampleRecord(
            batch=int(rb.column("batch")[0].as_py()),
            batch_size=int(rb.column("batch_size")[0].as_py()),
            n_id=list_values(rb, "n_id"),
            edge_index=np.stack([row, col]),
            num_sampled_nodes=list_values(rb, "num_sampled_nodes").tolist(),
            num_sampled_edges=list_values(rb, "num_sampled_edges").tolist(),
            history=tuple(list_values(rb, name).astype(np.int64) for name in HISTORY_FIELDS) if history else None,
            e_id=list_values(rb, "e_id") if has_edges else None,
            edge_label_index=np.stack([list_values(rb, "label_row").astype(np.int64),
                                       list_values(rb, "label_col").astype(np.int64)]) if link else None,
            edge_label=list_values(rb, "edge_label") if link else None,
        )


def read_n_ids(path: str | os.PathLike[str], data: Buffer | None = None) -> list[np.ndarray]:
    """Only the `n_id` arrays of a superbatch file (what counting and planning need), as stored.

    `data`: the file's content when it is in memory (a sample task's result); `path` then only
    names it in errors.
    """
    p = Path(path)
    try:
        reader = open_arrow(p, data)
        return [list_values(reader.get_batch(i), "n_id") for i in range(reader.num_record_batches)]
    except (OSError, pa.ArrowInvalid, KeyError) as e:
        raise InputError(p, f"unreadable samples file ({e})") from e


def select_batches(where: str, data: Buffer, rank: int, world: int) -> tuple[pa.Buffer, int]:
    """The samples file (its bytes) of only the minibatches at positions ``rank, rank + world, ...`` of
    another one (`data`, named `where` in errors): one GPU worker's share of a superbatch. Returns the
    bytes and the number of batches kept. The record batches are kept as they are (zero-copy slices of
    `data` until written), schema and metadata included."""
    try:
        reader = open_arrow(Path(where), data)
        kept = [reader.get_batch(i) for i in range(rank, reader.num_record_batches, world)]
    except (OSError, pa.ArrowInvalid) as e:
        raise InputError(where, f"unreadable samples file ({e})") from e
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, reader.schema) as writer:
        for rb in kept:
            writer.write_batch(rb)
    return sink.getvalue(), len(kept)
