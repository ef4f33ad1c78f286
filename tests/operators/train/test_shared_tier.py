"""The shared CPU tier's turns: rank 0 fills and publishes, the others wait for it; batches go in order."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from diskflow.operators.train.shared_tier import SharedTier, TierTimeout

from diskflow.errors import DiskflowError

WAIT_S = 60.0       # a guard against a hang: a turn comes within milliseconds


def test_turns_go_in_the_merged_stream_order(tmp_path: Path) -> None:
    path = tmp_path / "tier"
    zero = SharedTier(path, 6, 3, np.dtype(np.float32), rank=0, timeout_s=WAIT_S)
    one = SharedTier(path, 6, 3, np.dtype(np.float32), rank=1, timeout_s=WAIT_S)
    zero.rows[:] = np.arange(18, dtype=np.float32).reshape(6, 3)
    seen: list[int] = []

    def worker(tier: SharedTier, batches: list[int]) -> None:
        tier.wait_ready()
        for g in batches:
            tier.wait_turn(g)
            seen.append(g)
            tier.rows[g % 6] += 1          # an insert: the next batch must see it
            time.sleep(0.001)
            tier.pass_turn(g)

    failed: list[BaseException] = []

    def other() -> None:
        try:
            worker(one, [11, 13, 15])
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            failed.append(e)

    t1 = threading.Thread(target=other)
    t1.start()
    time.sleep(0.05)        # time for rank 1 to go wrong, were it not waiting
    assert seen == [], "rank 1 waits until rank 0 publishes"
    zero.publish(10)
    worker(zero, [10, 12, 14])
    t1.join(WAIT_S)
    assert not t1.is_alive() and not failed, failed
    assert seen == [10, 11, 12, 13, 14, 15] and zero.turn == 16
    assert np.array_equal(one.rows, np.arange(18, dtype=np.float32).reshape(6, 3) + 1), "one mapping, both see it"
    with pytest.raises(DiskflowError, match="passes a turn"):
        one.pass_turn(3)
    zero.close()
    one.close(unlink=True)
    assert not path.exists()


def test_a_worker_that_stops_makes_the_others_time_out(tmp_path: Path) -> None:
    zero = SharedTier(tmp_path / "t", 2, 2, np.dtype(np.float16), rank=0, timeout_s=0.2)
    zero.publish(0)
    with pytest.raises(TierTimeout, match="batch 1"):
        zero.wait_turn(1)
    other = SharedTier(tmp_path / "t", 3, 2, np.dtype(np.float16), rank=1, timeout_s=0.2)
    with pytest.raises(DiskflowError, match="2 rows of 4 bytes"):
        other.wait_ready()
