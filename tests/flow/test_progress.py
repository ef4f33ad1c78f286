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

WAIT_S = 60.0       # a guard against a hang: the other task starts at once on the other worker


def _fail(started: str) -> int:
    """Fails once the slow task is running (so that it is still running when the phase fails)."""
    deadline = time.monotonic() + WAIT_S
    while not Path(started).exists():
        assert time.monotonic() < deadline, f"the slow task did not start within {WAIT_S:.0f} s"
        time.sleep(0.01)
    raise OSError(28, "No space left on device")


def _slow_write(started: str, path: str, seconds: float) -> int:
    Path(started).touch()
    time.sleep(seconds)
    Path(path).write_text("done")
    return 1


def _count(x: int) -> int:
    return x


def _merge(*xs: int) -> int:
    return sum(xs)


def test_a_failed_phase_waits_for_running_tasks_and_logs_no_scheduler_error(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    started, done = tmp_path / "slow-started", tmp_path / "slow.txt"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            distributed.Client(cluster), caplog.at_level(logging.ERROR):
        d = dask.delayed
        # the failure comes while the slow task runs, which then goes on for a second: had the error reached the
        # caller before it finished, the file would not be there yet
        slow = d(_slow_write)(str(started), str(done), 1.0, dask_key_name="sample-slow")
        bad = d(_fail)(str(started), dask_key_name="sample-bad")
        # counts under a merge: intermediate keys no future refers to (what client.cancel choked on)
        counted = [d(_count)(x, dask_key_name=f"count-{i}") for i, x in enumerate((slow, bad))]
        merged = d(_merge)(*counted, dask_key_name="count-merge")
        with pytest.raises(OSError, match="No space left"):
            compute([slow, bad, merged], desc="t", disable=True)
        assert done.read_text() == "done", "the running task finished before the error was raised"
        time.sleep(0.3)
    assert "AssertionError" not in caplog.text and "never retrieved" not in caplog.text
