"""Progress bars for Dask graphs and long loops."""
from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

__all__ = ["active_client", "bar", "compute"]


def bar(total: int | None = None, desc: str = "", unit: str = "it", disable: bool | None = None) -> tqdm:
    """A tqdm bar on stderr; hidden when stderr is not a terminal unless forced on."""
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                disable=(not sys.stderr.isatty()) if disable is None else disable, leave=True)


def _held_by_worker(keys: list[Any], dask_worker: Any = None) -> list[Any]:
    """Which of `keys` this worker still holds (runs, keeps, or is about to run)."""
    return [k for k in keys if k in dask_worker.state.tasks]


def _held_by_scheduler(keys: list[Any], dask_scheduler: Any = None) -> list[Any]:
    """Which of `keys` the scheduler still knows."""
    return [k for k in keys if k in dask_scheduler.tasks]


def _wait_until_gone(client: Any, keys: list[Any], timeout: float = 120.0) -> None:
    """Wait (up to `timeout` s) until neither the scheduler nor any worker knows any of `keys`.

    A released task that is running finishes on its worker; the caller is about to clean up
    the directories such tasks write into, which they must not write into (or recreate)
    afterwards.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not client.run_on_scheduler(_held_by_scheduler, keys) and \
                    not any(client.run(_held_by_worker, keys, on_error="ignore").values()):
                return
        except (OSError, TimeoutError):     # the cluster is going away: nothing is left running for us
            return
        time.sleep(0.05)


def active_client() -> Any:
    """The process's default `distributed.Client`, or None. None without looking where distributed was never
    imported: no client can exist there, and looking would import it."""
    if sys.modules.get("distributed") is None:
        return None
    from distributed import default_client

    try:
        return default_client()
    except ValueError:
        return None


def compute(tasks: Sequence[Any], desc: str, disable: bool | None = None) -> list[Any]:
    """Compute dask collections/delayed objects with one progress bar over their tasks.

    Uses the active `distributed.Client` when there is one (futures, as they finish), its tasks in the Dask
    span of the phase (`flow.dashboard.spans.phase`: ``prepare/sample``, ``ingest/scan``), else the local
    scheduler with a per-task callback.
    """
    import dask
    from dask.callbacks import Callback

    tasks = list(tasks)
    if not tasks:
        return []
    client = active_client()
    if client is not None:
        from distributed import as_completed

        from .dashboard.spans import phase

        keys = [k for t in tasks for k in t.__dask_graph__()]
        with phase(desc):
            futures = client.compute(tasks)
        try:
            with bar(total=len(futures), desc=desc, unit="task", disable=disable) as b:
                for f in as_completed(futures):
                    if f.status == "error":
                        f.result()      # the first failure ends the phase now, not once every other task ran
                    b.update(1)
            return client.gather(futures)
        except BaseException as e:
            # A failed or interrupted phase must not leave tasks queued behind our back: release
            # our futures, and the scheduler forgets every task no client wants any more (queued
            # ones never run). Not `client.cancel`: in distributed 2026.8 cancelling a key whose
            # dependents nobody holds a future of (count tasks under a merge) trips
            # `assert ts.who_wants` in `Scheduler.stimulus_cancel`, which logs an AssertionError
            # traceback and drops the client's stream.
            for f in futures:
                f.release()
            if not isinstance(e, KeyboardInterrupt):
                _wait_until_gone(client, keys)
            raise

    class _Bar(Callback):
        def _start_state(self, dsk, state):
            self.b = bar(total=sum(len(v) for k, v in state.items() if k in ("ready", "waiting")),
                         desc=desc, unit="task", disable=disable)

        def _posttask(self, key, result, dsk, state, worker_id):
            self.b.update(1)

        def _finish(self, dsk, state, errored):
            self.b.close()

    # Where distributed is loaded, dask looks for a client (a worker's, too) as it always does.
    scheduler = None if sys.modules.get("distributed") is not None else _local_scheduler(tasks)
    with _Bar():
        return list(dask.compute(*tasks, scheduler=scheduler))


def _local_scheduler(tasks: Sequence[Any]) -> Any:
    """The scheduler `dask.compute` chooses for `tasks` in a process that has not imported distributed (the
    configured one, else the collections' default), as the callable it names. Given a name or nothing,
    `dask.compute` imports distributed to look for a client, which cannot exist before that import: a
    quarter of a second of a fresh process's first prepare, before its first task."""
    import dask
    from dask.base import named_schedulers

    chosen = dask.config.get("scheduler", None)
    if isinstance(chosen, str):
        return named_schedulers.get(chosen.lower(), chosen)    # an unknown name: dask's own error
    if chosen is not None:
        return chosen
    defaults = {t.__dask_scheduler__ for t in tasks if dask.is_dask_collection(t)}
    return defaults.pop() if len(defaults) == 1 else None
