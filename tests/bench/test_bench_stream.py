"""`diskflow bench stream`'s page-overhead figures, from made-up repeats (the bench itself runs in bench/)."""
from __future__ import annotations

import pytest
from diskflow.bench.pageload import overhead
from diskflow.bench.stream import page_cpu_s


def _clock(gpu: float, cpus: float, sched: float) -> dict[str, float]:
    return {"gpu_worker": gpu, "cpu_workers": cpus, "scheduler_driver": sched}


def test_the_page_cpu_seconds_are_each_sides_median() -> None:
    """Each side's CPU seconds with and without the page are the medians of the repeats, side by side,
    so that one slow repeat does not decide where the page's work landed."""
    with_page = [_clock(10.0, 5.0, 1.6), _clock(10.4, 5.2, 1.5), _clock(30.0, 9.0, 9.0)]
    without = [_clock(10.1, 5.1, 1.1), _clock(9.9, 4.9, 1.0), _clock(10.0, 5.0, 1.2)]
    c = page_cpu_s(with_page, without)
    assert c["gpu_worker"] == {"with_page": 10.4, "without": 10.0}
    assert c["cpu_workers"] == {"with_page": 5.2, "without": 5.0}
    assert c["scheduler_driver"] == {"with_page": 1.6, "without": 1.1}


def test_the_throughput_cost_compares_the_fastest_runs() -> None:
    """``throughput_cost``: batches per second of the fastest run with the page against the fastest without."""
    d = overhead([10.5, 10.4, 12.0], [10.0, 11.0, 10.1], batches=100, limit=0.02)
    assert d["with_page_s"] == 10.4 and d["without_s"] == 10.0
    assert d["throughput_cost"] == pytest.approx(1 - 10.0 / 10.4)
    assert d["within_limit"] is False
    assert overhead([10.1], [10.0], batches=100, limit=0.02)["within_limit"] is True
