"""How many of its buffers the pipelined trainer holds at once: the staging buffers its load stage
cycles through and the assembled batch matrices alive together.

The trainer allocates them (`operators.train.loader`, `operators.train.memory`), and preparation
budgets host memory for them before any trainer runs (`operators.prepare.tiers`), so both take the
counts from here, below either; imports nothing.
"""
from __future__ import annotations

__all__ = ["assembled_batches", "staging_buffers"]


def staging_buffers(queue_depth: int, sequential: bool = False) -> int:
    """Staging buffers the load stage cycles through: the piece being loaded, ``queue_depth``
    loaded pieces queued and the one being assembled (sequential: one)."""
    return 1 if sequential else queue_depth + 2


def assembled_batches(queue_depth: int, sequential: bool = False) -> int:
    """Assembled batch matrices alive at once: the one being assembled, ``queue_depth`` queued,
    the one training and the previous one the training loop still holds while it fetches the
    next (sequential: the one training and the previous one)."""
    return 2 if sequential else queue_depth + 3
