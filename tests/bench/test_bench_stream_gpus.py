"""`diskflow bench stream --gpus 2` on a small graph: the keys it promises, from one run of each cache mode."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("distributed")

from diskflow.cli import main


def test_bench_stream_on_two_gpu_workers_writes_its_figures(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "f.json"
    assert main(["bench", "stream", "--gpus", "2", "--work", str(tmp_path / "work"), "--nodes", "6000",
                 "--epochs", "2", "--superbatch-size", "8", "--repeats", "1", "--no-pin", "--json", str(out)]) == 0
    f = json.loads(out.read_text())
    assert f["gpus"] == 2 and f["cache_modes"] == ["per-worker", "shared"]
    assert len(f["gpu_idle_fraction_per_worker"]) == 2 and all(0 <= x <= 1 for x in f["gpu_idle_fraction_per_worker"])
    assert f["models_equal"] is True and f["same_losses"] is True
    assert f["cpu_tier_share"]["per-worker"] <= 0.25 < f["cpu_tier_share"]["shared"] <= 0.5
    assert 0 < f["disk_read_bytes_shared"] < f["disk_read_bytes_per_worker"]
    run = f["runs"]["per-worker"][0]
    assert run["disk_read_bytes"] >= run["packed_bytes"] > 0 and run["tasks"] > 0
    assert "GPU workers idle" in capsys.readouterr().out
    assert main(["bench", "stream", "--gpus", "1", "--cache", "shared", "--work", str(tmp_path / "work")]) == 2
