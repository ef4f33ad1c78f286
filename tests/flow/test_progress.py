"""`progress.compute` on a distributed cluster when a task fails: the phase ends at the first
failure, the scheduler does not choke on the clean-up (no AssertionError from cancelling keys with
dependents nobody holds), and tasks still running finish before the error reaches the caller, so
the caller can remove what they write into."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import dask
import pytest

distributed = pytest.importorskip("distributed")    # before any import that needs it, so the module skips
from diskflow.flow.progress import compute


def _fail(i: int) -> int:
    raise OSError(28, "No space left on device")


def _slow_write(path: str, seconds: float) -> int:
    time.sleep(seconds)
    Path(path).write_text("done")
    return 1


def _count(x: int) -> int:
    return x


def _merge(*xs: int) -> int:
    return sum(xs)


def test_a_failed_phase_waits_for_running_tasks_and_logs_no_scheduler_error(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    done = tmp_path / "slow.txt"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            distributed.Client(cluster), caplog.at_level(logging.ERROR):
        d = dask.delayed
        slow = d(_slow_write)(str(done), 1.0, dask_key_name="sample-slow")
        bad = d(_fail)(0, dask_key_name="sample-bad")
        # counts under a merge: intermediate keys no future refers to (what client.cancel choked on)
        counted = [d(_count)(x, dask_key_name=f"count-{i}") for i, x in enumerate((slow, bad))]
        merged = d(_merge)(*counted, dask_key_name="count-merge")
        with pytest.raises(OSError, match="No space left"):
            compute([slow, bad, merged], desc="t", disable=True)
        assert done.read_text() == "done", "the running task finished before the error was raised"
        time.sleep(0.3)
    assert "AssertionError" not in caplog.text and "never retrieved" not in caplog.text
