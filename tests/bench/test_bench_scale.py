"""Smoke test of `diskflow bench scale` at a tiny size: the four phases run end to end through the CLI,
each in its own memory cgroup where the machine has them, and the figures are complete and consistent;
the byte plan and the budget fail early, in one line, before anything is written."""
from __future__ import annotations

import json
import os
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

import pytest
from diskflow.bench import cgroup
from diskflow.bench.scale import MARKER, PHASES, byte_plan, worst_batch_rows
from diskflow.cli import main
from mounts import skip_where_reads_are_not_counted

CGROUPS = cgroup.unavailable_reason() is None
NO_CGROUP = [] if CGROUPS else ["--no-cgroup"]      # without root: no memory cgroups, and the bench would say so first
NODES, DIM = 60_000, 32
TINY = ["--nodes", str(NODES), "--dim", str(DIM), "--train-frac", "0.03", "--batch-size", "128", "--fanouts", "4,4",
        "--superbatch-size", "4", "--part-nodes", "20000", "--hidden", "16", "--feature-budget", "5MiB",
        "--threads", "1", "--bw-bytes", str(16 << 20), "--workers", "1"]
GROUPS = {"synth": {"synth"}, "ingest": {"ingest-nodes", "ingest-scan-edges", "ingest-csc", "ingest-feature-shard"},
          "prepare": {"sample", "count", "tiers", "trace", "plan", "route", "pack", "index"}, "train": {"train-epoch"}}


def _leftovers() -> list[str]:
    h = cgroup.find_hierarchy()
    return [] if h is None else sorted(p.name for p in h.root.glob(f"{cgroup.PREFIX}scale-*-{os.getpid()}"))


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    """One run of the bench, with free space for the ingest peak but not for raw + store + packed: the raw
    input is deleted after ingest (the plan's choice without that is `test_byte_plan`'s)."""
    from diskflow.bench import scale

    base = tmp_path_factory.mktemp("bench-scale")
    out = base / "figures.json"
    plan = byte_plan(NODES, DIM, 4, 15.0, 0.03, 128, (4, 4), 5 << 20, 1 << 30, 16 << 20)
    assert plan.ingest_peak < plan.raw + plan.store + plan.packed
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scale, "_free", lambda _: plan.raw + plan.store + plan.packed - 1 + scale.DISK_RESERVE)
        rc, printed, err = _cli(["bench", "scale", *TINY, "--workdir", str(base / "w"), "--json", str(out), *NO_CGROUP])
    assert rc == 0, err
    return json.loads(out.read_text()), printed, base / "w"


def test_every_phase_has_its_figures(scaled: tuple[dict, str, Path]) -> None:
    f, printed, _ = scaled
    assert sorted(f["phases"]) == sorted(PHASES)          # (the JSON's keys are sorted; the table's are not)
    rows = [line.split()[0] for line in printed.splitlines() if line.split()[:1] and line.split()[0] in PHASES]
    assert rows[:4] == list(PHASES)
    for name, p in f["phases"].items():
        assert p["wall_s"] > 0 and p["cpu_s"] > 0, name
        assert p["floor_s"] == pytest.approx(p["read_bytes"] / f["seq_read_bw"] + p["write_bytes"] / f["seq_write_bw"])
        assert p["over_floor"] is None or p["over_floor"] == pytest.approx(p["wall_s"] / p["floor_s"])
        assert p["write_bytes"] == p["dirtied_bytes"] - p["cancelled_write_bytes"] >= 0, name
        assert GROUPS[name] <= set(p["tasks"]), (name, sorted(p["tasks"]))
        assert all(v["tasks"] >= 1 and v["peak_rss_bytes"] > 0 and v["peak_anon_bytes"] > 0
                   for v in p["tasks"].values()), name
        assert p["peak_task_anon_bytes"] == max(v["peak_anon_bytes"] for v in p["tasks"].values()), name
        assert p["peak_task_rss_bytes"] == max(v["peak_rss_bytes"] for v in p["tasks"].values()), name
        assert p["tasks"][p["peak_task"]]["peak_rss_bytes"] == p["peak_task_rss_bytes"], name
        assert f"{name} " in printed, name
    for name in ("synth", "ingest", "prepare"):
        p = f["phases"][name]
        assert p["files_created"] > 0 and p["bytes_created"] > 0, name
        assert len(p["workers"]) == f["workers"] and all(w["baseline_rss_bytes"] > 0 for w in p["workers"]), name
        assert p["workers_io_counted"] is True, name         # the reaped workers' I/O is inside the child's
        for v in p["tasks"].values():        # a task's peak includes the baseline of the worker it ran on
            assert v["peak_rss_bytes"] >= min(w["baseline_rss_bytes"] for w in p["workers"]) // 2
    assert f["peak_task_rss_bytes"] == max(p["peak_task_rss_bytes"] for p in f["phases"].values())
    assert f["peak_task_anon_bytes"] == max(p["peak_task_anon_bytes"] for p in f["phases"].values())
    assert "peak RSS per task" in printed and "largest task" in printed


