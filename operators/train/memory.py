"""The memory a `PackedLoader` will use, computed from a packed dataset's manifest before anything is
allocated, and the check of it against the run's budgets.

Kept apart from the loader because the pipelines and the benchmarks size their budgets (memory
cgroups, ``--cpu-memory`` defaults) with the same figures without opening a loader: the staging
buffers (`staging_count` x `tiers.staging_piece_bytes`), the row-read bounce buffers
(`io_buffer_bytes`), the tiers and the assembled batch matrices (`memory_plan`).
"""
from __future__ import annotations

from typing import Any

import torch

from ...errors import ConfigError, Setting
from ...native.constants import DEFAULT_BOUNCE_BYTES
from ..formats.packed import PackedDataset
from ..formats.sizes import format_bytes
from ..prepare.tiers import STAGING_PIECE_BYTES, staging_piece_bytes
from ..trainbuffers import assembled_batches, fitting_queue_depth, staging_count

__all__ = ["check_memory", "fewer_buffers", "follow_plan", "io_buffer_bytes", "memory_plan"]


def io_buffer_bytes(row_reads: bool = True) -> int:
    """Host bytes of the loader's row-read bounce buffers (its own and the native reader's), when the
    dataset has rows read one by one (disk cache, Ginex store rows); none otherwise."""
    return 2 * DEFAULT_BOUNCE_BYTES if row_reads else 0


def memory_plan(ds: PackedDataset, device: torch.device, queue_depth: int, sequential: bool) -> dict[str, Any]:
    """The host and device bytes a loader over `ds` uses, from the manifest (nothing is read).

    ``host_bytes`` (what ``--cpu-memory`` must hold) = CPU tier + staging buffers + I/O buffers
    (+ the GPU tier itself when training on the CPU, where it is host memory too). The staging
    buffers carry disk rows only, in pieces (`tiers.staging_piece_bytes`), never whole batches.
    ``assembled_bytes``: the batch matrices alive at once (`trainbuffers.assembled_batches` x the largest
    batch), on the device on CUDA, else part of the training process's host working set.
    """
    rb = ds.row_bytes
    max_rows = int(ds.manifest["round"].get("max_batch_rows", 0))
    row_reads = bool(ds.dcache_files) or not ds.manifest.get("config", {}).get("packing", True)
    buffers = staging_count(device, queue_depth, sequential)
    # the cap the round's tiers were sized with (its config's ``staging_piece``; older rounds: the default)
    cap = int(ds.manifest.get("config", {}).get("staging_piece", STAGING_PIECE_BYTES))
    piece = staging_piece_bytes(max_rows, rb, ds.num_shards, cap)
    plan: dict[str, Any] = {
        "row_bytes": rb,
        "max_batch_rows": max_rows,
        "staging_buffers": buffers,
        "staging_piece_bytes": piece,
        "staging_bytes": buffers * piece,
        "assembled_batches": assembled_batches(queue_depth, sequential),
        # (encoded rows: the batches hold their rows decoded, float32)
        "assembled_bytes": assembled_batches(queue_depth, sequential) * max_rows * (
            rb if ds.codec is None else 4 * ds.codec.dim),
        "assembled_on": "device" if device.type == "cuda" else "host",
        "gpu_tier_bytes": int(ds.gpu_ids.shape[0]) * rb,
        "cpu_tier_bytes": int(ds.cpu_ids.shape[0]) * rb,
        "io_buffer_bytes": io_buffer_bytes(row_reads),
        "queue_depth": queue_depth,
        "sequential": bool(sequential),
        "device": device.type,
    }
    plan["host_bytes"] = plan["cpu_tier_bytes"] + plan["staging_bytes"] + plan["io_buffer_bytes"] + (
        plan["gpu_tier_bytes"] if device.type != "cuda" else 0)
    plan["device_bytes"] = plan["gpu_tier_bytes"] if device.type == "cuda" else 0
    return plan


