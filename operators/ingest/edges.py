"""Ingest of the edge list into CSC by destination, out of core.

Two steps, so that a graph whose edges do not fit in memory still ingests:

1. `scan_edges`, once per edge file: reads bounded chunks of (src, dst), validates
   the ids, optionally adds the reversed edges, and appends each chunk to one spill
   file, grouped by destination bucket (buckets are equal ranges of destination ids);
   the returned offsets say where every (chunk, bucket) run lies in the file.
2. `csc_group`, once per run of buckets: reads its runs from every spill file, sorts
   them by (dst, src), and writes its slice of ``indptr`` and ``indices`` into the
   preallocated arrays at offsets known from the scans' counts.

While N < 2**32 an edge is spilled as one uint64 key ``dst << 32 | src``: sorting the
keys sorts by destination then source, and both ids come back with a shift and a
mask (8 bytes per edge on disk and in memory). Larger graphs spill (dst, src) int64
pairs and sort them with `np.lexsort`.

With ``dedupe`` (used by to_undirected, which coalesces like PyG's ``to_undirected``)
a group may keep fewer edges than it read, so its output goes first to a scratch array
at the scan offsets and `compact_group` then moves it to its final place.

Edge features and link splits (`operators.ingest.links`) ride along. A scan that reads an
``edge_attr`` column checks it and writes it, in raw order, into one preallocated array at the
edge's raw ordinal (the file's first ordinal plus the row); the spill then carries each
record's ordinal in a parallel ``.ord`` file, and `csc_group` sorts by (key, ordinal), so it
knows for every CSC position which raw edge it holds (the ``order`` array that the edge
feature shards gather by). Under dedupe the record with the lowest ordinal is kept, so a
repeated edge keeps the features of its first raw row (the reversed copy of a raw edge
counts at that edge's row). A split column makes every record carry its tag (``.tag``):
`csc_group` refuses a pair that is training in one row and validation or test in another
(under to_undirected, also reversed), and keeps only message-passing edges. A random split
needs no check (a pair's split is a hash of the pair), so its scans spill only the
message-passing edges.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import InputError
from ...native.constants import ALIGN
from ..formats.npyio import create_aligned_npy
from ..formats.storecheck import Piece, add_pieces
from .features import fixed_rows, vector_type
from .links import (
    LINK_SPLITS,
    TAG_MP,
    TAG_SPLIT,
    TAG_SUPERVISION,
    TAG_TEST,
    TAG_VAL,
    LinkConfig,
    LinkPiece,
    link_tags,
)
from .nodes import split_codes
from .raw import check_id_range, int_column, iter_file_batches, require_columns, table_schema
from .remote import raw_path

__all__ = ["EDGE_ATTR", "EDGE_COLUMNS", "EDGE_SPLIT", "INDEX32_LIMIT", "PACKED_LIMIT", "EdgeAttrTarget", "EdgeSchema",
           "EdgeSpill", "LinkScan", "allocate_npy", "compact_group", "csc_group", "edge_schema", "indices_dtype",
           "is_packed", "scan_edges"]

EDGE_COLUMNS = ("src", "dst")
EDGE_ATTR = "edge_attr"    # optional: fixed_size_list<float32|float16, D>, the edge's features
EDGE_SPLIT = "split"       # optional: "train" | "val" | "test" (string or dictionary), the link split
PACKED_LIMIT = 1 << 32   # below this node count an edge packs into one uint64 key
INDEX32_LIMIT = 1 << 31  # below this node count indices are int32
_LOW32 = np.uint64(0xFFFFFFFF)
_IO_BLOCK = 64 << 20     # bytes per read/write call when copying arrays


def is_packed(num_nodes: int) -> bool:
    """Whether edges spill as one uint64 key (True) or as an int64 (dst, src) pair."""
    return num_nodes < PACKED_LIMIT


def indices_dtype(num_nodes: int) -> np.dtype:
    """dtype of the CSC ``indices`` array: int32 while N < 2**31, else int64."""
    return np.dtype(np.int32 if num_nodes < INDEX32_LIMIT else np.int64)


@dataclass(frozen=True)
class EdgeSchema:
    """What the edge files' schemas say beyond src and dst (the same in every file).

    Attributes:
        attr_dtype, attr_dim: the ``edge_attr`` column's item type (numpy name) and width; None without one.
        split: whether the files have a ``split`` column.
    """

    attr_dtype: str | None = None
    attr_dim: int | None = None
    split: bool = False

    @property
    def arrow_type(self) -> str | None:
        """The canonical Arrow type of ``edge_attr``."""
        if self.attr_dtype is None or self.attr_dim is None:
            return None
        return str(pa.list_(pa.from_numpy_dtype(np.dtype(self.attr_dtype)), self.attr_dim))


def _attr_type(schema: pa.Schema, path: Path) -> tuple[str, int] | None:
    i = schema.get_field_index(EDGE_ATTR)
    if i < 0:
        return None
    dtype, width = vector_type(schema.field(i).type, EDGE_ATTR, path, owner="edge", width="width",
                               what="edge features")
    return dtype.name, width


def edge_schema(files: Sequence[Path]) -> EdgeSchema:
    """The optional columns of the edge files (footers only): every file has the same ones, of one type.

    Raises:
        InputError: naming the file, for an ``edge_attr`` of a wrong type or width, or a file that has an
        ``edge_attr`` or ``split`` column where the first file has none (or the reverse).
    """
    first: tuple[tuple[str, int] | None, bool] | None = None
    for path in files:
        schema = table_schema(path)
        require_columns(schema, EDGE_COLUMNS, path)
        mine = (_attr_type(schema, path), schema.get_field_index(EDGE_SPLIT) >= 0)
        if first is None:
            first = mine
            continue
        if mine[0] != first[0]:
            def text(a: tuple[str, int] | None) -> str:
                return "no edge_attr" if a is None else f"edge_attr {a[0]}[{a[1]}]"
            raise InputError(path, f"schema mismatch between edge shards: {text(mine[0])} here but "
                                   f"{text(first[0])} in {files[0]}")
        if mine[1] != first[1]:
            has = "has" if mine[1] else "has no"
            raise InputError(path, f"schema mismatch between edge shards: this file {has} a split column, "
                                   f"{files[0]} {'has none' if mine[1] else 'has one'}")
    attr, split = first if first is not None else (None, False)
    return EdgeSchema(None if attr is None else attr[0], None if attr is None else attr[1], split)


@dataclass(frozen=True)
class EdgeAttrTarget:
    """Where a scan writes the edge features it reads: the raw-order array (an aligned .npy of
    [raw edges, dim]) at row `ordinal_start + row` of the file; `allow_nonfinite` accepts NaN/inf."""

    path: str
    dtype: str
    dim: int
    allow_nonfinite: bool = False


@dataclass(frozen=True)
class LinkScan:
    """The link split a scan applies: `column` (the ``split`` column) or the random split of `cfg`; the
    supervision edges of each split go to ``{prefix}-{split}.bin``."""

    cfg: LinkConfig
    column: bool
    prefix: str


@dataclass(frozen=True)
class EdgeSpill:
    """What one edge scan wrote: its spill file and where each (chunk, bucket) run lies in it.

    Attributes:
        source: the input edge file.
        path: the spill file.
        offsets: int64 [chunks, buckets + 1]; chunk c's records of buckets [a, b) are
            records offsets[c, a]..offsets[c, b] of the file.
        edges: records written (input edges, doubled by to_undirected).
        ordinals: the records' raw ordinals are in ``path + ".ord"`` (int64, same order).
        tags: the records' link tags are in ``path + ".tag"`` (uint8, same order).
        raw_rows: the rows of the input file.
        link: the supervision edges the scan set aside, per split.
    """

    source: str
    path: str
    offsets: np.ndarray
    edges: int
    ordinals: bool = False
    tags: bool = False
    raw_rows: int = 0
    link: tuple[LinkPiece, ...] = ()

    def bucket_counts(self) -> np.ndarray:
        """Records per bucket, summed over chunks."""
        return np.diff(self.offsets, axis=1).sum(axis=0) if len(self.offsets) else np.zeros(0, np.int64)


@dataclass
class _Chunk:
    row0: int
    src: np.ndarray
    dst: np.ndarray
    attr: np.ndarray | None
    codes: np.ndarray | None


def _edge_chunks(path: Path, num_nodes: int, chunk_rows: int, attr_dim: int | None, split: bool,
                 num_src: int | None = None, types: tuple[str, str] | None = None) -> Iterator[_Chunk]:
    """Validated chunks of about `chunk_rows` edges (small record batches are merged), rows in file order:
    ``src`` ids below `num_src` (default `num_nodes`), ``dst`` ids below `num_nodes`; `types`: the (src, dst)
    node types of a typed dataset's edge file, whose ids are local ids of those types."""
    schema = table_schema(path)
    require_columns(schema, EDGE_COLUMNS, path)
    columns = [*EDGE_COLUMNS, *([EDGE_ATTR] if attr_dim is not None else []), *([EDGE_SPLIT] if split else [])]
    require_columns(schema, columns, path)
    parts: list[_Chunk] = []
    held = 0

    def merged() -> _Chunk:
        def cat(name: str) -> Any:
            items = [getattr(c, name) for c in parts]
            return None if items[0] is None else np.concatenate(items)
        return _Chunk(parts[0].row0, cat("src"), cat("dst"), cat("attr"), cat("codes"))

    for row0, batch in iter_file_batches(path, columns, chunk_rows):
        src = int_column(batch, "src", path, row0)
        dst = int_column(batch, "dst", path, row0)
        check_id_range(src, num_nodes if num_src is None else num_src, path, row0, "edge src",
                       None if types is None else types[0])
        check_id_range(dst, num_nodes, path, row0, "edge dst", None if types is None else types[1])
        attr = fixed_rows(batch, EDGE_ATTR, attr_dim, path, row0, "edge feature") if attr_dim is not None else None
        codes = split_codes(batch.column(EDGE_SPLIT), path, row0, LINK_SPLITS) if split else None
        parts.append(_Chunk(row0, src, dst, attr, codes))
        held += len(src)
        if held >= chunk_rows:
            yield merged()
            parts, held = [], 0
    if held:
        yield merged()


