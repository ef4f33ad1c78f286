"""Memory tiers from byte budgets: how many rows the GPU and CPU tiers hold, and which rows.

Budgets are bytes given by the user (`--gpu-memory`, `--cpu-memory`), never row counts.
The GPU tier is static for the round: the hottest rows by access count. The CPU budget is
the whole host memory for features on the training machine, so the staging buffers for
the batches in flight (sized from the largest sampled batch) are reserved out of it first.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import ConfigError
from .files import format_bytes

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class TierSizes:
    """Rows per tier and the bytes they stand for."""

    gpu_rows: int
    cpu_rows: int
    staging_bytes: int
    row_bytes: int

    @property
    def gpu_bytes(self) -> int:
        return self.gpu_rows * self.row_bytes

    @property
    def cpu_bytes(self) -> int:
        return self.cpu_rows * self.row_bytes


def tier_sizes(gpu_budget: int, cpu_budget: int, row_bytes: int, num_nodes: int, device: str,
               max_batch_rows: int, staging_batches: int) -> TierSizes:
    """Turn byte budgets into tier row counts, or fail naming the option that cannot work.

    Args:
        gpu_budget: bytes of GPU memory for the static GPU tier (0 on a CPU-only run).
        cpu_budget: bytes of host memory for features: CPU tier + staging of in-flight batches.
        row_bytes: bytes of one feature row.
        num_nodes: rows in the dataset (no tier needs more).
        device: the training device, "cpu" or "cuda".
        max_batch_rows: the largest minibatch's node count in the round.
        staging_batches: batches whose rows are staged at once (loading, queued, training).
    """
    if device not in DEVICES:
        raise ConfigError("--device", f"expected one of {', '.join(DEVICES)}, got {device!r}")
    if gpu_budget < 0 or cpu_budget < 0:
        raise ConfigError("--gpu-memory/--cpu-memory", "budgets must be >= 0")
    if device == "cpu" and gpu_budget > 0:
        raise ConfigError("--gpu-memory", f"a GPU tier of {format_bytes(gpu_budget)} was asked for on a CPU-only run "
                          "(--device cpu); use --gpu-memory 0 or train with --device cuda")
    if staging_batches < 1:
        raise ConfigError("--staging-batches", f"must be >= 1, got {staging_batches}")
    staging = staging_batches * max_batch_rows * row_bytes
    if cpu_budget < staging:
        raise ConfigError("--cpu-memory", f"{format_bytes(cpu_budget)} cannot hold the staging buffers of "
                          f"{staging_batches} batches of up to {max_batch_rows:,} rows ({format_bytes(staging)}); "
                          f"give at least {format_bytes(staging)} or use smaller batches/fanouts")
    gpu_rows = min(num_nodes, gpu_budget // row_bytes)
    cpu_rows = min(num_nodes - gpu_rows, (cpu_budget - staging) // row_bytes)
    return TierSizes(int(gpu_rows), int(cpu_rows), int(staging), int(row_bytes))


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


def in_flight_batches(queue_depth: int, sequential: bool = False) -> int:
    """Batches whose rows can be in host memory at once, the unit of the staging reserve.

    Pipelined: the staging buffers of the batch being loaded, the ``queue_depth`` loaded ones
    queued and the one being assembled (``queue_depth + 2``), plus the assembled batches: the
    one being assembled, ``queue_depth`` queued, the one training, and the previous one the
    training loop still holds while it fetches the next (``queue_depth + 3``). Sequential:
    one staging buffer, the batch training and the previous one (3).
    """
    return 3 if sequential else 2 * queue_depth + 5
