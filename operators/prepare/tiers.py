"""Memory tiers from byte budgets: how many rows the GPU and CPU tiers hold, and which rows.

Budgets are bytes given by the user (`--gpu-memory`, `--cpu-memory`), never row counts.
The GPU tier is static for the round: the hottest rows by access count. The CPU budget is
the whole host memory for features on the training machine: the CPU tier, the staging
buffers through which the load stage passes a batch's disk rows (its packed misses, its
disk-cache and store rows, in pieces of at most `STAGING_PIECE_BYTES`, or the round's ``staging_piece``)
and the loader's I/O buffers. Staging and I/O buffers are reserved out of it first; the CPU tier gets the rest.

The assembled batches (each batch's whole feature matrix, ``n_id`` rows) are not features
held for later: they are the input of one training step, in device memory on a GPU, and
belong to the training process's own working set (`trainbuffers.assembled_batches`), not to this budget.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError, Setting
from ...native.constants import ALIGN
from ..formats.sizes import format_bytes, parse_bytes
from ..trainbuffers import fitting_queue_depth, staging_count

__all__ = ["DEVICES", "MIN_STAGING_PIECE", "STAGING_PIECE_BYTES", "Sampling", "TierSizes", "batch_rows_bound",
           "check_staging_piece", "fitting_settings", "hottest", "staging_piece_bytes", "staging_rows_fit",
           "tier_sizes"]

DEVICES = ("cpu", "cuda")
# The most row bytes one staging buffer carries: a larger batch is loaded in several pieces, so
# the staging reserve does not grow with the batch (4 pieces at queue depth 2: 128 MiB). A round may
# cap its pieces lower (``staging_piece``): more of a small budget goes to the CPU tier, at the price of
# more, shorter reads per batch (docs/design.md, "The pipelined trainer").
STAGING_PIECE_BYTES = 32 << 20
MIN_STAGING_PIECE = 64 << 10    # the smallest cap taken: 16 pages (a buffer holds at least one row whatever the cap)


def check_staging_piece(piece: object, option: str = "staging_piece") -> int:
    """`piece` (bytes, or a size such as ``"8MiB"``) as an int cap on a staging buffer's row bytes; a ConfigError
    naming `option` unless it is at least `MIN_STAGING_PIECE` bytes."""
    if isinstance(piece, str):
        piece = parse_bytes(piece, option)
    if isinstance(piece, bool) or not isinstance(piece, (int, np.integer)) or piece < MIN_STAGING_PIECE:
        raise ConfigError(option, f"must be at least {format_bytes(MIN_STAGING_PIECE)} ({MIN_STAGING_PIECE:,} "
                                  f"bytes), got {piece!r}")
    return int(piece)


@dataclass(frozen=True)
class TierSizes:
    """Rows per tier and the bytes they stand for."""

    gpu_rows: int
    cpu_rows: int
    staging_bytes: int
    row_bytes: int
    cpu_budget: int = 0         # the CPU budget the tiers were sized in (a default raised to what works: more)

    @property
    def gpu_bytes(self) -> int:
        return self.gpu_rows * self.row_bytes

    @property
    def cpu_bytes(self) -> int:
        return self.cpu_rows * self.row_bytes


def tier_sizes(gpu_budget: int, cpu_budget: int, row_bytes: int, num_nodes: int, device: str,
               max_batch_rows: int, staging_batches: int, num_shards: int = 0, io_reserve: int = 0, *,
               sampling: Sampling | None = None, raise_cpu: bool = False,
               piece: int = STAGING_PIECE_BYTES) -> TierSizes:
    """Turn byte budgets into tier row counts, or fail naming the option and the smallest budget that works,
    and the one setting that, changed alone, would make the given budget work (`fitting_settings`).

    Args:
        gpu_budget: bytes of GPU memory for the static GPU tier (0 on a CPU-only run).
        cpu_budget: bytes of host memory for features: CPU tier + staging + `io_reserve`.
        row_bytes: bytes of one feature row.
        num_nodes: rows in the dataset (no tier needs more).
        device: the training device, "cpu" or "cuda".
        max_batch_rows: the largest minibatch's node count in the round.
        staging_batches: staging buffers the trainer keeps in flight (`staging_buffers`).
        num_shards: feature shards (a staging buffer has room for one segment's padding per shard).
        io_reserve: the loader's other I/O buffers (`load.io_buffer_bytes`), reserved too.
        sampling: the batch size and fanouts the batches were sampled with (what the refusal can name
            a smaller value of), and the store's node count.
        raise_cpu: `cpu_budget` is a default, not the user's: one too small is raised to the smallest
            that works (an empty CPU tier) instead of refused.
        piece: the most row bytes one staging buffer carries (`staging_piece_bytes`).
    """
    if device not in DEVICES:
        raise ConfigError("device", f"expected one of {', '.join(DEVICES)}, got {device!r}")
    for option, nbytes in (("gpu_memory", gpu_budget), ("cpu_memory", cpu_budget)):
        if nbytes < 0:
            raise ConfigError(option, f"must be >= 0 bytes, got {nbytes}")
    if device == "cpu" and gpu_budget > 0:
        raise ConfigError("gpu_memory", f"a GPU tier of {format_bytes(gpu_budget)} was asked for on a CPU-only run "
                          "(device='cpu'); use gpu_memory=0 or train with device='cuda'")
    if staging_batches < 1:
        raise ConfigError("staging_batches", f"must be >= 1, got {staging_batches}")
    staging = staging_batches * staging_piece_bytes(max_batch_rows, row_bytes, num_shards, piece)
    need = staging + io_reserve
    if cpu_budget < need and raise_cpu:
        cpu_budget = need
    if cpu_budget < need:
        choices = fitting_settings(cpu_budget, row_bytes, max_batch_rows, staging_batches, num_shards, io_reserve,
                                   device, sampling, piece)
        raise ConfigError("cpu_memory", f"{format_bytes(cpu_budget)} cannot hold the trainer's staging buffers "
                          f"({staging_batches} x {format_bytes(staging // staging_batches)} for batches of up to "
                          f"{max_batch_rows:,} rows = {format_bytes(staging)}) and I/O buffers "
                          f"({format_bytes(io_reserve)}); the smallest budget that works is {format_bytes(need)} "
                          f"({need:,} bytes, with an empty CPU tier); {{choices}} would fit {format_bytes(cpu_budget)}",
                          choices=choices, no_choice="no smaller batch size, fanouts or queue depth alone")
    gpu_rows = min(num_nodes, gpu_budget // row_bytes)
    cpu_rows = min(num_nodes - gpu_rows, (cpu_budget - need) // row_bytes)
    return TierSizes(int(gpu_rows), int(cpu_rows), int(staging), int(row_bytes), int(cpu_budget))


@dataclass(frozen=True)
class Sampling:
    """What the round's batches were sampled with, for naming a smaller batch size or fanouts that fit:
    seeds per batch, per-hop fanouts (-1: every neighbour) and the store's node count."""

    batch_size: int
    fanouts: tuple[int, ...]
    num_nodes: int
    margin: float = 1.0         # the staging is sized for the largest batch seen times this (a partial count)


def batch_rows_bound(batch_size: int, fanouts: Sequence[int], num_nodes: int) -> int:
    """The most distinct rows a batch of `batch_size` seeds can have at `fanouts`: every hop at full fanout
    from the nodes the previous hop added (the sampler's frontier), at most every node. A bound no sampled
    batch exceeds, so a budget that fits it fits the batches."""
    rows, frontier = batch_size, batch_size
    for f in fanouts:
        if f < 0:
            return num_nodes
        frontier *= f
        rows += frontier
        if rows >= num_nodes:
            return num_nodes
    return min(rows, num_nodes)


def staging_rows_fit(cpu_budget: int, row_bytes: int, staging_batches: int, num_shards: int, io_reserve: int,
                     piece: int = STAGING_PIECE_BYTES) -> int:
    """The most rows a batch may have for `staging_batches` staging buffers (`staging_piece_bytes`) and the
    I/O buffers to fit `cpu_budget`: `staging_piece_bytes` inverted. 0: not even one row fits; ``2**62``:
    any batch fits (a whole piece does: `piece` bytes, or one row where a row is wider)."""
    per = (cpu_budget - io_reserve) // max(1, staging_batches) - (num_shards + 2) * ALIGN
    if per < ALIGN:
        return 0
    room = per // ALIGN * ALIGN
    if room >= -(-max(piece, row_bytes) // ALIGN) * ALIGN:
        return 1 << 62
    return room // row_bytes


def fitting_settings(cpu_budget: int, row_bytes: int, max_batch_rows: int, staging_batches: int, num_shards: int,
                     io_reserve: int, device: str, sampling: Sampling | None,
                     piece: int = STAGING_PIECE_BYTES) -> list[Setting]:
    """The settings that, each changed alone, make `cpu_budget` hold the staging and I/O buffers (with an empty
    CPU tier), from the same model as `tier_sizes`: the queue depth (fewer staging buffers of the same size;
    `staging_batches` is `staging_buffers(queue depth)`, one more on CUDA), the largest batch size, and the
    largest cap on every hop's fanout, whose `batch_rows_bound` (times the sampling's margin) fits
    (`staging_rows_fit`; binary searches over that bound). Empty when none does."""
    out: list[Setting] = []
    buffers = (cpu_budget - io_reserve) // staging_piece_bytes(max_batch_rows, row_bytes, num_shards, piece)
    depth = fitting_queue_depth(buffers, device, staging_batches - staging_count(device, 0))
    if depth is not None:
        out.append(Setting("queue_depth", depth))
    if sampling is None:
        return out
    limit = staging_rows_fit(cpu_budget, row_bytes, staging_batches, num_shards, io_reserve, piece)
    fans, n = tuple(int(f) for f in sampling.fanouts), sampling.num_nodes

    def fits(batch_size: int, fanouts: tuple[int, ...]) -> int | None:
        rows = batch_rows_bound(batch_size, fanouts, n)
        return rows if min(n, math.ceil(rows * sampling.margin)) <= limit else None

    def largest(lo: int, hi: int, ok: Callable[[int], int | None]) -> tuple[int, int] | None:
        """The largest x in [lo, hi] with ok(x) (ok monotone: true up to some x), and ok(x)."""
        if hi < lo or ok(lo) is None:
            return None
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if ok(mid) is None:
                hi = mid - 1
            else:
                lo = mid
        return lo, int(ok(lo) or 0)

    found = largest(1, sampling.batch_size - 1, lambda b: fits(b, fans))
    if found is not None:
        out.append(Setting("batch_size", found[0], f"at most {found[1]:,} rows a batch"))
    top = max((n if f < 0 else f) for f in fans) if fans else 0

    def capped(c: int) -> tuple[int, ...]:
        return tuple(c if f < 0 else min(f, c) for f in fans)

    found = largest(1, top - 1, lambda c: fits(sampling.batch_size, capped(c)))
    if found is not None:
        out.append(Setting("fanouts", capped(found[0]), f"at most {found[1]:,} rows a batch"))
    return out


def staging_piece_bytes(max_batch_rows: int, row_bytes: int, num_shards: int, piece: int = STAGING_PIECE_BYTES) -> int:
    """Bytes of one staging buffer: the disk rows of a batch of up to `max_batch_rows` rows, or a
    piece of at most `piece` bytes of them (at least one row), with room for each shard segment's page padding."""
    rows = min(max(piece, row_bytes), max(1, max_batch_rows) * row_bytes)
    return -(-rows // ALIGN) * ALIGN + (num_shards + 2) * ALIGN


def hottest(frequency: np.ndarray, rows: int, exclude: np.ndarray | None = None) -> np.ndarray:
    """The `rows` most accessed nodes (ties: lower id first), never-accessed nodes left out; int64 ids."""
    freq = np.asarray(frequency)
    if rows <= 0:
        return np.zeros(0, np.int64)
    cand = np.flatnonzero(freq > 0)
    if exclude is not None and len(exclude):
        cand = cand[~np.isin(cand, exclude)]
    if cand.shape[0] > rows:
        # stable sort on -count keeps ascending id order among equal counts
        cand = cand[np.argsort(-freq[cand], kind="stable")[:rows]]
    else:
        cand = cand[np.argsort(-freq[cand], kind="stable")]
    return cand.astype(np.int64)
