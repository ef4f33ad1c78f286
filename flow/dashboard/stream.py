"""The driver's one message to the diskflow page: a streamed run starts (its id, clock and GPU workers)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .publish import TOPIC

__all__ = ["announce_run"]


def announce_run(client: Any, run: str, t_start: float, superbatches: int, start: int,
                 lanes: Sequence[tuple[str, str]]) -> None:
    """Tell the scheduler's diskflow page (`flow.dashboard.state.LiveRuns`) that run `run` starts at
    `t_start` (wall clock), with `superbatches` in its round from `start` on, and one lane per GPU worker:
    (its job on that worker, its address). Without the page the event only lands in the scheduler's log."""
    client.log_event(TOPIC, {"kind": "run", "run": run, "t_start": t_start, "superbatches": superbatches,
                             "start": start, "lanes": [{"rank": r, "job": job, "worker": addr}
                                                       for r, (job, addr) in enumerate(lanes)]})
