"""The packed dataset's index files: one per superbatch, one single-row record batch per minibatch holding its
precomputed address translation (`IndexRecord`; the columns are listed in `formats.packed`'s docstring).

Apart from the dataset's reader (`formats.packed`) because the prepare side writes them here (a draft
written once, its segment offsets and checksums patched in place when packing knows them, without
rewriting the file), and the trainer reads them back; neither needs the other's half.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import InputError
from .atomic import write_bytes
from .directwrite import arrow_file_bytes, write_arrow_file_view
from .intwidth import fits_int32
from .samples import Buffer, list_values, open_arrow

__all__ = ["INDEX_SCHEMA", "INDEX_SCHEMA_INT32", "IndexRecord", "index_bytes", "index_record_batch", "index_schema",
           "patch_segments", "read_index_file", "segment_fields_at", "write_index_draft", "write_index_file"]


def index_schema(addresses: pa.DataType) -> pa.Schema:
    """The index file schema with `idx` of type `addresses` (int32 or int64)."""
    return pa.schema([
        ("batch", pa.int64()),
        ("epoch", pa.int64()),
        ("src", pa.large_list(pa.uint8())),
        ("idx", pa.large_list(addresses)),
        ("insert_pos", pa.large_list(pa.int64())),
        ("insert_slot", pa.large_list(pa.int64())),
        ("seg_offset", pa.list_(pa.int64())),
        ("seg_rows", pa.list_(pa.int64())),
        ("seg_crc", pa.list_(pa.uint32())),
        ("dcache", pa.int64()),
    ])


# `idx` holds one address per row a batch reads, as many as its `n_id`, and is most of an index
# file: int32 takes two fifths off the file, and serves every graph of up to 2**31 nodes.
INDEX_SCHEMA = index_schema(pa.int64())
INDEX_SCHEMA_INT32 = index_schema(pa.int32())


@dataclass
class IndexRecord:
    """The precomputed address translation of one minibatch (a row of an index file)."""

    batch: int
    epoch: int
    src: np.ndarray          # uint8 [n]
    idx: np.ndarray          # int32 or int64 (as stored) [n]
    insert_pos: np.ndarray   # int64 [k]
    insert_slot: np.ndarray  # int64 [k]
    seg_offset: np.ndarray   # int64 [P]
    seg_rows: np.ndarray     # int64 [P]
    seg_crc: np.ndarray      # uint32 [P]
    dcache: int

    @property
    def packed_rows(self) -> int:
        return int(self.seg_rows.sum())


def _list(values: np.ndarray, typ: pa.DataType) -> pa.Array:
    large = pa.types.is_large_list(typ)
    offsets = pa.array(np.array([0, len(values)], dtype=np.int64 if large else np.int32))
    cls = pa.LargeListArray if large else pa.ListArray
    return cls.from_arrays(offsets, pa.array(np.ascontiguousarray(values), type=typ.value_type))


def _fits_int32(records: Sequence[IndexRecord]) -> bool:
    return fits_int32(r.idx for r in records)


def index_record_batch(r: IndexRecord, schema: pa.Schema = INDEX_SCHEMA) -> pa.RecordBatch:
    """One index record as a single-row Arrow record batch (`INDEX_SCHEMA`, or `INDEX_SCHEMA_INT32`)."""
    f = schema.field
    cols = [
        pa.array([r.batch], type=pa.int64()),
        pa.array([r.epoch], type=pa.int64()),
        _list(np.asarray(r.src, np.uint8), f("src").type),
        _list(np.asarray(r.idx, f("idx").type.value_type.to_pandas_dtype()), f("idx").type),
        _list(np.asarray(r.insert_pos, np.int64), f("insert_pos").type),
        _list(np.asarray(r.insert_slot, np.int64), f("insert_slot").type),
        _list(np.asarray(r.seg_offset, np.int64), f("seg_offset").type),
        _list(np.asarray(r.seg_rows, np.int64), f("seg_rows").type),
        _list(np.asarray(r.seg_crc, np.uint32), f("seg_crc").type),
        pa.array([r.dcache], type=pa.int64()),
    ]
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def index_bytes(records: Sequence[IndexRecord], metadata: dict[str, Any] | None = None) -> pa.Buffer:
    """A superbatch's index records as the bytes of an Arrow IPC index file, built in memory (addresses
    as int32 when every one fits, else int64)."""
    schema = INDEX_SCHEMA_INT32 if _fits_int32(records) else INDEX_SCHEMA
    return arrow_file_bytes(schema, (index_record_batch(r, schema) for r in records), metadata)


def write_index_file(path: str | os.PathLike[str], records: Sequence[IndexRecord],
                     metadata: dict[str, Any] | None = None) -> None:
    """Write a superbatch's index records as an Arrow IPC file (temp name -> rename)."""
    write_bytes(path, index_bytes(records, metadata))


