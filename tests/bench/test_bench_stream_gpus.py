"""`diskflow bench stream --gpus 2` on a small graph: the keys it promises, from one run of each cache mode."""
from __future__ import annotations

import json
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("distributed")

from diskflow.cli import main
from mounts import skip_where_reads_are_not_counted


@pytest.fixture(scope="module")
def streamed(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, Path]:
    root = tmp_path_factory.mktemp("bench-stream")
    out = root / "f.json"
    printed = StringIO()
    with redirect_stdout(printed):
        assert main(["bench", "stream", "--gpus", "2", "--work", str(root / "work"), "--nodes", "6000",
                     "--epochs", "2", "--superbatch-size", "8", "--repeats", "1", "--no-pin", "--json", str(out)]) == 0
    return json.loads(out.read_text()), printed.getvalue(), root


def test_bench_stream_on_two_gpu_workers_writes_its_figures(streamed: tuple[dict[str, Any], str, Path],
                                                            tmp_path: Path) -> None:
    f, printed, _ = streamed
    assert f["gpus"] == 2 and f["cache_modes"] == ["per-worker", "shared"]
    assert len(f["gpu_idle_fraction_per_worker"]) == 2 and all(0 <= x <= 1 for x in f["gpu_idle_fraction_per_worker"])
    assert f["models_equal"] is True and f["same_losses"] is True
    assert f["cpu_tier_share"]["per-worker"] <= 0.25 < f["cpu_tier_share"]["shared"] <= 0.5
    run = f["runs"]["per-worker"][0]
    assert run["packed_bytes"] > 0 and run["tasks"] > 0
    assert "GPU workers idle" in printed
    assert main(["bench", "stream", "--gpus", "1", "--cache", "shared", "--work", str(tmp_path / "work")]) == 2


def test_the_shared_tier_reads_less_from_the_disk(streamed: tuple[dict[str, Any], str, Path]) -> None:
    f, _, root = streamed
    skip_where_reads_are_not_counted(root)
    assert 0 < f["disk_read_bytes_shared"] < f["disk_read_bytes_per_worker"]
    run = f["runs"]["per-worker"][0]
    assert run["disk_read_bytes"] >= run["packed_bytes"] > 0
