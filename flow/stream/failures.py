"""How a streamed run meets failures: which are retried, which stop it, and what a stopped run says.

Failures are local (docs/design.md, "The streamed split-machine run"): Dask reruns a lost CPU
worker's tasks itself, with identical results, so the driver sees only the GPU side's failures.
A superbatch that fails its checksums on arrival is packed and shipped once more; anything else
stops the run with a `StreamStopped` whose message ends with `resume_hint`: how far the run got,
its last checkpoint and how to continue from it. A `DiskflowError` a task raised (a bad option, a
bad input) is raised as it is. Kept apart from the driver (`driver.StreamRun`), which only calls
these, so that every way a run can stop, and its message, reads in one place.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import DiskflowError
from ..plugin import GpuStateLost
from .config import StreamStopped
from .lanes import Lane

__all__ = ["cancelled", "connection_lost", "free_scratch", "resume_hint", "task_failed"]

log = logging.getLogger(__name__)


def resume_hint(trained: int, n: int, last_checkpoint: Path | None, run_dir: Path) -> str:
    """What a stopped run has done and how to continue it: `trained` of `n` superbatches, its last checkpoint."""
    ck = f"the last checkpoint is {last_checkpoint}" if last_checkpoint else "no checkpoint was written"
    return (f"{trained} of {n} superbatches are trained and {ck}; continue with the same "
            f"options and resume=True in the run directory {run_dir}")


def task_failed(kind: str, key: str, lane: Lane, k: int, exc: BaseException | None, gpus: int,
                where: Callable[[], str]) -> None:
    """Handle lane's task `kind` of superbatch k (`key`, its name) that raised `exc`: return when it is to be
    packed and shipped again (a first failed verification on arrival, noted in ``lane.reshipped``),
    raise otherwise.

    Raises:
        StreamStopped: the run cannot go on (a second failed verification, a lost GPU worker's
            state, any other failure), ending with `where()`.
        DiskflowError: the task's own, as it is.
    """
    from ...operators.stream.ship import ShipVerifyError

    what = f"{kind}-{key}" if k >= 0 else kind
    if gpus > 1:
        what += f" (GPU worker {lane.rank}, {lane.gpu_addr})"
    if kind == "ship" and isinstance(exc, ShipVerifyError) and k not in lane.reshipped:
        lane.reshipped.add(k)
        log.warning("superbatch %s failed verification on arrival (%s); shipping it again", key, exc)
        return
    if kind == "ship" and isinstance(exc, ShipVerifyError):
        raise StreamStopped(f"superbatch {key} failed verification on arrival twice ({exc}); {where()}") from exc
    if isinstance(exc, GpuStateLost):
        raise StreamStopped(f"{exc}; {where()}") from exc
    if isinstance(exc, DiskflowError):
        raise exc
    raise StreamStopped(f"task {what} failed: {type(exc).__name__}: {exc}; {where()}") from exc


def cancelled(kind: str, k: int, where: Callable[[], str]) -> StreamStopped:
    """The error of a task of superbatch k the scheduler cancelled (it lost the task, or the connection)."""
    return StreamStopped(f"task {kind} of superbatch {k} was cancelled (the scheduler lost it, or the "
                         f"connection to it was lost); {where()}")


def connection_lost(e: BaseException, where: Callable[[], str]) -> StreamStopped:
    """The error of a run whose connection to the scheduler was lost: one clear line, not a traceback."""
    return StreamStopped(f"lost the connection to the Dask scheduler ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}); {where()}")


def free_scratch(client: Any, workers: Callable[[], dict[str, Any]], lanes: list[Lane], tok: str,
                 gpu: Callable[[Lane], dict[str, Any]]) -> None:
    """After a failure: free the lanes' scratch on the GPU workers still in the cluster (`workers()`, the worker
    table; a ``finish`` task each, with `gpu(lane)`'s placement), waiting up to 30 s for each; nothing here
    raises."""
    from .tasks import finish_task

    with contextlib.suppress(Exception):
        if client.status == "running":
            table = workers()
            futs = [client.submit(finish_task, lane.run, key=f"finish-{tok}-abort-g{lane.rank}", pure=False,
                                  **gpu(lane))
                    for lane in lanes if lane.gpu_addr in table]
            for fut in futs:
                with contextlib.suppress(Exception):
                    fut.result(timeout=30)