def test_dataset_prepare_and_train_agree(scaled: tuple[dict, str, Path]) -> None:
    f, _, _ = scaled
    ds, pr, tr = f["dataset"], f["prepare"], f["train"]
    assert ds["nodes"] == NODES and ds["dim"] == DIM and f["feature_bytes"] == NODES * DIM * 4
    assert f["features_over_ram"] == pytest.approx(f["feature_bytes"] / f["ram_bytes"])
    assert pr["batches"] == -(-ds["train"] // 128) == tr["batches"] > 1
    assert pr["max_batch_rows"] <= worst_batch_rows(NODES, 128, (4, 4))
    assert pr["misses"] > 0 and pr["packed_bytes"] >= pr["plan_miss_bytes"] == pr["misses"] * DIM * 4
    assert pr["cpu_rows"] * DIM * 4 < f["feature_budget_bytes"] == 5 << 20
    assert tr["losses_finite"] and tr["loss"] > 0 and 0 <= tr["train_acc"] <= 1
    assert tr["epoch"]["batches"] == tr["batches"] and tr["epoch"]["seconds"] > 0
    # the byte plan bounds what was written
    plan = f["byte_plan"]
    assert plan["raw"] >= f["raw_bytes"] and plan["store"] >= f["store_bytes"] and plan["packed"] >= f["packed_bytes_on_disk"]
    assert 0 < f["disk_peak_bytes"]


def test_the_raw_input_goes_when_the_packed_dataset_needs_its_room(scaled: tuple[dict, str, Path]) -> None:
    f, printed, _ = scaled
    assert f["byte_plan"]["free_raw_planned"] and f["raw_freed_bytes"] == f["raw_bytes"] > 0
    assert "the raw input is deleted after ingest" in printed and "raw input deleted after ingest" in printed
    assert f["train"]["losses_finite"]


def test_disk_traffic(scaled: tuple[dict, str, Path]) -> None:
    f, _, work = scaled
    skip_where_reads_are_not_counted(work.parent)
    ph = f["phases"]
    assert ph["synth"]["write_bytes"] >= f["feature_bytes"]                # the raw input went to the disk
    assert ph["ingest"]["read_bytes"] >= f["feature_bytes"]                # and was read back, evicted first
    assert ph["ingest"]["write_bytes"] >= f["feature_bytes"]
    assert ph["prepare"]["read_bytes"] >= f["feature_bytes"]               # one pass over the shards
    assert ph["prepare"]["write_bytes"] >= f["prepare"]["plan_miss_bytes"]
    assert ph["train"]["read_bytes"] >= f["train"]["epoch"]["read_bytes"] >= f["prepare"]["plan_miss_bytes"]


def test_memory_limits(scaled: tuple[dict, str, Path]) -> None:
    f, printed, _ = scaled
    ph = f["phases"]
    if not CGROUPS:
        assert f["no_cgroup"] and all(p["cgroup_limit_bytes"] is None for p in ph.values())
        assert "NO memory limits" in printed
        return
    topology = f["topology_bytes"]
    assert ph["prepare"]["cgroup_limit_bytes"] == topology + f["workers"] * (2 << 30) == f["prepare_cgroup_limit_bytes"]
    assert ph["synth"]["cgroup_limit_bytes"] == ph["ingest"]["cgroup_limit_bytes"] == f["cgroup_limit_bytes"]
    assert f["cgroup_limit_bytes"] >= f["prepare_cgroup_limit_bytes"]            # planned topology >= actual
    assert ph["train"]["cgroup_limit_bytes"] == f["feature_budget_bytes"] + f["allowance"]["allowance_bytes"]
    assert f["allowance"]["allowance_bytes"] >= 1.25 * f["allowance"]["probe_rss_bytes"]
    for name, p in ph.items():
        assert p["cgroup_limit_bytes"] >= p["cgroup_peak_bytes"] > 0 and not p["oom_kills"], name
        assert p["peak_task_rss_bytes"] < p["cgroup_limit_bytes"], name
        assert p["peak_task_anon_bytes"] < p["cgroup_limit_bytes"], name
        assert p["child_cgroup"].endswith(f"scale-{name}-{os.getpid()}"), name
    for name in ("synth", "ingest", "prepare"):                # the Dask workers are in the phase's cgroup
        assert ph[name]["workers_in_cgroup"] is True, name
    assert f["peak_task_rss_under_limit"] is True and "below its phase's cgroup limit" in printed
    assert _leftovers() == []


def test_the_work_directory_is_removed(scaled: tuple[dict, str, Path]) -> None:
    _, printed, work = scaled
    assert not work.exists() and "kept:" not in printed


def test_byte_plan() -> None:
    p = byte_plan(1_000_000, 128, 4, 10.0, 0.01, 1000, (5, 5), 50 << 20, 1 << 30, 1 << 30)
    features = 1_000_000 * 128 * 4
    assert p.raw > features and p.store > features and p.spill > 0 and p.packed > 50 << 20
    assert p.ingest_peak == p.raw + p.store + p.spill
    assert p.peak(free_raw=False) == max(p.scratch, p.ingest_peak, p.raw + p.store + p.packed)
    assert p.peak(free_raw=True) == max(p.scratch, p.ingest_peak, p.store + p.packed)
    assert p.needs_free_raw(p.raw + p.store + p.packed - 1) and not p.needs_free_raw(p.raw + p.store + p.packed)


def test_too_little_disk_fails_early_in_one_line(tmp_path: Path) -> None:
    work = tmp_path / "w"
    rc, _, err = _cli(["bench", "scale", "--nodes", "2000000000", "--dim", "4096", "--workdir", str(work), *NO_CGROUP])
    assert rc == 2 and err.count("\n") == 1
    assert "--workdir: the run needs" in err and "free" in err and "lower --nodes or --dim" in err
    assert not work.exists()                                    # nothing was written, nothing is left


def test_too_small_a_feature_budget_fails_early(tmp_path: Path) -> None:
    rc, _, err = _cli(["bench", "scale", "--nodes", "200000", "--dim", "64", "--workdir", str(tmp_path / "w"),
                       *NO_CGROUP])
    assert rc == 2 and "--feature-budget:" in err and "give more than" in err
    assert not (tmp_path / "w").exists()


def test_a_work_directory_holding_other_outputs_is_refused(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    rc, _, err = _cli(["bench", "scale", *TINY, "--workdir", str(tmp_path), *NO_CGROUP])
    assert rc == 2 and "--workdir:" in err and "store" in err and MARKER in err
    assert (tmp_path / "store").is_dir()


def _hold(nbytes: int, seen: bool) -> int:
    """Hold `nbytes` (touched: resident); `seen`: until the worker plugin's sampler thread, which reads the
    process's anonymous memory every few milliseconds, has seen them above the worker's baseline (at most 60 s,
    then an AssertionError)."""
    import time

    import numpy as np
    from diskflow.bench.taskmemory import TaskMemory
    from distributed import get_worker

    plugin = get_worker().plugins[TaskMemory.name]
    a = np.ones(nbytes // 8)
    deadline = time.monotonic() + 60
    while seen and plugin.anon._max < plugin.baseline_anon + nbytes:    # the sampler's peak, not a sample of ours
        assert time.monotonic() < deadline, f"the sampler did not see {nbytes} bytes held within 60 s"
        time.sleep(0.005)
    return int(a[-1])


def test_task_memory_sees_what_each_task_holds() -> None:
    """The worker plugin's per-task peaks: a task holding 200 MiB shows it, a tiny task after it does not."""
    from diskflow.bench.scale import _measured_cluster
    from distributed import default_client

    with _measured_cluster(1) as out:
        client = default_client()
        assert client.submit(_hold, 200 << 20, True, key="big-1").result() == 1
        assert client.submit(_hold, 1 << 20, False, key="small-1").result() == 1
    (w,) = out["workers"]
    big, small = w["groups"]["big"], w["groups"]["small"]
    assert big["tasks"] == small["tasks"] == 1 and w["hwm_resettable"]
    assert big["peak_rss_bytes"] >= w["baseline_rss_bytes"] + (200 << 20)
    assert big["peak_anon_bytes"] >= w["baseline_anon_bytes"] + (200 << 20)
    assert small["peak_rss_bytes"] < big["peak_rss_bytes"] - (150 << 20)    # the HWM was reset in between
    assert small["peak_anon_bytes"] < big["peak_anon_bytes"] - (150 << 20)
