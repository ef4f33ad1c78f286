"""Progress bars for Dask graphs and long loops."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm


def bar(total: int | None = None, desc: str = "", unit: str = "it", disable: bool | None = None) -> tqdm:
    """A tqdm bar on stderr; hidden when stderr is not a terminal unless forced on."""
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                disable=(not sys.stderr.isatty()) if disable is None else disable, leave=True)


def compute(tasks: Sequence[Any], desc: str, disable: bool | None = None) -> list[Any]:
    """Compute dask collections/delayed objects with one progress bar over their tasks.

    Uses the active `distributed.Client` when there is one (futures, as they finish),
    else the local scheduler with a per-task callback.
    """
    import dask
    from dask.callbacks import Callback

    tasks = list(tasks)
    if not tasks:
        return []
    try:
        from distributed import as_completed, default_client
        client = default_client()
    except ValueError:
        client = None
    if client is not None:
        futures = client.compute(tasks)
        try:
            with bar(total=len(futures), desc=desc, unit="task", disable=disable) as b:
                for f in as_completed(futures):
                    if f.status == "error":
                        f.result()      # the first failure ends the phase now, not once every other task ran
                    b.update(1)
            return client.gather(futures)
        except BaseException:
            # A failed or interrupted phase must not leave tasks queued behind our back: release
            # our futures, and the scheduler forgets every task no client wants any more (queued
            # ones never run). Not `client.cancel`: in distributed 2026.8 cancelling a key whose
            # dependents nobody holds a future of (count tasks under a merge) trips
            # `assert ts.who_wants` in `Scheduler.stimulus_cancel`, which logs an AssertionError
            # traceback and drops the client's stream.
            for f in futures:
                f.release()
            raise

    class _Bar(Callback):
        def _start_state(self, dsk, state):
            self.b = bar(total=sum(len(v) for k, v in state.items() if k in ("ready", "waiting")),
                         desc=desc, unit="task", disable=disable)

        def _posttask(self, key, result, dsk, state, worker_id):
            self.b.update(1)

        def _finish(self, dsk, state, errored):
            self.b.close()

    with _Bar():
        return list(dask.compute(*tasks))
