"""Import a PyG `Data` or `HeteroData` (in memory, or a file saved with `torch.save`) as a raw dataset
(`rawwriter`; a `HeteroData` as a typed one, `heterotypes`), its arrays streamed in chunks of about
`chunk_bytes`."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InputError
from ..formats.hetero import EdgeType, edge_type_name
from .heterotypes import HeteroSpec
from .rawwriter import (
    DEFAULT_CHUNK_BYTES,
    NO_SPLIT,
    HeteroRawWriter,
    RawWriter,
    TypedNodes,
    check_edge_features,
    check_features,
    labels_as_int64,
    publish_hetero_raw,
    publish_raw,
    split_from_indices,
    write_arrays,
    write_typed_arrays,
)

__all__ = ["KEPT", "NODE_KEPT", "from_pyg", "is_hetero", "load_pyg_file"]

KEPT = ("x", "edge_index", "edge_attr", "y", "train_mask", "val_mask", "test_mask")  # what the raw format stores
_LINK_LABELS = ("edge_label_index", "edge_label")
NODE_KEPT = ("x", "y", "train_mask", "val_mask", "test_mask", "num_nodes")   # what a typed raw dataset keeps of a node type
_MASKS = ("train_mask", "val_mask", "test_mask")


def is_hetero(data: Any) -> bool:
    """Whether `data` is a typed graph the way PyG's `HeteroData` is one: node and edge types and `metadata()`."""
    return callable(getattr(data, "metadata", None)) and hasattr(data, "node_types") and hasattr(data, "edge_types")


def _numpy(t: Any) -> np.ndarray:
    return t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)


def _attribute_names(data: Any) -> list[str]:
    """The attributes a `Data` holds (PyG's ``keys()``, or the instance's own for a look-alike)."""
    keys = getattr(data, "keys", None)
    if callable(keys):
        return list(keys())
    if keys is not None:
        return list(keys)
    return [k for k in vars(data) if not k.startswith("_")]


def _refuse_unstored(data: Any, name: str) -> None:
    """One line naming the first attribute the raw format cannot store (never dropped in silence)."""
    for attr in _attribute_names(data):
        if attr in KEPT or attr == "num_nodes" or getattr(data, attr, None) is None:
            continue
        if attr in _LINK_LABELS:
            raise InputError(f"{name}: {attr}", "link-prediction labels (a RandomLinkSplit output) are not imported: "
                                                "import the whole graph and ingest it with --link-split, or give "
                                                "the edges a split column")
        raise InputError(f"{name}: {attr}", f"is not stored by the raw format, which keeps {', '.join(KEPT)}: "
                                            "remove it from the Data (or fold it into x or edge_attr) first")


