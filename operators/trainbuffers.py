"""How many of its buffers the pipelined trainer holds at once: the staging buffers its load stage
cycles through and the assembled batch matrices alive together.

The trainer allocates them (`operators.train.loader`, `operators.train.memory`), and preparation
budgets host memory for them before any trainer runs (`operators.prepare.tiers`), so both take the
counts from here, below either; imports nothing.
"""
from __future__ import annotations

__all__ = ["assembled_batches", "fitting_queue_depth", "staging_buffers", "staging_count"]


def staging_buffers(queue_depth: int, sequential: bool = False) -> int:
    """Staging buffers the load stage cycles through: the piece being loaded, ``queue_depth``
    loaded pieces queued and the one being assembled (sequential: one)."""
    return 1 if sequential else queue_depth + 2


def staging_count(device: object, queue_depth: int, sequential: bool = False) -> int:
    """Staging buffers a loader allocates on `device` ("cpu", "cuda[:N]" or a torch device): the load stage's
    (`staging_buffers`) and, on CUDA, one more through which the assemble stage moves CPU-tier rows to the
    device."""
    return staging_buffers(queue_depth, sequential) + (1 if str(device).startswith("cuda") else 0)


def fitting_queue_depth(buffers: int, device: object, queue_depth: int) -> int | None:
    """The largest queue depth below `queue_depth` whose loader's staging buffers (`staging_count`) number at
    most `buffers`; None when no depth of at least 1 does."""
    depth = buffers - staging_count(device, 0)
    return int(depth) if 1 <= depth < queue_depth else None


def assembled_batches(queue_depth: int, sequential: bool = False) -> int:
    """Assembled batch matrices alive at once: the one being assembled, ``queue_depth`` queued,
    the one training and the previous one the training loop still holds while it fetches the
    next (sequential: the one training and the previous one)."""
    return 2 if sequential else queue_depth + 3
