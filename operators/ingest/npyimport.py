"""Import `.npy` arrays (features, edges, labels, split) as a raw dataset (`rawwriter`): the files are
memory-mapped and streamed in chunks of about `chunk_bytes`, so memory stays bounded by a chunk."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ConfigError, InputError
from ..formats.hashing import fingerprint
from ..formats.npyio import load_npy
from ..formats.store import SPLITS
from .rawwriter import (
    DEFAULT_CHUNK_BYTES,
    RawWriter,
    check_edge_features,
    check_features,
    publish_raw,
    split_from_indices,
    write_arrays,
)

__all__ = ["from_npy"]


def _load_npy(path: str | os.PathLike[str]) -> np.ndarray:
    p = Path(path)
    if not p.is_file():
        raise InputError(p, "no such file")
    try:
        return load_npy(p, "r")
    except (ValueError, OSError, EOFError) as e:
        raise InputError(p, f"not a readable .npy file ({e})") from e


def _npy_edges(edge_index: Any, src: Any, dst: Any) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
    """(src view, dst view, {role: path}) from either one [2, E] file or two [E] files."""
    if (edge_index is None) == (src is None and dst is None):
        raise ConfigError("edge_index", "give either an edge_index file or both src and dst files")
    if edge_index is not None:
        arr = _load_npy(edge_index)
        if arr.ndim == 2 and arr.shape[0] == 2:
            s, d = arr[0], arr[1]
        elif arr.ndim == 2 and arr.shape[1] == 2:
            s, d = arr[:, 0], arr[:, 1]
        else:
            raise InputError(edge_index, f"edge index must have shape [2, E] or [E, 2], got {list(arr.shape)}")
        if not np.issubdtype(arr.dtype, np.integer):
            raise InputError(edge_index, f"edge index must be integers, got {arr.dtype}")
        return s, d, {"edge_index": os.fspath(edge_index)}
    if src is None or dst is None:
        raise ConfigError("src" if src is None else "dst", "both src and dst files are needed")
    s, d = _load_npy(src), _load_npy(dst)
    for arr, path in ((s, src), (d, dst)):
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise InputError(path, f"must be a 1-D integer array, got {arr.dtype} {list(arr.shape)}")
    if len(s) != len(d):
        raise InputError(dst, f"has {len(d)} entries but {src} has {len(s)}")
    return s, d, {"src": os.fspath(src), "dst": os.fspath(dst)}


def from_npy(out: str | os.PathLike[str], *, features: str | os.PathLike[str],
             edge_index: str | os.PathLike[str] | None = None, src: str | os.PathLike[str] | None = None,
             dst: str | os.PathLike[str] | None = None, labels: str | os.PathLike[str] | None = None,
             split: str | os.PathLike[str] | None = None, train_idx: str | os.PathLike[str] | None = None,
             val_idx: str | os.PathLike[str] | None = None, test_idx: str | os.PathLike[str] | None = None,
             edge_features: str | os.PathLike[str] | None = None, feature_format: str = "arrow",
             chunk_bytes: int = DEFAULT_CHUNK_BYTES, force: bool = False) -> Path:
    """Write a raw dataset from `.npy` files, read memory-mapped chunk by chunk.

    Args:
        out: the raw dataset directory to create.
        features: [N, dim] numeric array (float16 kept, else stored as float32).
        edge_index: [2, E] (or [E, 2]) integer array; alternatively `src` and `dst`, [E] each.
        labels: [N] integer class ids (-1 = unlabeled; float NaN also means unlabeled).
        split: [N] split per node, either integer codes 0 train, 1 val, 2 test, 3 none or
            strings from {train, val, test, none}. Exclusive with the `*_idx` files.
        train_idx, val_idx, test_idx: 1-D node-id arrays; nodes in none of them get `none`.
        edge_features: [E, D] (or [E]) numeric array aligned with the edges: the ``edge_attr`` column
            (float16 kept, else float32).
        feature_format: `arrow` or `parquet` feature shards.
        chunk_bytes: rows (or edges) of about this many bytes go into each shard.
        force: replace `out` even when it is not a raw dataset.
    """
    x = _load_npy(features)
    check_features(x, os.fspath(features))
    num_nodes = int(x.shape[0])
    s, d, edge_files = _npy_edges(edge_index, src, dst)
    ea = None if edge_features is None else check_edge_features(_load_npy(edge_features), len(s),
                                                                os.fspath(edge_features))
    if labels is not None:
        y = _load_npy(labels)
        if y.shape[0] != num_nodes:
            raise InputError(labels, f"has {y.shape[0]} labels but {features} has {num_nodes} rows")
    if split is not None and any(p is not None for p in (train_idx, val_idx, test_idx)):
        raise ConfigError("split", "give either split or train_idx/val_idx/test_idx, not both")
    if split is not None:
        codes = _split_codes(_load_npy(split), num_nodes, split)
    else:
        codes = split_from_indices(num_nodes, [
            (code, np.asarray(_load_npy(p)), os.fspath(p))
            for code, p in enumerate((train_idx, val_idx, test_idx)) if p is not None])
    inputs = {role: fingerprint(p) for role, p in
              [("features", features), *((r, p) for r, p in edge_files.items()), ("edge_features", edge_features),
               ("labels", labels),
               ("split", split), ("train_idx", train_idx), ("val_idx", val_idx), ("test_idx", test_idx)]
              if p is not None}
    paths = {role: os.fspath(p) for role, p in
             [("features", features), ("edge_features", edge_features), ("labels", labels), ("split", split),
              ("train_idx", train_idx),
              ("val_idx", val_idx), ("test_idx", test_idx)] if p is not None}
    source = {"kind": "npy", **paths, **edge_files, "inputs": inputs}
    edge_name = edge_files.get("edge_index") or edge_files["src"]

    def build(w: RawWriter) -> int:
        return write_arrays(w, x, y if labels is not None else None, codes, s, d, chunk_bytes, edge_name,
                            os.fspath(labels) if labels is not None else None, edge_attr=ea,
                            edge_attr_name=os.fspath(edge_features) if edge_features is not None else "edge_attr")

    return publish_raw(out, force, source, feature_format, build)


def _split_codes(arr: np.ndarray, num_nodes: int, name: str | os.PathLike[str]) -> np.ndarray:
    """Split codes from an [N] array of integer codes 0..3 or of split names."""
    if arr.ndim != 1 or arr.shape[0] != num_nodes:
        raise InputError(name, f"split must have shape [N={num_nodes}], got {list(arr.shape)}")
    if arr.dtype.kind in "US":
        names = np.asarray(arr).astype(str)
        lookup = np.array(SPLITS)
        order = np.argsort(lookup)
        pos = np.searchsorted(lookup[order], names)
        pos = np.minimum(pos, len(SPLITS) - 1)
        ok = lookup[order][pos] == names
        if not ok.all():
            raise InputError(name, f"unknown split name {str(names[np.argmin(ok)])!r} (use train, val, test, none)")
        return order[pos].astype(np.uint8)
    if not np.issubdtype(arr.dtype, np.integer):
        raise InputError(name, f"split must be integer codes (0 train, 1 val, 2 test, 3 none) or names, got {arr.dtype}")
    codes = np.asarray(arr)
    if codes.size and (int(codes.min()) < 0 or int(codes.max()) >= len(SPLITS)):
        raise InputError(name, f"split codes must be in 0..3 (0 train, 1 val, 2 test, 3 none), "
                               f"found {int(codes.min())}..{int(codes.max())}")
    return codes.astype(np.uint8)
