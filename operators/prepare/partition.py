"""Min-cut graph partitioning of a store's topology, for partition-based batches (OUTRE §4.2).

Training nodes grouped by min-cut parts share much of their sampled neighbourhoods, so a batch
built from a few parts reads fewer distinct feature rows than one drawn at random. The
partitioner is a well-kept library, not ours: KaMinPar (the default; shared-memory multilevel,
about 12x faster than METIS at the same edge cut on our synthetic graphs: 5.0 s against 60 s
for 1M nodes and 7.4M edges into 1,000 parts, cut 6.00M against 5.95M edges) or METIS through
pymetis. Both need an undirected graph without self loops or repeated edges, which
`undirected_adjacency` builds from the store's CSC (by destination) in one sort.

Memory: the undirected adjacency takes 8 bytes per node and 16 bytes per stored edge (both
directions, before the repeats go), plus the sort's copy; KaMinPar reads it from a ParHIP file
(8 bytes per entry) and holds its own multilevel hierarchy, about as much again.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from ...errors import ConfigError
from ..options import BATCH_SIZE

__all__ = ["PARTITIONERS", "PARTS_PER_BATCH", "default_parts", "edge_cut", "partition_graph",
           "undirected_adjacency"]

PARTITIONERS = ("kaminpar", "metis")
PARTS_PER_BATCH = 8     # automatic partitions: a batch's worth of training nodes spans eight parts (128
                        # training nodes per part at batch size 1024; OUTRE's 10,000 parts of papers100M's
                        # 1.2M training nodes hold about 120 each)


def default_parts(num_train: int, num_nodes: int, partitions: int | None = None, batch_size: int = BATCH_SIZE) -> int:
    """The parts of a partition: `partitions` if given, else one per ``batch_size / PARTS_PER_BATCH``
    training nodes; at least 2 and at most the graph's nodes.

    The part size follows the batch, not a fixed count of training nodes: groups of parts are dealt into
    consecutive batches, so with parts of a whole batch each (one per 128 training nodes at batches of 128)
    a group of 20 parts fills 20 batches in a row from one region of the graph, and SGD follows that region
    (on a 2M-node graph of 20 classes, 10 epochs of 63 batches of 128: 63 parts, belady_outre 7.4 points
    below in-memory training over two seeds; 500 parts, 1.8 over three, for the same bytes;
    docs/benchmarks.md). Eight parts per batch keeps a group to 2.5 batches, as at batches of 1024.
    """
    per_part = max(1, int(batch_size) // PARTS_PER_BATCH)
    want = int(partitions) if partitions is not None else -(-int(num_train) // per_part)
    return max(2, min(want, int(num_nodes)))


def undirected_adjacency(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR (xadj int64 [N+1], adjncy int64) of the graph with every edge in both directions, sorted,
    without self loops or repeats: what METIS-style partitioners take."""
    n = int(indptr.shape[0]) - 1
    if n < 1:
        raise ConfigError("partitions", "the store has no nodes to partition")
    degrees = np.diff(np.asarray(indptr, dtype=np.int64)).astype(np.int64)
    dst = np.repeat(np.arange(n, dtype=np.int64), degrees)
    src = np.asarray(indices, dtype=np.int64)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    keys = np.concatenate([src * n + dst, dst * n + src])
    del src, dst, keep
    keys.sort()
    if keys.shape[0]:
        first = np.empty(keys.shape[0], dtype=bool)
        first[0] = True
        np.not_equal(keys[1:], keys[:-1], out=first[1:])
        keys = keys[first]
    rows = keys // n
    xadj = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=xadj[1:])
    del rows
    keys %= n
    return xadj, keys


def edge_cut(xadj: np.ndarray, adjncy: np.ndarray, parts: np.ndarray) -> int:
    """Undirected edges whose ends lie in different parts."""
    rows = np.repeat(np.arange(xadj.shape[0] - 1, dtype=np.int64), np.diff(xadj))
    return int(np.count_nonzero(parts[rows] != parts[adjncy])) // 2


def partition_graph(xadj: np.ndarray, adjncy: np.ndarray, parts: int, *, method: str = "kaminpar",
                    seed: int = 0, threads: int = 1, scratch: str | os.PathLike[str] | None = None,
                    imbalance: float = 0.03) -> np.ndarray:
    """The part (int32, 0..parts-1) of every node of the undirected graph (`undirected_adjacency`).

    Args:
        parts: how many parts (2 or more, at most the number of nodes).
        method: ``"kaminpar"`` or ``"metis"``.
        seed: the partitioner's random seed; with ``threads=1`` the same inputs give the same parts.
        threads: KaMinPar's threads (more is faster; results may then differ run to run).
        scratch: a directory for KaMinPar's input file (it reads graphs from files only); removed after.
        imbalance: allowed part-size excess over the average (KaMinPar's epsilon; METIS's default is 3%).
    """
    n = int(xadj.shape[0]) - 1
    if method not in PARTITIONERS:
        raise ConfigError("partitioner", f"expected one of {', '.join(PARTITIONERS)}, got {method!r}")
    if not 2 <= parts <= n:
        raise ConfigError("partitions", f"expected 2 to {n:,} parts (the store's nodes), got {parts:,}")
    if threads < 1:
        raise ConfigError("partition_threads", f"must be >= 1, got {threads}")
    if method == "metis":
        import pymetis

        _, membership = pymetis.part_graph(parts, pymetis.CSRAdjacency(xadj, adjncy),
                                           options=pymetis.Options(seed=int(seed)))
        return np.asarray(membership, dtype=np.int32)
    import kaminpar

    fd, name = tempfile.mkstemp(suffix=".parhip", dir=None if scratch is None else os.fspath(scratch))
    try:
        with os.fdopen(fd, "wb") as f:
            _write_parhip(f, xadj, adjncy)
        graph = kaminpar.load_graph(name, kaminpar.GraphFileFormat.PARHIP)
    finally:
        Path(name).unlink(missing_ok=True)
    kaminpar.reseed(int(seed))
    solver = kaminpar.KaMinPar(int(threads), kaminpar.default_context())
    return np.asarray(solver.compute_partition(graph, int(parts), float(imbalance)), dtype=np.int32)


def _write_parhip(f, xadj: np.ndarray, adjncy: np.ndarray) -> None:
    """The ParHIP binary format KaMinPar reads: version 3 (no weights, 64-bit ids), n, m, then the
    n+1 neighbourhood starts as byte offsets into the file, then the neighbours."""
    n, m = int(xadj.shape[0]) - 1, int(adjncy.shape[0])
    header = np.array([3, n, m], dtype=np.uint64)
    header.tofile(f)
    base = header.nbytes + (n + 1) * 8
    (xadj.astype(np.uint64) * np.uint64(8) + np.uint64(base)).tofile(f)
    adjncy.astype(np.uint64, copy=False).tofile(f)
