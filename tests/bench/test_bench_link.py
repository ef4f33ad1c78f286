"""Smoke test of `diskflow bench link` on a tiny graph: the JSON's keys and targets, and belady's and inmemory's
link losses identical (the same stored samples)."""
from __future__ import annotations

import json
from pathlib import Path

from bench_children import compare_children_in_this_process
from diskflow.bench.link import PIPELINES, TARGETS
from diskflow.cli import main

KEYS = ("test_auc", "test_mrr", "test_hits50", "data_s_per_epoch", "disk_bytes", "read_amplification", "disk_floor_s")


def test_bench_link_tiny(tmp_path: Path) -> None:
    out = tmp_path / "link.json"
    with compare_children_in_this_process():     # (their figures, not their memory limits: --no-cgroup)
        rc = main(["bench", "link", "--workdir", str(tmp_path / "work"), "--nodes", "3000", "--dim", "16",
                   "--epochs", "1", "--fanouts", "4,4", "--batch-size", "1024", "--hidden", "16", "--threads", "1",
                   "--feature-budget", "2MiB", "--link-split", "0.05,0.1", "--disjoint-train-ratio", "0",
                   "--repeats", "2", "--bw-bytes", "65536", "--no-cgroup", "--json", str(out)])
    assert rc == 0
    figures = json.loads(out.read_text())
    assert set(figures["pipelines"]) == set(PIPELINES)
    for name, p in figures["pipelines"].items():
        assert all(k in p for k in KEYS), name
        assert p["test_mrr"] is not None, (name, p["error"])
    for name in ("inmemory", "belady"):         # their data paths interleaved, the fastest kept
        runs = figures["pipelines"][name]["data_s_repeats"]
        assert len(runs) == 2 and figures["pipelines"][name]["data_s_per_epoch"] == min(runs)
    for k in ("sage_over_mlp_mrr", "belady_over_inmemory_data", "read_amplification", "floor", "baseline",
              "losses_identical", "ratios", "targets_met"):
        assert k in figures
    assert set(figures["targets"]) == set(TARGETS)
    margin = figures["targets"]["sage_over_mlp_mrr"]
    assert margin["value"] == figures["sage_over_mlp_mrr"] and margin["met"] == (margin["value"] > 0)
    assert figures["floor"]["seq_read_bw"] > 0
    assert figures["losses_identical"] is True
    assert figures["pipelines"]["belady"]["losses"] == figures["pipelines"]["inmemory"]["losses"]
