"""Dask's memory accounting sees the bytes the streamed tasks' results hold.

`dask.sizeof` falls back to `sys.getsizeof`, which for a dataclass counts a few dozen bytes
whatever arrays it carries: a 14 MB bundle would show as 56 B on the dashboard, and the
workers' memory limits and spilling would not see it.
"""
from __future__ import annotations

import numpy as np
from dask.sizeof import sizeof
from diskflow.flow.stream import PlanResult, SampleResult, Tiers
from diskflow.operators.formats.plan import BatchPlan, SuperbatchPlan
from diskflow.operators.stream.pack import Bundle


def _plan(n: int) -> BatchPlan:
    return BatchPlan(np.zeros(n, np.uint8), np.zeros(n, np.int64), np.zeros(n // 2, np.int64), np.zeros(n // 2, np.int64))


def test_results_count_their_arrays() -> None:
    data = {"index.arrow": np.zeros(3_000_000, np.uint8), "samples.arrow": np.zeros(5_000_000, np.uint8)}
    bundle = Bundle("e0-s00000", {k: v.nbytes for k, v in data.items()}, {k: 0 for k in data}, data=data)
    assert 8_000_000 <= sizeof(bundle) < 8_010_000
    url = Bundle("e0-s00000", bundle.sizes, bundle.crcs, url="file:///x")
    assert sizeof(url) < 10_000             # its files are elsewhere

    sample = SampleResult("e0-s00000", np.zeros(2_000_000, np.uint8), {}, {})
    assert 2_000_000 <= sizeof(sample) < 2_010_000
    written = SampleResult("e0-s00000", None, {}, {}, path="/x/e0-s00000.arrow")
    assert sizeof(written) < 10_000         # its samples are in the file

    tiers = Tiers(np.zeros(1000, np.int64), np.zeros(100_000, np.int64), np.zeros(200_000, np.int64), {})
    assert (1000 + 300_000) * 8 <= sizeof(tiers) < (1000 + 300_000) * 8 + 10_000

    batches = [_plan(100_000) for _ in range(4)]
    per_batch = 100_000 * (1 + 8) + 2 * 50_000 * 8
    plan = PlanResult("e0-s00000", batches, np.zeros(10_000, np.int64), {})
    assert 4 * per_batch + 80_000 <= sizeof(plan) < 4 * per_batch + 80_000 + 10_000
    sb = SuperbatchPlan(batches, np.zeros(10_000, np.int64), 0, 0, 0)
    assert 4 * per_batch + 80_000 <= sizeof(sb) < 4 * per_batch + 80_000 + 10_000
