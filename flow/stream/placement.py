"""Where each task of a streamed run runs, at which priority, and which of its futures the driver watches.

Placement is by annotation at submission (see `flow.stream`'s docstring): preparation on the CPU
workers in stream order, ``ship`` and ``train`` pinned to their lane's GPU worker (`workers.on_gpu`),
ships before any waiting train. One `Placement` is shared by the driver (`driver.StreamRun`) and
the preparation it drives (`preparation.Preparation`), so both submit the same way and the driver's
wait loop sees every future either watches.
"""
from __future__ import annotations

from typing import Any

__all__ = ["Placement"]


class Placement:
    """The run's submission rules and watched futures.

    Args:
        client: the run's client.
        n: the round's number of superbatches (priorities are stream positions).
    """

    def __init__(self, client: Any, n: int) -> None:
        self.client = client
        self.n = n
        self.cpu_addrs: list[str] = []                       # the CPU workers (the driver's health check renews them)
        self.watch: dict[Any, tuple[str, int, int]] = {}     # future -> (kind, superbatch, lane)

    def cpu(self, k: int) -> dict[str, Any]:
        """`client.submit`'s placement of a task of superbatch k on the CPU workers, in stream order."""
        kw: dict[str, Any] = {"priority": -k}
        if self.cpu_addrs:
            kw.update(workers=list(self.cpu_addrs), allow_other_workers=False)
        return kw

    def ship_priority(self, k: int) -> int:
        """Ships (and ship-base, k = -1) in stream order, all before any waiting ``train`` (a train of k: -k)."""
        return self.n + 1 - k

    def watched(self, fut: Any, kind: str, k: int, lane: int = 0) -> Any:
        """`fut`, watched by the driver's wait loop as task `kind` of superbatch k on lane `lane`."""
        self.watch[fut] = (kind, k, lane)
        return fut

    def submit_cpu(self, fn: Any, *args: Any, key: str, k: int) -> Any:
        """The preparation graph's `Submit` (`flow.graph`): a future on the CPU workers, in stream order."""
        return self.client.submit(fn, *args, key=key, **self.cpu(k))
