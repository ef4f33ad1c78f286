"""A finished task whose result dies with its worker stops a streamed run as a lost worker does
(`StreamRun._result`), whatever error Dask's fetch raises; with every worker still there, the error stands."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from diskflow.flow.stream import StreamStopped
from diskflow.flow.stream.driver import StreamRun


class _Lost:
    def result(self) -> None:
        raise RuntimeError("<asyncio.locks.Event object> is bound to a different event loop")   # as Dask raised it


def _run(workers: dict[str, object]) -> StreamRun:
    run = object.__new__(StreamRun)         # the driver's state that `_result` reads, nothing else
    run.cfg = SimpleNamespace(gpu_wait_s=0.2, poll_s=0.01)
    run.lanes = [SimpleNamespace(gpu_addr="tcp://127.0.0.1:1")]
    run.place = SimpleNamespace(cpu_addrs=[])
    run._workers = lambda: workers          # type: ignore[method-assign]
    run._where = lambda: "resume from checkpoint 2"     # type: ignore[method-assign]
    return run


def test_a_result_lost_with_its_gpu_worker_stops_the_run_naming_where_to_resume() -> None:
    with pytest.raises(StreamStopped, match=r"^the GPU worker tcp://127.0.0.1:1 left the cluster; resume from"):
        _run({})._result(_Lost())


def test_a_failed_fetch_with_every_worker_present_raises_as_it_is() -> None:
    with pytest.raises(RuntimeError, match="different event loop"):
        _run({"tcp://127.0.0.1:1": {}})._result(_Lost())
