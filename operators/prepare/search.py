"""The segment size of the segmented disk cache (DiskGNN Algorithm 2), with a byte count that never lies.

After the GPU and CPU tiers are planned, each batch of a round keeps a list of misses that
must come from disk. Packing copies every miss into its batch's own chunk: reads stay
sequential, but a row missed by several batches is stored several times. When that
exceeds the disk budget, batches are cut into segments of `s` consecutive batches and every
node missed by >= 2 batches of a segment is stored once, in the segment's disk-cache file.

Bytes of a layout (the same accounting everywhere, so "fits the budget" means one thing):

- packed: `packed rows x row_bytes + num_batches x pad_bytes_per_batch` (the caller's bound
  on the 4096-byte alignment padding of a batch's packed chunk, charged to every batch);
- each segment's cache file: `cache rows x row_bytes` rounded up to a multiple of 4096
  (an empty cache has no file).

Algorithm 2 estimates the bytes for segment size `i` by extrapolating the first `i` batches:
`distinct misses of batches [0, i) x n / i x row_bytes` (plus the padding, which is known
exactly), and takes the first `i` whose estimate meets the budget. Because it is only an
estimate, the real layout of that `s` is then counted, and `s` grows until the real layout
fits. `s = n` (one segment) stores every distinct miss once and is the smallest layout up
to one page of padding; a budget below it is refused with the number that works.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError
from ..formats.sizes import format_bytes

__all__ = ["PAGE", "MissTrace", "SegmentSearch", "packed_bytes", "search_segment_size", "search_trace"]

PAGE = 4096


@dataclass
class SegmentSearch:
    """Outcome of the segment-size search.

    Attributes:
        segment_size: batches per segment, or None when packing every miss fits the budget.
        estimated_bytes: Algorithm 2's extrapolated bytes for the first acceptable size
            (equal to `packed_only_bytes` when packing fits).
        actual_bytes: the real bytes of the chosen layout (padding included); <= disk_budget.
        packed_only_bytes: the bytes of packing every miss.
        disk_budget: the budget searched against.
    """

    segment_size: int | None
    estimated_bytes: int
    actual_bytes: int
    packed_only_bytes: int
    disk_budget: int


def packed_bytes(miss_counts_per_batch: np.ndarray | list[int], row_bytes: int, pad_bytes_per_batch: int) -> int:
    """Bytes of packing every miss into its batch's chunk: rows plus each batch's padding bound."""
    counts = np.asarray(miss_counts_per_batch, dtype=np.int64)
    return int(counts.sum()) * int(row_bytes) + counts.shape[0] * int(pad_bytes_per_batch)


def _round_up(nbytes: np.ndarray, unit: int = PAGE) -> np.ndarray:
    return -(-nbytes // unit) * unit


class MissTrace:
    """A round's misses as flat access pairs sorted by (node, batch), ready for any segment size.

    Sorting once makes every segment size cheap to evaluate: within a node's run the batches
    ascend, so the (segment, node) groups of any `s` are contiguous runs of this order.

    Attributes:
        num_batches: batches in the round.
        counts: int64 `[num_batches]` misses per batch.
        offsets: int64 `[num_batches + 1]` start of each batch's misses in the flat (miss) order.
        node, batch: int64 `[M]` the access pairs in (node, batch) order.
        position: int64 `[M]` each sorted pair's index in the flat miss order.
        node_start: bool `[M]` True where a new node's run begins.
        first_batch: int64 `[U]` the first batch that misses each distinct node.
    """

    def __init__(self, misses: list[np.ndarray]) -> None:
        self.num_batches = len(misses)
        self.counts = np.fromiter((len(m) for m in misses), dtype=np.int64, count=self.num_batches)
        self.offsets = np.r_[0, np.cumsum(self.counts)].astype(np.int64)
        flat = (np.concatenate([np.asarray(m, dtype=np.int64).ravel() for m in misses])
                if self.num_batches else np.empty(0, dtype=np.int64))
        if flat.size and flat.min() < 0:
            raise ValueError("miss node ids must be >= 0")
        batch_flat = np.repeat(np.arange(self.num_batches, dtype=np.int64), self.counts)
        self.position = np.argsort(flat, kind="stable")      # stable: batches ascend within a node
        self.node = flat[self.position]
        self.batch = batch_flat[self.position]
        same_node = self.node[1:] == self.node[:-1]
        dup = np.flatnonzero(same_node & (self.batch[1:] == self.batch[:-1]))
        if dup.size:
            raise ValueError(f"misses of batch {int(self.batch[dup[0]])} list node "
                             f"{int(self.node[dup[0]])} twice; misses must be unique within a batch")
        self.node_start = np.r_[True, ~same_node] if flat.size else np.empty(0, dtype=bool)
        self.first_batch = self.batch[self.node_start]

    @property
    def num_misses(self) -> int:
        return int(self.node.shape[0])

    @property
    def num_distinct(self) -> int:
        return int(self.first_batch.shape[0])

    def groups(self, segment_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The (segment, node) groups of segment size `s`: start index (in sorted order), size, segment."""
        seg = self.batch // segment_size
        new = self.node_start.copy()
        new[1:] |= seg[1:] != seg[:-1]
        starts = np.flatnonzero(new)
        sizes = np.diff(np.r_[starts, self.num_misses])
        return starts, sizes, seg[starts]

    def layout_bytes(self, segment_size: int, row_bytes: int, pad_bytes_per_batch: int) -> int:
        """Real bytes of the segmented layout of size `segment_size` (see the module docstring)."""
        _, sizes, gseg = self.groups(segment_size)
        num_segments = -(-self.num_batches // segment_size)
        cache_rows = np.bincount(gseg[sizes >= 2], minlength=num_segments).astype(np.int64)
        cache = int(_round_up(cache_rows * row_bytes).sum())
        packed = int(np.count_nonzero(sizes == 1)) * row_bytes
        return cache + packed + self.num_batches * pad_bytes_per_batch

    def estimates(self, row_bytes: int, pad_bytes_per_batch: int) -> np.ndarray:
        """Algorithm 2's estimate for every `i` in `1..n` (index `i - 1`)."""
        n = self.num_batches
        seen = np.cumsum(np.bincount(self.first_batch, minlength=n)).astype(np.int64)  # |V_d| + |V_p|
        i = np.arange(1, n + 1, dtype=np.int64)
        q = seen * row_bytes
        # ceil(q * n / i) without forming q * n, which could overflow int64 on big rounds
        return (q // i) * n + -(-((q % i) * n) // i) + n * pad_bytes_per_batch


def _check(row_bytes: int, disk_budget: int, pad_bytes_per_batch: int) -> None:
    if row_bytes < 1:
        raise ValueError(f"row_bytes must be >= 1, got {row_bytes}")
    if pad_bytes_per_batch < 0:
        raise ValueError(f"pad_bytes_per_batch must be >= 0, got {pad_bytes_per_batch}")
    if disk_budget < 0:
        raise ConfigError("disk_budget", f"must be >= 0 bytes, got {disk_budget}")


def search_trace(trace: MissTrace, row_bytes: int, disk_budget: int, pad_bytes_per_batch: int = 0) -> SegmentSearch:
    """`search_segment_size` on an already-built `MissTrace` (so `build_layout` sorts only once)."""
    _check(row_bytes, disk_budget, pad_bytes_per_batch)
    n = trace.num_batches
    packed = packed_bytes(trace.counts, row_bytes, pad_bytes_per_batch)
    if packed <= disk_budget:
        return SegmentSearch(None, packed, packed, packed, disk_budget)
    smallest = trace.layout_bytes(n, row_bytes, pad_bytes_per_batch)
    if smallest > disk_budget:
        floor = trace.num_distinct * row_bytes + n * pad_bytes_per_batch
        raise ConfigError(
            "disk_budget",
            f"{disk_budget} bytes ({format_bytes(disk_budget)}) cannot hold this round's disk misses: "
            f"the smallest workable budget is {smallest} bytes ({format_bytes(smallest)}), one disk-cache "
            f"segment for the whole round; no layout fits below the {trace.num_distinct} distinct missed rows "
            f"({floor} bytes with padding); packing every miss needs {packed} bytes ({format_bytes(packed)})")
    est = trace.estimates(row_bytes, pad_bytes_per_batch)
    first = int(np.flatnonzero(est <= disk_budget)[0]) + 1     # exists: est[n-1] <= smallest <= budget
    # s = 1 is plain packing, which does not fit; s = n fits, so the loop ends by then.
    for s in range(max(first, 2), n + 1):
        actual = smallest if s == n else trace.layout_bytes(s, row_bytes, pad_bytes_per_batch)
        if actual <= disk_budget:
            return SegmentSearch(s, int(est[first - 1]), actual, packed, disk_budget)
    raise AssertionError("unreachable: the one-segment layout fits the budget")


def search_segment_size(misses: list[np.ndarray], row_bytes: int, disk_budget: int,
                        pad_bytes_per_batch: int = 0) -> SegmentSearch:
    """Choose the segment size for a round's misses under `disk_budget` (Algorithm 2, then verified).

    Args:
        misses: per batch, the node ids (unique within the batch) whose rows must come from disk.
        row_bytes: bytes of one feature row.
        disk_budget: the user's disk budget for this round's packed data, in bytes.
        pad_bytes_per_batch: bound on the alignment padding of one batch's packed chunk.

    Returns:
        The search outcome; `segment_size` is None when packing every miss fits, and
        `actual_bytes <= disk_budget` always.

    Raises:
        ConfigError: (`disk_budget`) no segment size fits; the message gives the smallest
            budget that does.
    """
    return search_trace(MissTrace(misses), row_bytes, disk_budget, pad_bytes_per_batch)