def _write_attr_rows(target: EdgeAttrTarget, fd: int, attr: np.ndarray, ordinal: int, path: Path, row0: int
                     ) -> None:
    if not target.allow_nonfinite:
        bad = ~np.isfinite(attr).all(axis=1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(path, f"non-finite edge feature value (NaN or inf) at row {row0 + i} "
                                   "(pass allow_nonfinite=True to accept it)")
    dt = np.dtype(target.dtype)
    _pwrite_all(fd, np.ascontiguousarray(attr, dt), ALIGN + ordinal * target.dim * dt.itemsize)


def scan_edges(path: str | os.PathLike[str], spill_path: str | os.PathLike[str], *, num_nodes: int,
               bucket_width: int, num_buckets: int, chunk_rows: int, to_undirected: bool = False,
               packed: bool | None = None, ordinal_start: int = 0, expected_rows: int | None = None,
               edge_attr: EdgeAttrTarget | None = None, link: LinkScan | None = None,
               num_src: int | None = None, reverse: bool = False, types: tuple[str, str] | None = None
               ) -> EdgeSpill:
    """Validate one edge file and spill its edges grouped by destination bucket.

    Args:
        path: the input edge file (``src``, ``dst`` int64; optionally ``edge_attr`` and ``split``).
        spill_path: the spill file to create.
        num_nodes: N; ids must lie in 0..N-1.
        bucket_width: destination ids per bucket (bucket of v = v // bucket_width; a power of
            two makes that a shift).
        num_buckets: ceil(N / bucket_width).
        chunk_rows: edges read, bucket-sorted and written at a time (bounds memory).
        to_undirected: also spill every edge reversed.
        packed: spill uint64 keys (default: when N < 2**32) or int64 pairs.
        ordinal_start: the raw ordinal of the file's first row (the rows of the edge files before it).
        expected_rows: the rows the file was counted with (a file that changed since is refused).
        edge_attr: read the ``edge_attr`` column into this raw-order array (and spill ordinals).
        link: apply this link split (tags, supervision pieces); a column split spills tags and ordinals.
        num_src: the source ids' range, where it differs from the destinations' (an edge type of a typed
            dataset between two node types): a record's source must be below it, its destination below
            `num_nodes`.
        reverse: spill every edge reversed (dst -> src): the CSC of the file's edges grouped by their
            sources, as a typed dataset's reverse edge types are built (not with `edge_attr` or `link`).
        types: the file's (src column, dst column) node types, for a typed dataset's messages.

    Raises:
        InputError: naming the file, row and id, for an id out of range, a null, a missing
        or non-integer column, a bad split value, a NaN edge feature, or an unreadable file.
    """
    source = raw_path(path)
    if reverse and (edge_attr is not None or link is not None):
        raise ValueError("scan_edges: reverse spills carry no edge features and no link split")
    packed = is_packed(max(num_nodes, num_src or 0)) if packed is None else packed
    # the file's columns are checked against their own ranges: reversed, its src column is our destination
    file_dst, file_src = (num_src if num_src is not None else num_nodes, num_nodes) if reverse \
        else (num_nodes, num_src)
    bucket_type = np.uint16 if num_buckets <= 1 << 16 else np.uint32
    shift = bucket_width.bit_length() - 1 if bucket_width & (bucket_width - 1) == 0 else -1
    column = link is not None and link.column
    carry_ord = edge_attr is not None or column
    offsets: list[np.ndarray] = []
    written = 0
    rows = 0
    pieces = {s: 0 for s in LINK_SPLITS}
    side: list[Any] = []
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(spill_path, "wb"))
        ord_out = stack.enter_context(open(f"{spill_path}.ord", "wb")) if carry_ord else None
        tag_out = stack.enter_context(open(f"{spill_path}.tag", "wb")) if column else None
        link_out = ({s: stack.enter_context(open(f"{link.prefix}-{s}.bin", "wb")) for s in LINK_SPLITS}
                    if link is not None else {})
        attr_fd = os.open(edge_attr.path, os.O_WRONLY) if edge_attr is not None else -1
        if attr_fd >= 0:
            stack.callback(os.close, attr_fd)
        for chunk in _edge_chunks(source, file_dst, chunk_rows, None if edge_attr is None else edge_attr.dim,
                                  bool(link is not None and link.column), file_src, types):
            src, dst, n = (chunk.dst, chunk.src, len(chunk.src)) if reverse else (chunk.src, chunk.dst, len(chunk.src))
            if expected_rows is not None and chunk.row0 + n > expected_rows:
                raise InputError(source, f"holds more than the {expected_rows} rows it was counted with "
                                         "(the file changed during the ingest)")
            rows = chunk.row0 + n
            ordinal = ordinal_start + chunk.row0
            if edge_attr is not None and chunk.attr is not None:
                _write_attr_rows(edge_attr, attr_fd, chunk.attr, ordinal, source, chunk.row0)
            ords = np.arange(ordinal, ordinal + n, dtype=np.int64) if carry_ord else None
            tags = None
            if link is not None:
                tags = link_tags(src, dst, chunk.codes, link.cfg, to_undirected)
                train = TAG_SUPERVISION if link.cfg.disjoint_train_ratio > 0 else TAG_MP
                for split, tag in (("train", train), ("val", TAG_VAL), ("test", TAG_TEST)):
                    sel = tags == tag
                    k = int(sel.sum())
                    if k:
                        link_out[split].write(_bytes(np.stack([src[sel], dst[sel]], axis=1)))
                        pieces[split] += k
                if not column:  # a random split needs no check: spill the message-passing edges only
                    keep = tags == TAG_MP
                    src, dst = src[keep], dst[keep]
                    ords = ords[keep] if ords is not None else None
                    tags = None
            if to_undirected:
                src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
                ords = np.concatenate([ords, ords]) if ords is not None else None
                tags = np.concatenate([tags, tags]) if tags is not None else None
            bucket = ((dst >> shift) if shift >= 0 else (dst // bucket_width)).astype(bucket_type)
            order = np.argsort(bucket, kind="stable")  # a radix sort for 16-bit buckets
            if packed:
                key = dst.view(np.uint64) << np.uint64(32)
                key |= src.view(np.uint64)
                records = key[order]
            else:
                records = np.stack([dst[order], src[order]], axis=1)
            out.write(_bytes(records))
            if ord_out is not None and ords is not None:
                ord_out.write(_bytes(ords[order]))
            if tag_out is not None and tags is not None:
                tag_out.write(_bytes(tags[order]))
            counts = np.bincount(bucket, minlength=num_buckets)
            offsets.append(written + np.concatenate([[0], np.cumsum(counts)]))
            written += len(order)
        side = [LinkPiece(s, f"{link.prefix}-{s}.bin", pieces[s]) for s in LINK_SPLITS] if link is not None else []
        if attr_fd >= 0:
            os.fdatasync(attr_fd)
    if expected_rows is not None and rows != expected_rows:
        raise InputError(source, f"holds {rows} rows but was counted with {expected_rows} "
                                 "(the file changed during the ingest)")
    table = np.stack(offsets).astype(np.int64) if offsets else np.zeros((0, num_buckets + 1), np.int64)
    return EdgeSpill(str(source), str(spill_path), table, written, carry_ord, column, rows, tuple(side))


def _bytes(a: np.ndarray) -> memoryview:
    """A flat byte view of a contiguous array (writable when the array is)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8).data


def _pread_into(fd: int, buf: memoryview, offset: int, path: str) -> None:
    done = 0
    while done < len(buf):
        n = os.preadv(fd, [buf[done:done + _IO_BLOCK]], offset + done)
        if n <= 0:
            raise InputError(path, f"spill file ended early at byte {offset + done}")
        done += n


def _pwrite_all(fd: int, data: np.ndarray, offset: int, pieces: list[Piece] | None = None, name: str = "") -> None:
    """Write `data` at `offset`; with `pieces`, append the crc32 pieces of what is written, as store file `name`."""
    view = _bytes(data)
    add_pieces(pieces, name, offset, np.frombuffer(view, np.uint8))
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:done + _IO_BLOCK], offset + done)


def allocate_npy(path: str | os.PathLike[str], dtype: np.dtype | str, length: int) -> str:
    """Create a zero-filled 1-D aligned .npy of `length` elements (sparse) for tasks to fill in place."""
    create_aligned_npy(path, dtype, (int(length),))
    return str(path)


def _sources(records: np.ndarray, packed: bool) -> np.ndarray:
    """The source ids of sorted records: a key's low 32 bits (a strided view on little-endian
    machines), or a pair's second column."""
    if not packed:
        return records[:, 1]
    if sys.byteorder == "little":
        return records.view(np.uint32)[0::2]
    return records & _LOW32


def _read_runs(runs: Sequence[tuple[str, np.ndarray, np.ndarray]], suffix: str, dtype: np.dtype, width: int,
               total: int) -> np.ndarray:
    """The records of `runs` from the spill files (``path + suffix``), concatenated in run order."""
    dt = np.dtype(dtype)
    buf = np.empty((total, width) if width > 1 else total, dt)
    rec = dt.itemsize * width
    pos = 0
    for path, starts, stops in runs:
        name = path + suffix
        fd = os.open(name, os.O_RDONLY)
        try:
            for a, b in zip(np.asarray(starts).tolist(), np.asarray(stops).tolist()):  # per chunk
                if b > a:
                    _pread_into(fd, _bytes(buf[pos:pos + b - a]), a * rec, name)
                    pos += b - a
        finally:
            os.close(fd)
    return buf


def _raw_row(ordinal: int, sources: Sequence[tuple[str, int]]) -> tuple[str, int]:
    """(file, row) of a raw ordinal, from the edge files' (path, first ordinal)."""
    starts = [s for _, s in sources]
    i = int(np.searchsorted(starts, ordinal, side="right")) - 1
    return sources[i][0], ordinal - sources[i][1]


def _check_split_conflicts(same: np.ndarray, tags: np.ndarray, ords: np.ndarray, dst_src: tuple[np.ndarray, np.ndarray],
                           sources: Sequence[tuple[str, int]], undirected: bool) -> None:
    """Refuse a pair whose sorted records (`same`: record i+1 has record i's pair) are in two splits."""
    split = np.where(tags == TAG_SUPERVISION, TAG_MP, tags)
    clash = same & (split[1:] != split[:-1])
    if not clash.any():
        return
    i = int(np.flatnonzero(clash)[0])
    dst, src = int(dst_src[0][i]), int(dst_src[1][i])
    (f1, r1), (f2, r2) = _raw_row(int(ords[i]), sources), _raw_row(int(ords[i + 1]), sources)
    which = "edge (or its reverse)" if undirected else "edge"
    where = f"at row {r2} of this file" if f1 == f2 else f"at row {r2} of {f2}"
    raise InputError(f1, f"{which} {src}->{dst} is a {TAG_SPLIT[int(tags[i])]} edge at row {r1} and a "
                         f"{TAG_SPLIT[int(tags[i + 1])]} edge {where}: a pair may be in one link split only "
                         "(validation and test edges must not be training edges)")


def csc_group(runs: Sequence[tuple[str, np.ndarray, np.ndarray]], *, lo: int, hi: int, base: int,
              indptr_path: str | os.PathLike[str], indices_path: str | os.PathLike[str],
              index_dtype: np.dtype | str, packed: bool = True, dedupe: bool = False,
              order_path: str | os.PathLike[str] | None = None, tags: bool = False,
              sources: Sequence[tuple[str, int]] = (), undirected: bool = False,
              pieces: list[Piece] | None = None) -> int:
    """Build the CSC columns of destinations [lo, hi) from the spilled runs and write them in place.

    Args:
        runs: per spill file, (path, starts, stops): record ranges of this group, one per chunk.
        lo, hi: the destination range (buckets' union).
        base: position in ``indices`` of this group's first edge.
        indptr_path, indices_path: the preallocated aligned .npy arrays; this task writes
            ``indptr[lo+1 : hi+1]`` and ``indices[base : base + kept]``.
        index_dtype: dtype of ``indices``.
        packed: records are uint64 keys (else int64 (dst, src) pairs).
        dedupe: drop repeated (dst, src) pairs (keeping the lowest ordinal where ordinals are spilled).
        order_path: the spills carry ordinals (``.ord``); write the kept records' ordinals into this
            preallocated aligned int64 .npy at ``[base : base + kept]``.
        tags: the spills carry link tags (``.tag``): refuse a pair in two splits, keep message-passing edges.
        sources: the edge files' (path, first ordinal), for naming a conflict's rows.
        undirected: the spills hold reversed edges too (for the conflict message).
        pieces: where given, the crc32 pieces of what is written to ``indptr`` and ``indices`` are appended
            to it (store files named by the arrays' file names; `storecheck.add_pieces`).

    Returns:
        The number of edges written (kept).
    """
    total = int(sum(int((np.asarray(stops) - np.asarray(starts)).sum()) for _, starts, stops in runs))
    buf = _read_runs(runs, "", np.dtype(np.uint64 if packed else np.int64), 1 if packed else 2, total)
    targets = np.arange(lo, hi + 1, dtype=np.int64)
    ords: np.ndarray | None = None
    keep: np.ndarray | None = None
    if order_path is None:
        if packed:
            buf.sort()
        else:
            buf = buf[np.lexsort((buf[:, 1], buf[:, 0]))]
    else:
        ords = _read_runs(runs, ".ord", np.dtype(np.int64), 1, total)
        order = np.lexsort((ords, buf)) if packed else np.lexsort((ords, buf[:, 1], buf[:, 0]))
        buf, ords = buf[order], ords[order]
        if tags and total:
            tag = _read_runs(runs, ".tag", np.dtype(np.uint8), 1, total)[order]
            same = buf[1:] == buf[:-1] if packed else (buf[1:] == buf[:-1]).all(axis=1)
            pair = ((buf >> np.uint64(32)).astype(np.int64), (buf & _LOW32).astype(np.int64)) if packed \
                else (buf[:, 0], buf[:, 1])
            _check_split_conflicts(same, tag, ords, pair, sources, undirected)
            keep = tag == TAG_MP  # a pair's records share one tag (it is a hash of the pair)
        del order
    if dedupe and total:
        first = np.empty(total, bool)
        first[0] = True
        if packed:
            np.not_equal(buf[1:], buf[:-1], out=first[1:])
        else:
            first[1:] = (buf[1:] != buf[:-1]).any(axis=1)
        keep = first if keep is None else keep & first
    if keep is not None and not keep.all():
        buf = buf[keep]
        ords = ords[keep] if ords is not None else None
    bounds = np.searchsorted(buf, targets.astype(np.uint64) << np.uint64(32)) if packed \
        else np.searchsorted(buf[:, 0], targets)
    kept = len(buf)

    dt = np.dtype(index_dtype)
    fd = os.open(indptr_path, os.O_WRONLY)
    try:
        _pwrite_all(fd, (base + bounds[1:]).astype(np.int64), ALIGN + (lo + 1) * 8, pieces, Path(indptr_path).name)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    fd = os.open(indices_path, os.O_WRONLY)
    try:
        step = _IO_BLOCK // 8
        for a in range(0, kept, step):  # per block: bounded temporaries
            _pwrite_all(fd, _sources(buf[a:a + step], packed).astype(dt), ALIGN + (base + a) * dt.itemsize,
                        pieces, Path(indices_path).name)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    if order_path is not None and ords is not None:
        fd = os.open(order_path, os.O_WRONLY)
        try:
            _pwrite_all(fd, ords, ALIGN + base * 8)
            os.fdatasync(fd)
        finally:
            os.close(fd)
    return kept


def _move(src_path: str | os.PathLike[str], src_base: int, dst_path: str | os.PathLike[str], dst_base: int,
          count: int, dt: np.dtype, pieces: list[Piece] | None = None) -> None:
    """Copy elements [src_base, +count) of one aligned 1-D .npy to [dst_base, +count) of another, a block at a
    time; with `pieces`, append the crc32 pieces of what is written (as the store file named by `dst_path`'s name)."""
    src_fd = os.open(src_path, os.O_RDONLY)
    dst_fd = os.open(dst_path, os.O_WRONLY)
    try:
        step = _IO_BLOCK // dt.itemsize
        for a in range(0, count, step):  # per block
            block = np.empty(min(step, count - a), dt)
            _pread_into(src_fd, _bytes(block), ALIGN + (src_base + a) * dt.itemsize, str(src_path))
            _pwrite_all(dst_fd, block, ALIGN + (dst_base + a) * dt.itemsize, pieces, Path(dst_path).name)
        os.fdatasync(dst_fd)
    finally:
        os.close(src_fd)
        os.close(dst_fd)


def compact_group(*, scratch_path: str | os.PathLike[str], scratch_base: int, kept: int,
                  indices_path: str | os.PathLike[str], final_base: int,
                  indptr_path: str | os.PathLike[str], lo: int, hi: int, index_dtype: np.dtype | str,
                  order_scratch_path: str | os.PathLike[str] | None = None,
                  order_path: str | os.PathLike[str] | None = None, pieces: list[Piece] | None = None) -> None:
    """Move a deduplicated (or link-filtered) group's indices from the scratch array to their final place
    and shift its ``indptr[lo+1 : hi+1]`` by the same distance; with `order_path`, move its ordinals too
    (`pieces`: as `csc_group`'s, for ``indices`` and ``indptr``)."""
    dt = np.dtype(index_dtype)
    shift = scratch_base - final_base
    _move(scratch_path, scratch_base, indices_path, final_base, kept, dt, pieces)
    if order_scratch_path is not None and order_path is not None:
        _move(order_scratch_path, scratch_base, order_path, final_base, kept, np.dtype(np.int64))
    if shift:
        fd = os.open(indptr_path, os.O_RDWR)
        try:
            ptr = np.empty(hi - lo, np.int64)
            _pread_into(fd, _bytes(ptr), ALIGN + (lo + 1) * 8, str(indptr_path))
            _pwrite_all(fd, ptr - shift, ALIGN + (lo + 1) * 8, pieces, Path(indptr_path).name)
            os.fdatasync(fd)
        finally:
            os.close(fd)
