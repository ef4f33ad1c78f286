"""Smoke test of `diskflow bench link` on a tiny graph: the JSON's keys, and belady's and inmemory's link losses
identical (the same stored samples)."""
from __future__ import annotations

import json
from pathlib import Path

from diskflow.bench.link import PIPELINES
from diskflow.cli import main

KEYS = ("test_auc", "test_mrr", "test_hits50", "data_s_per_epoch", "disk_bytes", "read_amplification")


def test_bench_link_tiny(tmp_path: Path) -> None:
    out = tmp_path / "link.json"
    assert main(["bench", "link", "--workdir", str(tmp_path / "work"), "--nodes", "3000", "--dim", "16",
                 "--epochs", "1", "--fanouts", "4,4", "--batch-size", "256", "--hidden", "16", "--threads", "1",
                 "--feature-budget", "2MiB", "--no-cgroup", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert set(figures["pipelines"]) == set(PIPELINES)
    for name, p in figures["pipelines"].items():
        assert all(k in p for k in KEYS), name
        assert p["test_mrr"] is not None, (name, p["error"])
    for k in ("sage_over_mlp_mrr", "belady_over_inmemory_data", "floor", "baseline", "losses_identical"):
        assert k in figures
    assert figures["losses_identical"] is True
    assert figures["pipelines"]["belady"]["losses"] == figures["pipelines"]["inmemory"]["losses"]
