"""Segmented disk-cache layout: which disk misses go to which segment's cache file, and at which row.

Given a round's misses (per batch, the node ids whose rows must come from disk) and the disk
budget, `build_layout` chooses the segment size (`search.search_trace`, Algorithm 2) and
places every miss: a node missed by >= 2 batches of its segment lives once in that segment's
cache file, in MinHash order (`reorder`, Algorithm 1); every other miss is packed into its
batch's own contiguous chunk. The layout is ids only; packing writes the rows it names.
All placement is vectorised over the access pairs (one sort, group reductions, a lexsort).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .reorder import PAGE, batch_hashes, order_by_signature, pages_touched
from .search import MissTrace, SegmentSearch, search_trace

__all__ = ["DiskCacheLayout", "build_layout", "read_amplification"]


@dataclass
class DiskCacheLayout:
    """Where each disk miss of a round is stored.

    Attributes:
        segment_size: batches per segment; None when every miss is packed (no disk cache).
        segment_of_batch: int64 `[n]` segment of each batch (`batch // segment_size`);
            all -1 when `segment_size` is None.
        cache_nodes: per segment, the node ids of its cache file in file (MinHash) order;
            empty list when `segment_size` is None.
        in_cache: per batch, bool per miss (in the batch's miss order): stored in the cache.
        row: per batch, int64 per miss: its row in the segment's cache file when `in_cache`,
            else its index among the batch's packed rows (packed rows keep miss order).
        disk_bytes: total bytes of packed chunks and cache files, padding included.
        search: the segment-size search that chose this layout.
    """

    segment_size: int | None
    segment_of_batch: np.ndarray
    cache_nodes: list[np.ndarray]
    in_cache: list[np.ndarray]
    row: list[np.ndarray]
    disk_bytes: int
    search: SegmentSearch | None = None

    def packed_nodes(self, misses: list[np.ndarray], batch: int) -> np.ndarray:
        """The node ids of `batch`'s packed chunk, in row order (its misses not in the cache)."""
        return np.asarray(misses[batch], dtype=np.int64)[~self.in_cache[batch]]


def _split(flat: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    return np.split(flat, offsets[1:-1]) if offsets.shape[0] > 1 else []


def build_layout(misses: list[np.ndarray], row_bytes: int, disk_budget: int, pad_bytes_per_batch: int = 0,
                 k: int = 2, seed: int = 0) -> DiskCacheLayout:
    """Lay out a round's disk misses under `disk_budget` (packed only, or segmented disk caches).

    Args:
        misses: per batch, int node ids unique within the batch, whose rows come from disk.
        row_bytes: bytes of one feature row.
        disk_budget: bytes the packed data of this round may take.
        pad_bytes_per_batch: bound on the alignment padding of one batch's packed chunk.
        k: MinHash functions for ordering the cache files.
        seed: seed of the MinHash permutations.

    Returns:
        The layout; `disk_bytes <= disk_budget`.

    Raises:
        ConfigError: (`disk_budget`) the budget is below the smallest workable layout.
    """
    trace = MissTrace(misses)
    found = search_trace(trace, row_bytes, disk_budget, pad_bytes_per_batch)
    n, m = trace.num_batches, trace.num_misses
    s = found.segment_size
    if s is None:
        return DiskCacheLayout(
            segment_size=None, segment_of_batch=np.full(n, -1, dtype=np.int64), cache_nodes=[],
            in_cache=_split(np.zeros(m, dtype=bool), trace.offsets),
            row=_split(np.arange(m, dtype=np.int64) - np.repeat(trace.offsets[:-1], trace.counts), trace.offsets),
            disk_bytes=found.actual_bytes, search=found)

    num_segments = -(-n // s)
    starts, sizes, gseg = trace.groups(s)
    cached = sizes >= 2
    # Algorithm 1 per segment, all segments at once: a group's signature is the min of its
    # batches' hash values; sort cache groups by (segment, signature, node).
    hashes = batch_hashes(n, k, seed)
    sig = np.minimum.reduceat(hashes[:, trace.batch], starts, axis=1)[:, cached] if m else hashes[:, :0]
    cnode, cseg = trace.node[starts[cached]], gseg[cached]
    order = order_by_signature(sig, cnode, cseg)
    per_segment = np.bincount(cseg, minlength=num_segments).astype(np.int64)
    seg_offsets = np.r_[0, np.cumsum(per_segment)].astype(np.int64)
    cache_row = np.empty(order.shape[0], dtype=np.int64)
    cache_row[order] = np.arange(order.shape[0], dtype=np.int64) - seg_offsets[cseg[order]]

    # Per access pair (sorted order): its group, then whether and where it is cached.
    group_of_pair = np.repeat(np.arange(starts.shape[0], dtype=np.int64), sizes)
    row_of_group = np.full(starts.shape[0], -1, dtype=np.int64)
    row_of_group[cached] = cache_row
    in_cache_flat = np.empty(m, dtype=bool)
    in_cache_flat[trace.position] = cached[group_of_pair]
    row_flat = np.empty(m, dtype=np.int64)
    row_flat[trace.position] = row_of_group[group_of_pair]
    # Packed misses are numbered in miss order within their batch.
    packed_before = np.r_[0, np.cumsum(~in_cache_flat)].astype(np.int64)
    batch_flat = np.repeat(np.arange(n, dtype=np.int64), trace.counts)
    packed_row = packed_before[:-1] - packed_before[trace.offsets[:-1]][batch_flat]
    row_flat = np.where(in_cache_flat, row_flat, packed_row)

    return DiskCacheLayout(
        segment_size=s, segment_of_batch=np.arange(n, dtype=np.int64) // s,
        cache_nodes=np.split(cnode[order], seg_offsets[1:-1]),
        in_cache=_split(in_cache_flat, trace.offsets), row=_split(row_flat, trace.offsets),
        disk_bytes=found.actual_bytes, search=found)


def read_amplification(layout: DiskCacheLayout, row_bytes: int) -> float:
    """Bytes read (whole 4 KiB pages) over useful bytes (misses x row_bytes) for one round.

    A batch's packed rows are one contiguous read (`ceil(rows x row_bytes / 4096)` pages); its
    cache rows are read page-merged from its segment's file (`pages_touched`). A round with no
    misses reads nothing and has amplification 1.0.
    """
    counts = np.fromiter((c.shape[0] for c in layout.in_cache), dtype=np.int64, count=len(layout.in_cache))
    useful = int(counts.sum()) * row_bytes
    if useful == 0:
        return 1.0
    in_cache = np.concatenate(layout.in_cache)
    rows = np.concatenate(layout.row)
    batch = np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)
    packed_per_batch = counts - np.bincount(batch[in_cache], minlength=counts.shape[0])
    packed_pages = int((-(-(packed_per_batch * row_bytes) // PAGE)).sum())
    cache_pages = pages_touched((batch[in_cache], rows[in_cache]), row_bytes, PAGE)
    return (packed_pages + cache_pages) * PAGE / useful
