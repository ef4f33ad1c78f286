"""MinHash node reordering for disk-cache files (DiskGNN Algorithm 1) and a page counter to judge it.

A disk-cache file holds one feature row per node; a batch reads the rows it needs with
page-merged reads, so the I/O a batch costs is the number of distinct 4 KiB pages its rows
fall in. Rows needed by the same batches should therefore sit next to each other. MinHash
finds them cheaply: every batch gets `k` random permutation values, a node's signature is,
per hash function, the smallest value over the batches that access it, and sorting nodes by
their signature tuple groups nodes whose batch sets are similar (two sets share a MinHash
value with probability equal to their Jaccard similarity). Everything here is vectorised:
one sort of the access pairs, one `minimum.reduceat`, one `lexsort`.
"""
from __future__ import annotations

import numpy as np

from ...errors import ConfigError

__all__ = ["PAGE", "batch_hashes", "minhash_order", "order_by_signature", "pages_touched"]

PAGE = 4096


def batch_hashes(num_batches: int, k: int = 2, seed: int = 0) -> np.ndarray:
    """The `k` MinHash values of every batch: row h is a random permutation of `0..num_batches-1`.

    Drawn from `np.random.default_rng(seed)`, so a layout is reproducible from its seed. Only
    the relative order of the values matters, so restricting these global permutations to the
    batches of one segment gives that segment an equally random permutation.

    Returns:
        int64 array of shape `[k, num_batches]`.
    """
    if k < 1:
        raise ConfigError("minhash_k", f"the number of MinHash functions must be >= 1, got {k}")
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(num_batches) for _ in range(k)]).astype(np.int64, copy=False)


def order_by_signature(signatures: np.ndarray, nodes: np.ndarray,
                       segment: np.ndarray | None = None) -> np.ndarray:
    """Indices that sort nodes by (segment, signature tuple lexicographically, node id).

    Args:
        signatures: `[k, m]` MinHash values, row 0 the most significant.
        nodes: the `m` node ids, the final tie-break (keeps the order deterministic).
        segment: optional `[m]` segment of each node, the most significant key.
    """
    keys: list[np.ndarray] = [nodes]
    keys.extend(signatures[h] for h in reversed(range(signatures.shape[0])))
    if segment is not None:
        keys.append(segment)
    return np.lexsort(tuple(keys))


def minhash_order(batch_ids_of_access: np.ndarray, node_of_access: np.ndarray, nodes: np.ndarray,
                  num_batches: int, k: int = 2, seed: int = 0) -> np.ndarray:
    """`nodes` permuted into MinHash order (Algorithm 1), so co-accessed rows share pages.

    Args:
        batch_ids_of_access: int batch id (in `[0, num_batches)`) of every access pair.
        node_of_access: node id of every access pair; pairs whose node is not in `nodes` are ignored.
        nodes: the node ids to order (the rows of one disk-cache file), unique.
        num_batches: the number of batches the permutations run over.
        k: the number of hash functions (2 is DiskGNN's default).
        seed: seed of the permutations.

    Returns:
        `nodes` (int64) in file order. Nodes without any access sort last, by id.
    """
    nodes = np.asarray(nodes, dtype=np.int64)
    batch = np.asarray(batch_ids_of_access, dtype=np.int64)
    node = np.asarray(node_of_access, dtype=np.int64)
    if batch.shape != node.shape:
        raise ValueError(f"batch and node arrays of the accesses differ in shape: {batch.shape} vs {node.shape}")
    if batch.size and (batch.min() < 0 or batch.max() >= num_batches):
        raise ValueError(f"batch ids of the accesses must lie in [0, {num_batches})")
    hashes = batch_hashes(num_batches, k, seed)
    sig = np.full((k, nodes.shape[0]), num_batches, dtype=np.int64)   # larger than any hash value
    if node.size and nodes.size:
        by_id = np.argsort(nodes, kind="stable")
        sorted_ids = nodes[by_id]
        slot = np.minimum(np.searchsorted(sorted_ids, node), sorted_ids.shape[0] - 1)
        found = sorted_ids[slot] == node
        pos, b = by_id[slot[found]], batch[found]
        if pos.size:
            order = np.argsort(pos, kind="stable")
            pos, b = pos[order], b[order]
            starts = np.flatnonzero(np.r_[True, pos[1:] != pos[:-1]])
            sig[:, pos[starts]] = np.minimum.reduceat(hashes[:, b], starts, axis=1)
    return nodes[order_by_signature(sig, nodes)]


def pages_touched(batch_rows: list[np.ndarray] | tuple[np.ndarray, np.ndarray], row_bytes: int,
                  page: int = PAGE) -> int:
    """Total distinct pages read when every batch reads its rows of a file with page-merged reads.

    Row `r` occupies bytes `[r * row_bytes, (r + 1) * row_bytes)` of the file's data (which
    starts on a page boundary), so it touches one page or, when it straddles a boundary or is
    larger than a page, several. A page is counted once per batch that needs it.

    Args:
        batch_rows: either one array of row indices per batch, or a pair `(batch_ids, rows)`
            of flat arrays.
        row_bytes: bytes per row.
        page: the page (read unit) in bytes.
    """
    if row_bytes < 1 or page < 1:
        raise ValueError(f"row_bytes and page must be >= 1, got {row_bytes} and {page}")
    if isinstance(batch_rows, tuple):
        batch = np.asarray(batch_rows[0], dtype=np.int64)
        rows = np.asarray(batch_rows[1], dtype=np.int64)
    else:
        lens = np.fromiter((len(r) for r in batch_rows), dtype=np.int64, count=len(batch_rows))
        batch = np.repeat(np.arange(len(batch_rows), dtype=np.int64), lens)
        rows = (np.concatenate([np.asarray(r, dtype=np.int64) for r in batch_rows])
                if len(batch_rows) else np.empty(0, dtype=np.int64))
    if rows.size == 0:
        return 0
    first = rows * row_bytes // page
    last = ((rows + 1) * row_bytes - 1) // page
    # Shift each batch into its own page range so intervals of different batches never merge,
    # then count the union of all [first, last] page intervals in one pass.
    span = int(last.max()) + 2
    base = (batch - batch.min()) * span
    first, last = first + base, last + base
    order = np.lexsort((last, first))
    first, last = first[order], last[order]
    reach = np.maximum.accumulate(last)                     # furthest page covered so far
    covered_before = np.r_[first[0] - 1, reach[:-1]]
    new_pages = last - np.maximum(covered_before, first - 1)
    return int(np.maximum(new_pages, 0).sum())
