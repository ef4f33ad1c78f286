"""Smoke test of `diskflow bench prepare` at a tiny size: it runs end to end through the CLI, and
its figures are complete and consistent with each other."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from diskflow.cli import main

TINY = ["--nodes", "6007", "--dim", "32", "--train-frac", "0.3", "--batch-size", "128", "--fanouts", "4,4",
        "--superbatch-size", "4", "--workers", "0", "--threads", "2", "--bw-bytes", str(16 << 20),
        "--naive-batches", "3", "--disk-fraction", "0.6"]

HEADLINE = ("prepare_s", "floor_s", "batched_over_naive", "belady_miss_bytes", "static_miss_bytes",
            "disk_used_bytes", "disk_budget_bytes", "read_amplification")


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path, str]:
    work = tmp_path_factory.mktemp("bench-prepare")
    out = work / "figures.json"
    from contextlib import redirect_stdout
    from io import StringIO

    printed = StringIO()
    with redirect_stdout(printed):
        rc = main(["bench", "prepare", *TINY, "--workdir", str(work / "data"), "--json", str(out)])
    assert rc == 0
    return json.loads(out.read_text()), work / "data", printed.getvalue()


def test_headline_keys_and_tables(figures: tuple[dict, Path, str]) -> None:
    f, _, printed = figures
    for key in HEADLINE:
        assert f[key] is not None, key
    for table in ("(a) prepare next to its I/O floor", "(b) packing the same routes", "(c) CPU tier at equal budget",
                  "(d) disk space and read amplification"):
        assert table in printed
    assert "naive packing ran on 3 of the" in printed
    for table in ("where the CPU goes: prepare's tasks by group", "scaling with Dask workers"):
        assert table in printed


def test_figures_are_consistent(figures: tuple[dict, Path, str]) -> None:
    f, _, _ = figures
    assert f["num_nodes"] == 6007 and f["feature_bytes"] == 6007 * 32 * 4
    assert f["seq_read_bw"] > 0 and f["seq_write_bw"] > 0
    assert f["floor_s"] == pytest.approx(f["feature_bytes"] / f["seq_read_bw"] + f["packed_bytes"] / f["seq_write_bw"])
    assert f["floor_s"] > 0 and f["prepare_s"] >= f["prepare_call_s"] > 0
    assert f["prepare_over_floor"] == pytest.approx(f["prepare_s"] / f["floor_s"])
    assert set(f["phases"]) == set(f["phase_cpu_s"]) == {"sample", "plan", "pack"}
    assert len(f["seq_read_bws"]) == 3 and f["seq_read_bw"] == pytest.approx(sorted(f["seq_read_bws"])[1])
    assert len(f["seq_write_bws"]) == 3 and f["seq_write_bw"] == pytest.approx(sorted(f["seq_write_bws"])[1])
    # the CPU figures: every task group of the graph profiled, the headline rate from the process's CPU
    assert f["accesses_per_cpu_s"] == pytest.approx(f["accesses"] / f["prepare_cpu_s"])
    groups = {t["group"] for t in f["tasks"]}
    assert {"sample", "count", "tiers", "trace", "plan", "plan-save", "route", "pack", "index"} <= groups, groups
    assert sum(t["tasks"] for t in f["tasks"] if t["group"] == "pack") == f["num_shards"]
    assert 0 < f["serial_chain_s"] <= f["phases"]["plan"] and f["serial_chain_share"] < 1
    # scaling: the same round prepared with 1 and 2 scheduler threads
    sc = f["scaling"]
    assert sc["threads"] == [1, 2] and f["worker_scaling"] == pytest.approx(sc["prepare_s"][0] / sc["prepare_s"][1])
    assert sc["prepare_s"][1] == f["prepare_s"] and set(sc["phase_scaling"]) <= {"sample", "plan", "pack"}
    f1, (p1, p2) = sc["cpu_phases_s"][0], sc["phases"]["pack"]
    assert sc["ceiling"] == pytest.approx((f1 + p1) / (f1 / 2 + p2))
    assert sc["ceiling_at_target"] == pytest.approx((f["accesses"] / 5e6 + p1) / (f["accesses"] / 1e7 + p2))
    assert f["raw_bytes_read"] == f["feature_bytes"]                   # every raw byte read once
    assert f["cpu_rows"] == int(0.10 * f["feature_bytes"]) // (32 * 4)  # the tier is 10% of the features
    assert f["cpu_memory"] == int(0.10 * f["feature_bytes"]) + f["staging_bytes"]
    # (b): the naive run covers 3 batches and is scaled to the round by packed rows
    assert f["naive_batches"] == 3 < f["batches"]
    assert f["naive_round_s"] == pytest.approx(f["naive_s"] * f["packed_rows"] / f["naive_rows"])
    ids = f["naive_batch_ids"]                                        # spread over the round
    n = f["batches"]
    assert ids == [n // 6, n // 2, 5 * n // 6]
    assert f["batched_over_naive"] == pytest.approx(f["naive_round_s"] / f["batched_s"])
    # (c): equal budget, same accesses; Belady misses no more than the static tier
    b, s = f["belady"], f["static"]
    assert b["cpu_hits"] + b["misses"] == s["cpu_hits"] + s["misses"]
    assert f["belady_miss_bytes"] == b["misses"] * 128 and f["static_miss_bytes"] == s["misses"] * 128
    assert f["belady_miss_bytes"] <= f["static_miss_bytes"]
    # (d): packed only reads pages of useful bytes; the budgeted layout meets its budget
    assert 1.0 <= f["read_amplification"] < 1.2
    assert f["packed_only_disk_used_bytes"] == f["packed_bytes"]
    assert "error" not in f["budgeted"], f["budgeted"].get("error")
    assert f["disk_budget_bytes"] == int(0.6 * f["packed_bytes"])
    assert f["disk_used_bytes"] == f["budgeted"]["disk_used_bytes"] <= f["disk_budget_bytes"]
    assert f["budgeted"]["segment_size"] >= 2


def test_outputs_removed_dataset_kept(figures: tuple[dict, Path, str]) -> None:
    _, data, _ = figures
    left = sorted(p.name for p in data.iterdir())
    assert "raw" in left and "store" in left
    assert not [n for n in left if n.startswith(("packed", "scratch", "bw-scratch"))], left


def test_bad_option_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "prepare", "--cpu-fraction", "1.5", "--workdir", str(tmp_path)])
    assert rc == 2
    assert "--cpu-fraction" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_scaling_ceilings() -> None:
    """The ceiling divides the CPU-bound phases among the workers and keeps each pack phase as measured."""
    from diskflow.bench.prepare import _scaling_ceilings
    c = _scaling_ceilings(8.0, 4.0, 4.0, 2, 10_000_000)
    assert c["ceiling"] == pytest.approx(12.0 / 8.0)                 # (8 + 4) / (8/2 + 4)
    assert c["ceiling_at_target"] == pytest.approx(6.0 / 5.0)        # 10M accesses at 5M/s: (2 + 4) / (2/2 + 4)
    assert _scaling_ceilings(8.0, 0.0, 0.0, 2, 1)["ceiling"] == pytest.approx(2.0)   # no disk pass: the cores