def write_index_draft(path: str | os.PathLike[str], records: Sequence[IndexRecord], metadata: dict[str, Any] | None,
                      parents: bool = True) -> np.ndarray:
    """Write a superbatch's index whose segment offsets and checksums are not known yet (placeholders), past
    the page cache (nobody reads it before `patch_segments` completes it, and that fsyncs it); return where
    those fields lie (`segment_fields_at`)."""
    schema = INDEX_SCHEMA_INT32 if _fits_int32(records) else INDEX_SCHEMA
    data = write_arrow_file_view(path, schema, [index_record_batch(r, schema) for r in records], metadata,
                                 durable=False, parents=parents)
    return segment_fields_at(data)


def segment_fields_at(data: pa.Buffer) -> np.ndarray:
    """Where, in an index file's bytes, each record's ``seg_offset`` and ``seg_crc`` values lie: int64
    [records, 2] byte offsets (little-endian int64 x P, uint32 x P), for `patch_segments`.

    An index can thus be written as soon as its superbatch is routed, before its segments' offsets and
    checksums are known, and completed in place after packing: Arrow IPC keeps fixed-width values
    uncompressed at fixed places, so the patched file is byte for byte the file written whole.
    """
    reader = pa.ipc.open_file(pa.BufferReader(data))      # zero-copy: the arrays are views of `data`
    out = np.zeros((reader.num_record_batches, 2), dtype=np.int64)
    for i in range(reader.num_record_batches):
        rb = reader.get_batch(i)
        for c, (name, width) in enumerate((("seg_offset", 8), ("seg_crc", 4))):
            col = rb.column(name)
            values = col.values
            at = values.buffers()[1].address - data.address + values.offset * width
            n = len(values)
            if col.offset != 0 or not 0 <= at <= data.size - n * width or \
                    bytes(memoryview(data)[at:at + n * width]) != values.to_numpy(zero_copy_only=False).tobytes():
                raise ValueError(f"index record {i}: {name} values are not a slice of the file's bytes")
            out[i, c] = at
    return out


def patch_segments(path: str | os.PathLike[str], at: np.ndarray, seg_offsets: np.ndarray, seg_crc: np.ndarray) -> None:
    """Write every record's segment offsets and checksums ([records, P]) into an index file written with
    placeholders, at the places `segment_fields_at` found; then fsync it."""
    offs = np.ascontiguousarray(seg_offsets, dtype="<i8")
    crcs = np.ascontiguousarray(np.asarray(seg_crc).astype(np.uint32), dtype="<u4")
    if offs.shape != crcs.shape or offs.shape[0] != np.shape(at)[0]:
        raise ValueError(f"{path}: {np.shape(at)[0]} records, offsets {offs.shape}, crcs {crcs.shape}")
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as e:
        raise InputError(path, f"cannot open the index to complete it ({e.strerror or e})") from e
    try:
        for i in range(offs.shape[0]):
            os.pwrite(fd, offs[i].tobytes(), int(at[i, 0]))
            os.pwrite(fd, crcs[i].tobytes(), int(at[i, 1]))
        os.fsync(fd)
    except OSError as e:
        raise InputError(path, f"cannot complete the index ({e.strerror or e})") from e
    finally:
        os.close(fd)


def read_index_file(path: str | os.PathLike[str], data: Buffer | None = None) -> list[IndexRecord]:
    """All index records of one superbatch file, in batch order.

    `data`: the file's content when it is held in memory instead (a staged superbatch on the
    training machine); `path` then only names it in errors.

    Raises:
        InputError: the file is missing, truncated or not an index file.
    """
    p = Path(path)
    try:
        reader = open_arrow(p, data)
        schema = reader.schema.remove_metadata()
        if not (schema.equals(INDEX_SCHEMA) or schema.equals(INDEX_SCHEMA_INT32)):
            raise InputError(p, f"unexpected index schema: {reader.schema}")
        out = []
        for i in range(reader.num_record_batches):
            rb = reader.get_batch(i)
            if rb.num_rows != 1:
                raise InputError(p, f"record batch {i} has {rb.num_rows} rows, expected 1")
            out.append(IndexRecord(
                batch=int(rb.column("batch")[0].as_py()),
                epoch=int(rb.column("epoch")[0].as_py()),
                src=list_values(rb, "src"),
                idx=list_values(rb, "idx"),
                insert_pos=list_values(rb, "insert_pos"),
                insert_slot=list_values(rb, "insert_slot"),
                seg_offset=list_values(rb, "seg_offset"),
                seg_rows=list_values(rb, "seg_rows"),
                seg_crc=list_values(rb, "seg_crc"),
                dcache=int(rb.column("dcache")[0].as_py()),
            ))
        return out
    except (OSError, pa.ArrowInvalid) as e:
        raise InputError(p, f"unreadable index file ({e})") from e
