"""Ingest of the node table: labels and splits, with every node id given exactly once.

The node files (``node_id`` int64, ``label`` int64 with -1 for unlabeled, ``split``
a plain or dictionary-encoded string in {train, val, test, none}) define the node
count N: their ids must be exactly 0..N-1. Output: ``labels.npy`` (int64) and
``splits.npy`` (uint8 codes of `store.SPLIT_CODE`).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import InputError
from ..formats.store import SPLITS
from ..formats.storecheck import Piece
from .raw import (
    check_id_range,
    int_column,
    iter_file_batches,
    require_columns,
    save_npy_in_place,
    table_schema,
)
from .remote import raw_path

__all__ = ["NODE_COLUMNS", "ingest_nodes", "read_node_table", "save_node_arrays", "split_codes"]

NODE_COLUMNS = ("node_id", "label", "split")
_UNSET = np.uint8(255)  # split code of a node no row has given yet


def split_codes(col: pa.Array, path: Path, row0: int, allowed: Sequence[str] = SPLITS) -> np.ndarray:
    """Split strings (plain or dictionary-encoded) as uint8 codes: indices into `allowed` (`store.SPLITS`
    for nodes, `links.LINK_SPLITS` for edges).

    Raises:
        InputError: the column is not a string column, holds a null, or a value outside `allowed`.
    """
    if col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputError(path, f"column 'split' is null at row {row0 + row}; expected one of {', '.join(allowed)}")
    values = col.dictionary if pa.types.is_dictionary(col.type) else col
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
            or pa.types.is_string_view(values.type)):
        raise InputError(path, f"column 'split' has type {col.type}, expected string (plain or dictionary)")
    codes = pc.fill_null(pc.index_in(values, value_set=pa.array(list(allowed))), -1).to_numpy().astype(np.int16)
    if pa.types.is_dictionary(col.type):
        codes = codes[col.indices.to_numpy()]
    bad = codes < 0
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise InputError(path, f"bad split value {col[row].as_py()!r} at row {row0 + row}; "
                               f"expected one of {', '.join(allowed)}")
    return codes.astype(np.uint8)


def _check_no_repeats(ids: np.ndarray, given: np.ndarray, path: Path, row0: int) -> None:
    """Raise when a batch repeats an id, or gives one an earlier row already gave."""
    earlier = given[ids] != _UNSET
    if earlier.any():
        i = int(np.flatnonzero(earlier)[0])
        raise InputError(path, f"duplicate node_id {int(ids[i])} at row {row0 + i} (an earlier row already gave it)")
    s = np.sort(ids)
    same = s[1:] == s[:-1]
    if same.any():
        dup = int(s[1:][same][0])
        rows = np.flatnonzero(ids == dup)[:2] + row0
        raise InputError(path, f"duplicate node_id {dup} at rows {int(rows[0])} and {int(rows[1])}")


def read_node_table(files: Sequence[str | os.PathLike[str]], num_nodes: int, batch_rows: int = 1 << 20,
                    node_type: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Read and validate node files: (labels int64 [N], split codes uint8 [N]) with every id 0..N-1 given
    exactly once (`node_type`: the files hold local ids of this type of a typed dataset, named in errors).

    Raises:
        InputError: naming the file and row, for an id out of range, a repeated id, a label
        below -1, a bad or null split, a missing column or an unreadable file.
    """
    labels = np.full(num_nodes, -1, dtype=np.int64)
    splits = np.full(num_nodes, _UNSET, dtype=np.uint8)
    for f in files:
        path = raw_path(f)
        require_columns(table_schema(path), NODE_COLUMNS, path)
        for row0, batch in iter_file_batches(path, NODE_COLUMNS, batch_rows):
            ids = int_column(batch, "node_id", path, row0)
            check_id_range(ids, num_nodes, path, row0, "node_id", node_type)
            lab = int_column(batch, "label", path, row0)
            if (lab < -1).any():
                i = int(np.flatnonzero(lab < -1)[0])
                raise InputError(path, f"label {int(lab[i])} at row {row0 + i} is negative (use -1 for unlabeled)")
            codes = split_codes(batch.column("split"), path, row0)
            _check_no_repeats(ids, splits, path, row0)
            labels[ids] = lab
            splits[ids] = codes
    missing = splits == _UNSET
    if missing.any():  # a typed dataset's files that miss a node; else only when the files changed since counted
        v = int(np.flatnonzero(missing)[0])
        whose = "" if node_type is None else f" of node type {node_type!r}"
        raise InputError(raw_path(files[0]).parent, f"no node row for node_id {v}{whose} ({int(missing.sum())} missing)")
    return labels, splits


def ingest_nodes(files: Sequence[str | os.PathLike[str]], num_nodes: int, out_dir: str | os.PathLike[str],
                 batch_rows: int = 1 << 20, pieces: list[Piece] | None = None) -> dict[str, Any]:
    """Read and validate the node files; write ``labels.npy`` and ``splits.npy`` into `out_dir`.

    Args:
        files: the node table files.
        num_nodes: N, the files' total row count; ids must be exactly 0..N-1.
        out_dir: the (staging) store directory.
        batch_rows: rows per record batch read.
        pieces: where given, the crc32 pieces of the files written are appended to it (`storecheck`).

    Returns:
        ``{"num_classes": max label + 1, "split_counts": {split: count}}``.

    Raises:
        InputError: naming the file and row, for an id out of range, a repeated id, a label
        below -1, a bad or null split, a missing column or an unreadable file.
    """
    labels, splits = read_node_table(files, num_nodes, batch_rows)
    return save_node_arrays(out_dir, labels, splits, pieces)


def save_node_arrays(out_dir: str | os.PathLike[str], labels: np.ndarray, splits: np.ndarray,
                     pieces: list[Piece] | None = None) -> dict[str, Any]:
    """Write ``labels.npy`` and ``splits.npy`` into `out_dir` (`pieces`: as `ingest_nodes`'s); their summary,
    ``{"num_classes", "split_counts"}``."""
    out = Path(out_dir)
    save_npy_in_place(out / "labels.npy", labels, pieces)
    save_npy_in_place(out / "splits.npy", splits, pieces)
    counts = np.bincount(splits, minlength=len(SPLITS))
    return {
        "num_classes": int(labels.max()) + 1 if len(labels) else 0,
        "split_counts": {name: int(counts[i]) for i, name in enumerate(SPLITS)},
    }
