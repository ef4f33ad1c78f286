"""The tiers a `PackedLoader` holds, as the packed dataset gives them: the GPU tier (on the device), the CPU
tier's rows (pinned on CUDA, or the shared tier's), the check of a saved CPU tier or a followed directory against
them, and, with a shared tier, each batch's number in the merged stream it takes its turn in.

The CPU tier is state (each batch's rows depend on every earlier batch's inserts); the loader
keeps it and its position, and these functions only make and check its memory.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...errors import InputError
from ..formats.packed import PackedDataset

__all__ = ["check_follows", "check_saved_tier", "cpu_tier", "gpu_tier", "stream_batches"]


def gpu_tier(ds: PackedDataset, device: torch.device) -> Any:
    """The GPU tier's rows: a device tensor on CUDA (synchronized: the assemble stage reads it from its own
    stream), else the array."""
    gpu = np.array(ds.gpu_cache)
    if device.type != "cuda":
        return gpu
    out = torch.from_numpy(gpu).to(device)
    torch.cuda.synchronize(device)
    return out


def cpu_tier(ds: PackedDataset, device: torch.device, shared: Any) -> np.ndarray:
    """Memory for the CPU tier's rows [C, dim], not filled: the shared tier's (checked against the dataset's),
    pinned host memory on CUDA, else an array."""
    c, dim, dtype = ds.cpu_ids.shape[0], ds.dim, ds.dtype
    if shared is not None:
        if shared.rows.shape != (c, dim) or shared.rows.dtype != dtype:
            raise InputError(ds.path, f"the shared CPU tier holds {shared.rows.dtype}{list(shared.rows.shape)}, "
                                      f"the dataset's is {dtype}[{c}, {dim}]")
        return shared.rows
    if device.type == "cuda":
        tdtype = torch.from_numpy(np.zeros(0, dtype)).dtype
        return torch.empty((c, dim), dtype=tdtype, pin_memory=True).numpy()
    return np.empty((c, dim), dtype=dtype)


def check_saved_tier(path: Path, cpu: np.ndarray, cpu_ids: np.ndarray, rows: np.ndarray, ids: np.ndarray | None,
                     position: int, num_batches: int) -> np.ndarray:
    """Refuse a saved CPU tier (`rows`, `ids`, at `position`) that does not fit the loader's (`cpu`, `cpu_ids`)
    or a round of `num_batches` (an InputError naming the dataset at `path`); its ids once checked."""
    if rows.shape != cpu.shape or rows.dtype != cpu.dtype or ids is None or ids.shape != cpu_ids.shape:
        raise InputError(path, f"saved CPU tier {rows.dtype}{list(rows.shape)} does not fit this dataset's "
                               f"{cpu.dtype}{list(cpu.shape)}")
    if not 0 <= position <= num_batches:
        raise InputError(path, f"saved CPU tier position {position} is outside the round")
    return ids


def check_follows(ds: PackedDataset, mine: PackedDataset, cpu_ids: np.ndarray, tier_next: int) -> None:
    """Refuse a streamed directory `ds` that a loader on `mine` (its CPU tier's `cpu_ids`, standing before batch
    `tier_next`) cannot go on with: other features or tiers, or a first batch other than `tier_next`."""
    shape = (ds.dtype, ds.dim, ds.num_shards, ds.num_nodes, ds.gpu_ids.shape[0], ds.cpu_ids.shape[0])
    have = (mine.dtype, mine.dim, mine.num_shards, mine.num_nodes, mine.gpu_ids.shape[0], cpu_ids.shape[0])
    if shape != have:
        raise InputError(ds.path, f"(dtype, dim, shards, nodes, GPU rows, CPU rows) {shape} differ from the "
                                  f"loader's {have}")
    first = min((s.first_batch for s in ds.superbatches), default=tier_next)
    if first != tier_next:
        raise InputError(ds.path, f"starts at batch {first}, but the CPU tier stands before batch {tier_next}")


def stream_batches(ds: PackedDataset) -> dict[int, int]:
    """A streamed superbatch's batches -> their numbers in the merged stream of every GPU worker
    (``stream.global_batches``; empty when the manifest has none)."""
    order = (ds.manifest.get("stream") or {}).get("global_batches")
    if not order:
        return {}
    sb = min(ds.superbatches, key=lambda s: s.first_batch)
    return {sb.first_batch + j: int(g) for j, g in enumerate(order)}