def from_pyg(data: Any, out: str | os.PathLike[str], *, split_masks: bool = True, name: str = "Data",
             feature_format: str = "arrow", chunk_bytes: int = DEFAULT_CHUNK_BYTES,
             force: bool = False) -> Path:
    """Write a homogeneous `torch_geometric.data.Data` as a raw dataset.

    Uses `x` [N, dim] (float16 kept, anything else stored as float32), `edge_index` [2, E]
    (src = row 0, dst = row 1, written as given: add reverse edges yourself or let ingest
    symmetrise), `edge_attr` [E, D] or [E] (the edges' features, the ``edge_attr`` column; float16
    kept, else float32), `y` [N] (missing: all -1) and, when `split_masks`, `train_mask`/`val_mask`/
    `test_mask` (missing or unset: split `none`). Any other attribute (`pos`, `edge_weight`, an extra
    node tensor, RandomLinkSplit's `edge_label_index`) is refused in one line naming it: nothing is
    dropped in silence.

    A `HeteroData` (`is_hetero`) is written as a typed raw dataset (`heterotypes`): per node type `x`
    (optional), `y` and the masks (optional), per edge type `edge_index` in the types' local ids. An edge
    type's `edge_attr` or link labels are refused in one line (typed edge features are not supported yet).

    Args:
        data: the graph.
        out: the raw dataset directory to create.
        split_masks: take splits from the masks; False marks every node `none`.
        name: how errors refer to the source (the CLI passes the file path).
        feature_format: `arrow` or `parquet` feature shards.
        chunk_bytes: rows (or edges) of about this many bytes go into each shard.
        force: replace `out` even when it is not a raw dataset.
    """
    if is_hetero(data):
        return _from_hetero(data, out, split_masks=split_masks, name=name, feature_format=feature_format,
                            chunk_bytes=chunk_bytes, force=force)
    _refuse_unstored(data, name)
    x_t = getattr(data, "x", None)
    ei_t = getattr(data, "edge_index", None)
    if x_t is None:
        raise InputError(name, "Data has no node features `x` (the raw format needs one feature row per node)")
    if ei_t is None:
        raise InputError(name, "Data has no `edge_index`")
    x = x_t.detach().cpu().numpy() if hasattr(x_t, "detach") else np.asarray(x_t)
    check_features(x, f"{name}: x")
    num_nodes = int(x.shape[0])
    ei = ei_t.detach().cpu().numpy() if hasattr(ei_t, "detach") else np.asarray(ei_t)
    if ei.ndim != 2 or ei.shape[0] != 2 or not np.issubdtype(ei.dtype, np.integer):
        raise InputError(f"{name}: edge_index", f"must be an integer [2, E] array, got {ei.dtype} {list(ei.shape)}")
    ea_t = getattr(data, "edge_attr", None)
    edge_attr = None if ea_t is None else check_edge_features(_numpy(ea_t), ei.shape[1], f"{name}: edge_attr")
    y_t = getattr(data, "y", None)
    if y_t is not None:
        y = labels_as_int64(y_t.detach().cpu().numpy() if hasattr(y_t, "detach") else np.asarray(y_t), f"{name}: y")
        if len(y) != num_nodes:
            raise InputError(f"{name}: y", f"has {len(y)} labels for {num_nodes} nodes")
    else:
        y = np.full(num_nodes, -1, dtype=np.int64)
    codes = np.full(num_nodes, NO_SPLIT, dtype=np.uint8)
    if split_masks:
        masks = []
        for code, attr in enumerate(("train_mask", "val_mask", "test_mask")):
            m = getattr(data, attr, None)
            if m is None:
                continue
            m = m.detach().cpu().numpy() if hasattr(m, "detach") else np.asarray(m)
            if m.dtype != np.bool_ or m.shape != (num_nodes,):
                raise InputError(f"{name}: {attr}", f"must be a bool [N={num_nodes}] mask, got {m.dtype} {list(m.shape)}")
            masks.append((code, np.flatnonzero(m), f"{name}: {attr}"))
        codes = split_from_indices(num_nodes, masks)

    def build(w: RawWriter) -> int:
        return write_arrays(w, x, y, codes, ei[0], ei[1], chunk_bytes, f"{name}: edge_index",
                            edge_attr=edge_attr, edge_attr_name=f"{name}: edge_attr")

    return publish_raw(out, force, {"kind": "pyg", "path": name}, feature_format, build)


def _node_arrays(store: Any, node_type: str, split_masks: bool, name: str) -> tuple[int, TypedNodes]:
    """A node type's count and (x, labels, split codes), each None where the type has none; other
    attributes refused in one line naming them."""
    for attr in _attribute_names(store):
        if attr not in NODE_KEPT and getattr(store, attr, None) is not None:
            raise InputError(f"{name}: {node_type}.{attr}", "is not stored by the typed raw format, which keeps "
                                                            f"{', '.join(NODE_KEPT)} of a node type: remove it first")
    x_t = getattr(store, "x", None)
    x = None if x_t is None else _numpy(x_t)
    if x is not None:
        check_features(x, f"{name}: {node_type}.x")
    count = getattr(store, "num_nodes", None)
    if count is None:
        count = None if x is None else x.shape[0]
    if count is None or int(count) < 1:
        raise InputError(f"{name}: {node_type}", "has no nodes (set its num_nodes, or its x)")
    count = int(count)
    if x is not None and x.shape[0] != count:
        raise InputError(f"{name}: {node_type}.x", f"has {x.shape[0]} rows for {count} nodes")
    y_t = getattr(store, "y", None)
    y = None
    if y_t is not None:
        y = labels_as_int64(_numpy(y_t), f"{name}: {node_type}.y")
        if len(y) != count:
            raise InputError(f"{name}: {node_type}.y", f"has {len(y)} labels for {count} nodes")
    masks = []
    for code, attr in enumerate(_MASKS):
        m_t = getattr(store, attr, None) if split_masks else None
        if m_t is None:
            continue
        m = _numpy(m_t)
        if m.dtype != np.bool_ or m.shape != (count,):
            raise InputError(f"{name}: {node_type}.{attr}", f"must be a bool [N={count}] mask, got {m.dtype} "
                                                           f"{list(m.shape)}")
        masks.append((code, np.flatnonzero(m), f"{name}: {node_type}.{attr}"))
    codes = split_from_indices(count, masks) if masks else None
    return count, (x, y, codes)


