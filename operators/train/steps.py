"""Optimizer steps over several batches: gradient accumulation in one process, data parallelism across several.

A *step* covers `per_step` consecutive batches of a loader pass (a superbatch, or an epoch); the
last step of a pass may hold fewer. The step's gradient is the mean of its batches' gradients:

- `Accumulate` (one process): the loader yields every batch; their gradients are summed and
  divided by the step's batch count before one optimizer step.
- `DataParallel` (one rank of a ``torch.distributed`` group of `world` ranks): the loader yields
  only this rank's batches of the pass (positions ``rank, rank + world, ...``), one per step; the
  gradients are summed over the ranks with one ``all_reduce`` per step (gloo on the CPU, NCCL on
  CUDA) and divided by the step's batch count. A rank without a batch in a pass's short last step
  contributes zeros, so every rank takes the same steps and the weights stay equal everywhere.

DistributedDataParallel's own hooks divide by the world size and need every rank to run a forward
pass; here a step may hold fewer batches than ranks, so the reduction is done by hand on one flat
buffer per step (what DDP's buckets do, in one bucket).

Both seed the dropout of a step's batch at position p from one draw of the session's RNG per step
and p, then put the RNG back where the draw left it: a step's batches draw the same masks whether
one process or `world` ranks run them, so a run on N ranks equals, within float summation order, a
one-process run of the same batches with ``per_step = N`` (`Accumulate`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["SEED_SPAN", "Accumulate", "DataParallel", "StepGroups", "draw_base", "restore_rng", "step_sizes"]

SEED_SPAN = 2**62


class StepGroups:
    """How a loader pass's batches become optimizer steps (the base: every batch its own step)."""

    per_step = 1
    world = 1

    def local_positions(self, step_batches: int) -> range:
        """Positions within a step of `step_batches` batches that this process trains."""
        return range(step_batches)

    def reduce(self, params: list[torch.nn.Parameter], count: int) -> None:
        """Turn the summed gradients of the step's `count` batches (this process's share) into their mean."""
        if count > 1:
            for p in params:
                if p.grad is not None:
                    p.grad.div_(count)

    @contextlib.contextmanager
    def batch_rng(self, base: int | None, position: int) -> Iterator[None]:
        """Seed the step's batch at `position` (dropout) from the step's draw `base` (None: leave the RNG be)."""
        yield


class Accumulate(StepGroups):
    """`per_step` consecutive batches of one process per optimizer step (their mean gradient)."""

    def __init__(self, per_step: int) -> None:
        if per_step < 1:
            raise ValueError(f"per_step must be >= 1, got {per_step}")
        self.per_step = per_step

    @contextlib.contextmanager
    def batch_rng(self, base: int | None, position: int) -> Iterator[None]:
        if base is None:
            yield
            return
        torch.manual_seed(base + position)
        yield


class DataParallel(Accumulate):
    """Rank `rank` of `world` in the default ``torch.distributed`` group: one batch per rank per step."""

    def __init__(self, world: int, rank: int) -> None:
        super().__init__(world)
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside a world of {world}")
        self.world, self.rank = world, rank

    def local_positions(self, step_batches: int) -> range:
        return range(self.rank, min(self.rank + 1, step_batches))

    def reduce(self, params: list[torch.nn.Parameter], count: int) -> None:
        import torch.distributed as dist

        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        # one flag per parameter after the gradients: how many ranks had a gradient for it (a parameter no
        # batch of the step used keeps no gradient, as one process accumulating the step leaves it)
        used = torch.tensor([float(p.grad is not None) for p in params], dtype=grads[0].dtype if grads else None,
                            device=grads[0].device if grads else None)
        flat = torch.cat([g.reshape(-1) for g in grads] + [used])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flags = flat[flat.numel() - len(params):].tolist()      # one copy to the host per step
        offset = 0
        for i, p in enumerate(params):
            n = p.numel()
            if flags[i] > 0:
                p.grad = flat[offset:offset + n].view_as(p).div(count)
            else:
                p.grad = None
            offset += n


def step_sizes(batches: int, per_step: int) -> list[int]:
    """The batch count of each step of a pass of `batches` batches, `per_step` at a time."""
    return [min(per_step, batches - s) for s in range(0, batches, per_step)]


def draw_base(device: torch.device) -> tuple[int, Any]:
    """One draw of the session's RNG for a step, and the RNG state after it (restored after the step)."""
    base = int(torch.randint(0, SEED_SPAN, (1,)).item())
    return base, _rng_state(device)


def _rng_state(device: torch.device) -> Any:
    return (torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def restore_rng(state: Any, device: torch.device) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)
