"""Smoke test of `diskflow bench pyg` on the tiny store (real memory cgroups where the machine has them): the
JSON's keys and invariants, and its one-line errors."""
from __future__ import annotations

import json
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest
from diskflow.bench import cgroup
from diskflow.bench.pyg import VARIANTS, allowance_for
from diskflow.cli import main

CGROUPS = cgroup.unavailable_reason() is None
BUDGET = 400 << 10
# The allowance is given (the probe would be one more process to start); 1 GiB holds torch, PyG and the tiny store.
TINY = ["--fanouts", "4,4", "--batch-size", "128", "--warmup", "1", "--batches", "3", "--repeats", "1",
        "--feature-budget", "400KiB", "--allowance", "1GiB"]


def test_bench_pyg_figures(tiny_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    printed = StringIO()
    argv = ["bench", "pyg", "--dataset", str(tiny_store), *TINY, "--workdir", str(tmp_path / "w"), "--json", str(out)]
    with redirect_stdout(printed):
        assert main(argv + ([] if CGROUPS else ["--no-cgroup"])) == 0
    f = json.loads(out.read_text())
    assert {"params", "batches_per_s", "disk_read_bytes", "remote_over_mmap", "remote_over_inmemory", "same_batches",
            "targets", "variants", "runs"} <= set(f)
    p = f["params"]
    assert p["budget_bytes"] == BUDGET and p["allowance_bytes"] == 1 << 30 and not p["allowance_measured"]
    assert p["limit_bytes"] == ((1 << 30) + BUDGET if CGROUPS else None) and p["cgroup"] is CGROUPS
    assert p["fanouts"] == [4, 4] and p["batch_size"] == 128 and p["batches"] == 3 and p["warmup"] == 1
    for v in VARIANTS:
        r = f["variants"][v]
        assert "error" not in r and r["returncode"] == 0, v
        assert f["batches_per_s"][v] == r["batches_per_s"] > 0 and r["batches"] == 3, v
        assert f["disk_read_bytes"][v] == r["disk_read_bytes"] >= 0, v
        assert r["requested_bytes"] == r["rows"] * p["row_bytes"], v
        assert r["limit_bytes"] == (p["limit_bytes"] if v != "inmemory" else None), v
    rows = {f["variants"][v]["rows"] for v in VARIANTS}
    assert len(rows) == 1 and f["same_batches"] is True       # the very same batches in every variant
    assert f["remote_over_mmap"] == pytest.approx(f["batches_per_s"]["remote"] / f["batches_per_s"]["mmap"])
    assert f["remote_over_inmemory"] == pytest.approx(f["batches_per_s"]["remote"] / f["batches_per_s"]["inmemory"])
    target = f["targets"]["remote_over_mmap"]
    assert target["op"] == ">=" and target["value"] == 3.0 and target["met"] == (f["remote_over_mmap"] >= 3.0)
    cache = f["variants"]["remote"]["cache"]
    assert cache["total_bytes"] <= BUDGET == cache["budget"] and cache["rows"] >= f["variants"]["remote"]["rows"]
    assert cache["bytes_read"] > 0         # the warm-up batch at least read from the disk, with O_DIRECT
    assert "remote / mmap batches per second" in printed.getvalue()


def test_bench_pyg_errors_are_one_line(tiny_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    base = ["bench", "pyg", "--dataset", str(tiny_store), "--workdir", str(tmp_path / "w")]
    assert main([*base, "--feature-budget", "10%"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("diskflow bench: error: --feature-budget: ") and \
        "the smallest budget that works is" in err[0]
    assert main([*base, "--batches", "0"]) == 2
    assert capsys.readouterr().err.strip() == "diskflow bench: error: --batches: must be >= 1, got 0"


def test_allowance_is_the_probes_peak_plus_a_quarter_rounded_up() -> None:
    assert allowance_for(100 << 20) == 128 << 20 and allowance_for(96 << 20) == 128 << 20
    assert allowance_for(1) == 16 << 20
