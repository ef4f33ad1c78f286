"""A small typed store made by hand for the derived-features tests: papers with features, authors the mean
of their papers, institutions the mean of their authors (the chain), with the dense numpy reference."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from diskflow.native.constants import ALIGN
from diskflow.operators.ingest.features import write_aligned


@dataclass(frozen=True)
class Rule:
    """The fields of the ingest's `DeriveRule`, for the tests."""

    type: str
    neighbour: str
    indptr: str
    indices: str
    edge_type: tuple[str, str, str]
    reduce: str = "mean"


@dataclass
class TypedStore:
    """The store's directory, its manifest (not written), the rules and the table the rules should produce."""

    path: Path
    manifest: dict[str, Any]
    rules: list[Rule]
    expected: np.ndarray        # the whole feature table after derivation
    before: np.ndarray          # the feature table as written (derived rows zero)


def _csc(rng: np.random.Generator, count: int, neighbours: int, mean_degree: float, empty: float
         ) -> tuple[np.ndarray, np.ndarray]:
    """A CSC over `count` nodes, each with Poisson(`mean_degree`) neighbours among `neighbours`, a share `empty`
    of them with none (sources within a node's list unsorted, repeats allowed)."""
    deg = rng.poisson(mean_degree, count)
    deg[rng.random(count) < empty] = 0
    deg[0] = 0                                  # the first and the last nodes: no neighbours, ranges' edges
    deg[-1] = 0
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    return indptr, rng.integers(0, neighbours, int(indptr[-1])).astype(np.int32)


def _mean(rows: np.ndarray, indptr: np.ndarray, indices: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Each node's mean of `rows[indices of its list]` in float64, cast to `dtype` (numpy, in memory)."""
    out = np.zeros((len(indptr) - 1, rows.shape[1]), np.float64)
    dst = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    np.add.at(out, dst, rows[indices].astype(np.float64))
    out /= np.maximum(np.diff(indptr), 1)[:, None]
    return out.astype(dtype)


def typed_store(root: Path, *, papers: int = 157, authors: int = 211, institutions: int = 23, dim: int = 5,
                table_dim: int = 7, dtype: str = "float32", shard_rows: int = 50, seed: int = 0) -> TypedStore:
    """Write the feature shards (derived rows zero) and the two CSCs grouped by the derived types; return the
    manifest as the ingest would hold it before derivation, with the rules and the expected table."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    n = papers + authors + institutions
    table = np.zeros((n, table_dim), dt)
    table[:papers, :dim] = rng.standard_normal((papers, dim)).astype(dt)
    (root / "features").mkdir(parents=True)
    (root / "hetero").mkdir()
    shards = []
    for p in range(math.ceil(n / shard_rows)):
        lo, hi = p * shard_rows, min(n, (p + 1) * shard_rows)
        rel = f"features/part-{p:05d}.npy"
        write_aligned(root / rel, table[lo:hi])
        shards.append({"path": rel, "row_start": lo, "rows": hi - lo, "offset": ALIGN,
                       "nbytes": (hi - lo) * table_dim * dt.itemsize})
    a_ptr, a_idx = _csc(rng, authors, papers, 3.0, 0.2)
    i_ptr, i_idx = _csc(rng, institutions, authors, 12.0, 0.2)
    files = {"author": ("hetero/author-ptr.npy", "hetero/author-idx.npy"),
             "institution": ("hetero/institution-ptr.npy", "hetero/institution-idx.npy")}
    for arr, rel in ((a_ptr, files["author"][0]), (a_idx, files["author"][1]),
                     (i_ptr, files["institution"][0]), (i_idx, files["institution"][1])):
        np.save(root / rel, arr)
    expected = table.copy()
    expected[papers:papers + authors, :dim] = _mean(table[:papers, :dim], a_ptr, a_idx, dt)
    expected[papers + authors:, :dim] = _mean(expected[papers:papers + authors, :dim], i_ptr, i_idx, dt)
    derived = {"author": ["paper", "writes", "author"], "institution": ["author", "affiliated_with", "institution"]}
    node_types = [{"name": name, "offset": off, "count": count, "dim": dim, "dtype": dtype,
                   "derived": None if name == "paper" else {"reduce": "mean", "edge_type": derived[name],
                                                              "from": derived[name][0]}}
                  for name, off, count in (("paper", 0, papers), ("author", papers, authors),
                                           ("institution", papers + authors, institutions))]
    edge_types = [{"src": "author", "rel": "writes", "dst": "paper", "indptr": "hetero/writes-ptr.npy",
                   "indices": "hetero/writes-idx.npy", "indices_dtype": "int32", "num_edges": int(a_ptr[-1]),
                   "edge_offset": 0}]
    manifest = {"format": "diskflow-store", "version": 1, "num_nodes": n, "num_edges": int(a_ptr[-1]),
                "num_classes": 0, "topology": None,
                "features": {"dtype": dtype, "dim": table_dim, "row_bytes": table_dim * dt.itemsize,
                             "shard_rows": shard_rows, "shards": shards},
                "hetero": {"node_types": node_types, "edge_types": edge_types, "target": "paper"}}
    # institutions first: the rules' order is not the chain's
    rules = [Rule(name, derived[name][0], *files[name], tuple(derived[name]))  # type: ignore[arg-type]
             for name in ("institution", "author")]
    return TypedStore(root, manifest, rules, expected, table)


def read_table(store: TypedStore) -> np.ndarray:
    """The feature table as it is on disk now."""
    return np.concatenate([np.load(store.path / s["path"]) for s in store.manifest["features"]["shards"]])