def _edge_index(store: Any, et: EdgeType, name: str) -> np.ndarray:
    """An edge type's edge_index [2, E]; its edge features, link labels or any other attribute refused."""
    where = f"{name}: {edge_type_name(et)}"
    for attr in _attribute_names(store):
        if attr == "edge_index" or getattr(store, attr, None) is None:
            continue
        if attr == "edge_attr":
            raise InputError(f"{where}.edge_attr", "typed edge features are not supported yet: remove edge_attr from "
                                                   "the HeteroData")
        if attr in _LINK_LABELS:
            raise InputError(f"{where}.{attr}", "link-prediction labels are not supported for typed graphs yet: "
                                                "import the whole graph")
        raise InputError(f"{where}.{attr}", "is not stored by the typed raw format, which keeps an edge type's "
                                            "edge_index only: remove it first")
    ei_t = getattr(store, "edge_index", None)
    if ei_t is None:
        raise InputError(where, "has no edge_index")
    ei = _numpy(ei_t)
    if ei.ndim != 2 or ei.shape[0] != 2 or not np.issubdtype(ei.dtype, np.integer):
        raise InputError(f"{where}.edge_index", f"must be an integer [2, E] array, got {ei.dtype} {list(ei.shape)}")
    return ei


def _from_hetero(data: Any, out: str | os.PathLike[str], *, split_masks: bool, name: str, feature_format: str,
                 chunk_bytes: int, force: bool) -> Path:
    """`from_pyg` of a `HeteroData`: a typed raw dataset."""
    node_types, edge_types = data.metadata()
    stored = {a for t in [*node_types, *edge_types] for a in _attribute_names(data[t])}
    for attr in _attribute_names(data):      # a graph-level attribute (HeteroData.keys() spans every store)
        if attr not in stored and getattr(data, attr, None) is not None:
            raise InputError(f"{name}: {attr}", "a graph-level attribute is not stored by the typed raw format: "
                                                "remove it first")
    nodes: dict[str, TypedNodes] = {}
    counts = []
    for t in node_types:        # a loop per type
        count, arrays = _node_arrays(data[t], str(t), split_masks, name)
        nodes[str(t)] = arrays
        counts.append({"name": str(t), "num_nodes": count})
    spec = HeteroSpec.from_json({"node_types": counts, "edge_types": [list(et) for et in edge_types]}, name)
    edges = {}
    for et in edge_types:
        key = (str(et[0]), str(et[1]), str(et[2]))
        ei = _edge_index(data[et], key, name)
        edges[key] = (ei[0], ei[1])

    def build(w: HeteroRawWriter) -> None:
        write_typed_arrays(w, nodes, edges, chunk_bytes, name)

    return publish_hetero_raw(out, force, {"kind": "pyg", "path": name, "typed": True}, feature_format, spec, build)


def load_pyg_file(path: str | os.PathLike[str]) -> Any:
    """Load a `Data` saved with `torch.save` (full unpickling: only load files you trust)."""
    import torch

    p = Path(path)
    if not p.is_file():
        raise InputError(p, "no such file")
    try:
        obj = torch.load(p, map_location="cpu", weights_only=False)
    except Exception as e:  # torch raises many kinds for a corrupt file
        raise InputError(p, f"cannot load with torch.load ({type(e).__name__}: {e})") from e
    if isinstance(obj, (tuple, list)) and obj and hasattr(obj[0], "edge_index"):
        obj = obj[0]  # a (data, slices) pair as InMemoryDataset saves it, or [data]
    if isinstance(obj, dict) and "x" in obj and "edge_index" in obj:
        from torch_geometric.data import Data
        obj = Data(**obj)
    if not hasattr(obj, "edge_index") and not is_hetero(obj):
        raise InputError(p, f"does not hold a torch_geometric Data or HeteroData (found {type(obj).__name__})")
    return obj