def fewer_buffers(plan: dict[str, Any], cpu_memory: int) -> list[Setting]:
    """The trainer's settings that, each alone, fit `plan` (`memory_plan`, pipelined) into `cpu_memory` with
    fewer staging buffers of the same size: the largest smaller queue depth that does, else the sequential
    stages (`staging_count`) where they do. Empty when neither does."""
    if plan.get("sequential", True) or "queue_depth" not in plan:
        return []
    piece = max(1, int(plan["staging_piece_bytes"]))
    buffers = (cpu_memory - (plan["host_bytes"] - plan["staging_bytes"])) // piece
    device = plan.get("device", "cpu")
    depth = fitting_queue_depth(buffers, device, plan["queue_depth"])
    if depth is not None:
        return [Setting("queue_depth", depth)]
    if buffers >= staging_count(device, plan["queue_depth"], True):
        return [Setting("sequential", True, "the stages one after another")]
    return []


def check_memory(plan: dict[str, Any], cpu_memory: int | None, gpu_memory: int | None) -> None:
    """Refuse, before anything is allocated, a run that cannot fit its budgets (naming the option and
    the smallest budget that works).

    Raises:
        ConfigError: ``cpu_memory`` below ``host_bytes``, or ``gpu_memory`` below the GPU tier.
    """
    if cpu_memory is not None and plan["host_bytes"] > cpu_memory:
        raise ConfigError("cpu_memory", (
            f"{format_bytes(cpu_memory)} ({cpu_memory:,} bytes) is too small: the CPU tier "
            f"({format_bytes(plan['cpu_tier_bytes'])}) + {plan['staging_buffers']} staging buffers x "
            f"{format_bytes(plan['staging_piece_bytes'])} ({format_bytes(plan['staging_bytes'])}) + I/O "
            f"buffers ({format_bytes(plan['io_buffer_bytes'])})"
            + (f" + the GPU tier held in host memory ({format_bytes(plan['gpu_tier_bytes'])})"
               if plan["device_bytes"] == 0 and plan["gpu_tier_bytes"] else "")
            + f" need at least {plan['host_bytes']:,} bytes ({format_bytes(plan['host_bytes'])}); raise it to that, "
              "or prepare with a smaller CPU tier"
            + ("" if plan.get("sequential", True) else f"; {{choices}} would fit {format_bytes(cpu_memory)}")),
            choices=fewer_buffers(plan, cpu_memory), no_choice="neither a smaller queue depth nor sequential stages")
    if gpu_memory is not None and plan["device_bytes"] > gpu_memory:
        raise ConfigError("gpu_memory", (
            f"{format_bytes(gpu_memory)} cannot hold the GPU tier of {format_bytes(plan['device_bytes'])} "
            f"({plan['device_bytes']:,} bytes); raise it to that or prepare with a smaller gpu_memory"))


def follow_plan(plan: dict[str, Any], ds: PackedDataset, device: torch.device, queue_depth: int, sequential: bool
                ) -> tuple[dict[str, Any], bool, bool]:
    """The memory plan of a loader that goes on from its `plan` to the streamed directory `ds`
    (`PackedLoader.follow`), and whether its staging buffers must grow and its pooled matrices be taller.

    Buffers and matrices are only ever replaced by larger ones: where `ds`'s pieces or batches are
    no larger, the plan keeps the sizes the loader already holds (and counts them).
    """
    memory = memory_plan(ds, device, queue_depth, sequential)
    grow = memory["staging_piece_bytes"] > plan["staging_piece_bytes"]
    if not grow:        # the staging buffers stay as large as they are
        memory["host_bytes"] += plan["staging_bytes"] - memory["staging_bytes"]
        memory.update(staging_piece_bytes=plan["staging_piece_bytes"], staging_bytes=plan["staging_bytes"])
    taller = memory["max_batch_rows"] > plan["max_batch_rows"]
    if not taller:      # and so do the pooled batch matrices
        memory.update(max_batch_rows=plan["max_batch_rows"], assembled_bytes=plan["assembled_bytes"])
    return memory, grow, taller
