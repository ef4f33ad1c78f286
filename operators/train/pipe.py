"""The stage pipe: stage threads joined by bounded queues, a stop flag, the first error of any stage,
and each stage's clock (seconds busy, starved of input, blocked on a full queue).

`PackedLoader` runs load / assemble / graph as threads over it. A stage blocked on a queue looks
up every `_POLL_S` to see whether the pipe was stopped, so stopping (the consumer left, a stage
failed) never waits on a queue; the first failure is re-raised in the consumer's thread.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["END", "Pipe", "StageClock", "Stopped", "guard"]

# How often a blocked stage looks up from its queue to see whether the pipeline was stopped.
_POLL_S = 0.05


class Stopped(Exception):
    """Raised inside a stage when the pipeline was asked to stop (never escapes the loader)."""


@dataclass
class StageClock:
    """Seconds a stage spent working (`busy`), waiting for input (`starved`) and for room (`blocked`)."""

    busy: float = 0.0
    starved: float = 0.0
    blocked: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {"busy_s": self.busy, "starved_s": self.starved, "blocked_s": self.blocked}


class Pipe:
    """Bounded queues between stage threads, a stop flag, and the first error of any stage."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._lock = threading.Lock()

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = exc
        self.stop.set()

    def check(self) -> None:
        if self.error is not None:
            raise self.error
        if self.stop.is_set():
            raise Stopped()

    def put(self, q: queue.Queue, item: Any, clock: StageClock) -> None:
        t = time.perf_counter()
        try:
            while True:
                self.check()
                try:
                    q.put(item, timeout=_POLL_S)
                    return
                except queue.Full:
                    continue
        finally:
            clock.blocked += time.perf_counter() - t

    def get(self, q: queue.Queue, clock: StageClock) -> Any:
        t = time.perf_counter()
        try:
            while True:
                try:
                    return q.get(timeout=_POLL_S)
                except queue.Empty:
                    self.check()
        finally:
            clock.starved += time.perf_counter() - t


END = object()   # end of a stage's stream


def guard(pipe: Pipe, fn: Callable[[], None]) -> Callable[[], None]:
    """Run a stage; its first exception stops the pipeline and is re-raised to the consumer."""
    def run() -> None:
        try:
            fn()
        except Stopped:
            pass
        except BaseException as e:   # noqa: BLE001 - handed to the consumer thread
            pipe.fail(e)
    run.__name__ = fn.__name__
    return run
