"""Smoke test of `diskflow bench compare` on a tiny store, and of the cgroup helper: limits, OOM kills, true disk
reads, timeouts, clean-up.

Every pipeline, with a user's pipeline file and one whose preparation fails, runs in one compare whose children
run in this test's process (``--no-cgroup``, tests/bench_children.py): a child process costs some 5 CPU seconds
of importing torch and PyG alone, and compare starts two per pipeline. One compare of belady alone runs its
children as processes, in real memory cgroups where the machine has them (`belady_in_children`)."""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest
from bench_children import compare_children_in_this_process
from diskflow.bench import cgroup
from diskflow.bench.common import drop_page_cache
from diskflow.cli import main
from mounts import reads_are_counted, skip_where_reads_are_not_counted
from user_pipeline import USER_PIPELINE

from diskflow.errors import ConfigError

CGROUPS = cgroup.unavailable_reason() is None
TINY = ["--fanouts", "4,4", "--batch-size", "128", "--superbatch-size", "4", "--epochs", "2", "--hidden", "16",
        "--feature-budget", "3500KiB", "--threads", "1", "--bw-bytes", str(1 << 20), "--staleness-sweep", "1,100"]
KEYS = ("data_epoch_s", "epoch_s", "disk_read_bytes", "plan_miss_bytes", "read_amplification", "peak_rss_bytes",
        "test_acc", "losses")
BUILT_IN = ["belady", "belady_outre", "belady_outre_s1", "diskgnn", "ginex", "gnndrive",
            "inmemory", "lsmgnn", "mmap", "outre"]
# samples of its own (partition batches), so prepared just before its runs; a cache of one byte holds no
# embedding, so that preparation fails
BAD_PIPELINE = 'from diskflow import Pipeline\nPIPELINE = Pipeline("bad_outre", batches="partition", history_memory="1B")\n'
ENCODED = ["belady_float16", "belady_int8"]     # belady with its rows encoded (--rows, default float16,int8)
DEFAULT_RUN = sorted([*BUILT_IN, *ENCODED, "every-other", "bad_outre"])
# ratios of bytes read from the disk (/proc/<pid>/io: 0 on tmpfs), checked with the disk traffic
DISK_RATIOS = ("belady_data_vs_disk_floor", "belady_over_outre_bytes", "lsmgnn_disk_over_belady_plan")


def _leftovers() -> list[str]:
    h = cgroup.find_hierarchy()
    return [] if h is None else sorted(p.name for p in h.root.glob(f"{cgroup.PREFIX}*-{os.getpid()}"))


@pytest.fixture(scope="module")
def compared(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict, str, Path]]:
    """Every built-in pipeline, a user's file and a failing one, their children in this process."""
    work = tmp_path_factory.mktemp("bench-compare")
    (work / "every_other.py").write_text(USER_PIPELINE)
    (work / "bad.py").write_text(BAD_PIPELINE)
    out = work / "figures.json"
    printed = StringIO()
    pipelines = ",".join(["inmemory", "mmap", "ginex", "diskgnn", "belady", "gnndrive", "lsmgnn", "belady_outre",
                          "outre", str(work / "every_other.py"), str(work / "bad.py")])
    argv = ["bench", "compare", "--dataset", str(tiny_store), *TINY, "--workdir", str(work / "w"), "--json", str(out),
            "--pipelines", pipelines, "--no-cgroup"]
    with compare_children_in_this_process(), redirect_stdout(printed):
        rc = main(argv)
    assert rc == 0, printed.getvalue()[-3000:]
    yield json.loads(out.read_text()), printed.getvalue(), work / "w"


@pytest.fixture(scope="module")
def belady_in_children(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    """belady alone, its allowance probe and runs in child processes, in memory cgroups where there are some."""
    work = tmp_path_factory.mktemp("bench-compare-children")
    out = work / "figures.json"
    printed = StringIO()
    argv = ["bench", "compare", "--dataset", str(tiny_store), *TINY, "--workdir", str(work / "w"), "--json", str(out),
            "--pipelines", "belady", "--rows", ""]
    with redirect_stdout(printed):
        rc = main(argv + ([] if CGROUPS else ["--no-cgroup"]))
    assert rc == 0, printed.getvalue()[-3000:]
    return json.loads(out.read_text()), printed.getvalue(), work / "w"


def test_the_default_is_every_built_in_pipeline() -> None:
    import argparse

    from diskflow.bench import compare

    parser = argparse.ArgumentParser()
    compare.add_arguments(parser)
    args = parser.parse_args([])
    assert sorted(args.pipelines.split(",")) == sorted(n for n in BUILT_IN if "_s" not in n)


def test_every_pipeline_has_its_figures(compared: tuple[dict, str, Path]) -> None:
    f, printed, _ = compared
    assert sorted(f["pipelines"]) == DEFAULT_RUN
    for name, p in f["pipelines"].items():
        if name == "bad_outre":
            continue
        for key in KEYS:
            assert key in p, (name, key)
        assert p["data_epoch_s"] > 0 and p["epoch_s"] > 0 and p["peak_rss_bytes"] > 0, name
        assert p["errors"] is None and p["cut_short"] is None, name
        assert [len(e) for e in p["losses"]] == [f["batches_per_epoch"]] * 2, name
    assert f["seq_read_bw"] > 0 and f["loader_read_bw"] > 0 and f["pipelines"]["belady"]["sequential_epoch_s"] > 0
    assert set(f["ratios"]) == {"belady_data_vs_inmemory", "ginex_over_belady", "mmap_over_belady",
                                "belady_model_vs_inmemory", "pipelined_speedup", "pipelined_speedup_io_bound",
                                "belady_io_model_vs_data", "loader_over_seq_bw", "belady_data_vs_disk_floor",
                                "belady_over_outre_bytes", "outre_acc_gap_points", "ginex_over_gnndrive",
                                "mmap_over_gnndrive", "lsmgnn_misses_over_belady_plan", "lsmgnn_disk_over_belady_plan",
                                *(f"{n}_{k}" for n in ENCODED for k in ("bytes_vs_exact", "data_vs_exact",
                                                                        "acc_gap_points"))}
    bel = f["pipelines"]["belady"]
    assert bel["io_model"] == "mlp" and bel["io_model_epoch_s"] > 0 and bel["io_sequential_epoch_s"] > 0
    assert f["ratios"]["pipelined_speedup_io_bound"] == pytest.approx(
        bel["io_sequential_epoch_s"] / bel["io_model_epoch_s"])
    for name, p in f["pipelines"].items():
        if name != "bad_outre":
            assert p["disk_floor_s"] == pytest.approx(p["disk_read_bytes"] / 2 / f["seq_read_bw"]), name
    assert all(v > 0 for k, v in f["ratios"].items()       # a gap may be <= 0; encoded rows may read nothing
               if k not in ("outre_acc_gap_points", *DISK_RATIOS) and not k.endswith(("_acc_gap_points", "_bytes_vs_exact")))
    for line in ("belady data path / inmemory data path", "ginex / belady data path", "mmap / belady data path",
                 "belady sequential / pipelined sage epoch", "belady sequential / pipelined mlp epoch, I/O-bound, 1 torch thread",
                 "loader read bw"):
        assert line in printed


def test_encoded_rows_beside_exact_belady(compared: tuple[dict, str, Path]) -> None:
    """belady_float16 and belady_int8: the same samples, fewer bytes a row, at least exact's CPU-tier rows."""
    f, printed, _ = compared
    enc = f["encoded_rows"]
    assert sorted(enc) == ENCODED
    assert enc["belady_float16"]["row_bytes"] * 2 == enc["belady_float16"]["exact_row_bytes"]
    assert enc["belady_int8"]["row_bytes"] == enc["belady_int8"]["exact_row_bytes"] // 4 + 4
    for name, e in enc.items():
        assert e["cpu_rows"] >= e["exact_cpu_rows"] and e["cpu_hit_rate"] >= e["exact_cpu_hit_rate"], name
        assert e["test_acc"] is not None and e["data_vs_exact"] > 0, name
        assert e["acc_gap_points"] == pytest.approx(100 * (e["exact_test_acc"] - e["test_acc"])), name
        assert len(f["pipelines"][name]["losses"][0]) == f["batches_per_epoch"], name
    assert "belady with encoded rows, beside exact belady" in printed
    assert "belady int8 rows / exact: disk bytes" in printed


def test_data_paths_alone(tiny_store: Path, tmp_path: Path) -> None:
    """--no-model: belady and its encoded rows' data paths, no GraphSAGE run (no epochs, no accuracy)."""
    out = tmp_path / "figures.json"
    argv = ["bench", "compare", "--dataset", str(tiny_store), *TINY, "--workdir", str(tmp_path / "w"), "--json", str(out),
            "--pipelines", "belady", "--no-cgroup", "--no-model"]
    with compare_children_in_this_process(), redirect_stdout(StringIO()):
        assert main(argv) == 0
    f = json.loads(out.read_text())
    assert f["config"]["no_model"] is True and sorted(f["pipelines"]) == ["belady", *ENCODED]
    for name, p in f["pipelines"].items():
        assert p["data_epoch_s"] > 0 and p["epoch_s"] is None and p["test_acc"] is None, name
    assert f["ratios"]["belady_int8_data_vs_exact"] > 0 and f["ratios"]["belady_int8_acc_gap_points"] is None


def test_same_samples_same_losses(compared: tuple[dict, str, Path]) -> None:
    f, printed, _ = compared
    p = f["pipelines"]
    assert f["samples_identical"] and f["losses_identical"] is True
    assert "identical epoch by epoch: yes" in printed
    for name in ("diskgnn", "ginex", "mmap", "gnndrive", "lsmgnn", "every-other"):   # exact: the very same training
        assert p[name]["losses"] == p["inmemory"]["losses"], name
        assert p[name]["test_acc"] == p["inmemory"]["test_acc"], name


def test_online_pipelines_columns_and_crossover(compared: tuple[dict, str, Path]) -> None:
    f, printed, _ = compared
    p = f["pipelines"]
    assert f["online_losses_identical"] == {"gnndrive": True, "lsmgnn": True}
    for name in ("gnndrive", "lsmgnn"):
        o = p[name]["online"]
        assert o["policy"] == {"gnndrive": "lru", "lsmgnn": "hybrid"}[name] and o["rows"] == o["hits"] + o["misses"]
        assert o["read_unit"] in (512, 4096) and o["gap_bytes"] > 0
        assert o["memory"]["total_bytes"] <= f["feature_budget_bytes"]
        assert p[name]["prepare_s"] == 0.0 and p[name]["plan_miss_bytes"] is None
        assert p[name]["disk_read_bytes"] is not None and p[name]["first_batch_s"] > 0
        assert f"losses of {name} and inmemory identical epoch by epoch: yes" in printed
    for name, q in p.items():       # total time to train E epochs, preparation included
        if name == "bad_outre":
            continue
        assert q["first_batch_s"] > 0, name
        if name in ("belady", "ginex", "diskgnn", "every-other"):
            assert q["prepare_s"] > 0, name
        for e in (1, 10):
            assert q["total_s"][str(e)] == pytest.approx(q["prepare_s"] + e * q["epoch_s"]), (name, e)
    row_bytes = f["feature_bytes"] // f["dataset"]["nodes"]
    assert p["lsmgnn"]["online"]["miss_bytes"] == p["lsmgnn"]["online"]["misses"] * row_bytes
    assert f["ratios"]["lsmgnn_misses_over_belady_plan"] == pytest.approx(
        p["lsmgnn"]["online"]["miss_bytes"] / p["belady"]["plan_miss_bytes"])
    bel, g = p["belady"], p["gnndrive"]
    for key, epoch in (("crossover_epochs", "epoch_s"), ("crossover_epochs_data", "data_epoch_s")):
        cross = f[key]["gnndrive"]
        if g[epoch] > bel[epoch]:
            assert bel["prepare_s"] + cross * bel[epoch] < cross * g[epoch]
            assert bel["prepare_s"] + (cross - 1) * bel[epoch] >= (cross - 1) * g[epoch]
        else:
            assert cross is None
    assert "with the data path alone" in printed
    for column in ("first batch s", "1 ep. + prep s", "10 ep. + prep s", "ginex / gnndrive data path",
                   "mmap / gnndrive data path", "lsmgnn cache misses / belady plan misses"):
        assert column in printed


def test_outre_pipelines_and_the_staleness_sweep(compared: tuple[dict, str, Path]) -> None:
    from diskflow.flow.memsplit import SPLIT_SHARES

    f, printed, _ = compared
    p = f["pipelines"]
    for name in ("belady_outre", "outre", "belady_outre_s1"):
        assert p[name]["batches"] == "partition" and p[name]["partition"]["parts"] >= 2, name
        assert p[name]["losses"] != p["inmemory"]["losses"], name
        split = p[name]["memory_split"]           # the OUTRE pipelines split the feature budget automatically
        shares = [q["share"] for q in split["curve"]]
        grid = [x for x in shares if x in SPLIT_SHARES]                # the grid, then its refinement
        assert shares[0] == 0 and shares[:len(grid)] == grid and len(shares) - len(grid) <= 2, name
        chosen = split["chosen"]
        assert chosen["disk_bytes"] == min(q["disk_bytes"] for q in split["curve"]) == p[name]["plan_miss_bytes"], name
        assert (p[name]["history"] is not None) == (chosen["history_rows"] > 0), name
        assert split["curve"][0]["disk_bytes"] == p["belady_outre"]["memory_split"]["curve"][0]["disk_bytes"] \
            or name == "outre"                    # no embedding cache: the same partition batches, whatever S
    # one partition of the store for all of them: computed by the first prepared, linked into the others' caches,
    # and counted in every one's preparation time
    parts = {n: p[n]["partition"] for n in ("belady_outre", "outre", "belady_outre_s1")}
    assert sorted(x["cached"] for x in parts.values()) == [False, True, True]
    assert len({x["seconds"] for x in parts.values()}) == 1
    for n in parts:
        assert f["prepare"][n]["seconds"] >= parts[n]["seconds"], n
    assert "the partition of an earlier pipeline" in printed
    # staleness 1 never reuses an embedding: the split searches share 0 alone
    s1 = p["belady_outre_s1"]["memory_split"]
    assert [q["share"] for q in s1["curve"]] == [0.0] and s1["chosen"]["pruned"] == 0
    assert p["belady_outre_s1"]["history"] is None
    assert p["belady_outre"]["plan_miss_bytes"] <= p["belady_outre_s1"]["plan_miss_bytes"]   # S=100 can do what S=1 does
    sweep = f["staleness_sweep"]
    assert [(x["staleness"], x["pipeline"]) for x in sweep] == [(1, "belady_outre_s1"),
                                                               (100, "belady_outre")]
    for x in sweep:
        assert x["disk_read_bytes_per_epoch"] == p[x["pipeline"]]["disk_read_bytes"] / 2
        assert x["test_acc"] == p[x["pipeline"]]["test_acc"] and x["epoch_s"] > 0
    assert f["ratios"]["outre_acc_gap_points"] == pytest.approx(
        100 * (p["inmemory"]["test_acc"] - p["belady_outre"]["test_acc"]))
    acc = f["accuracy"]              # every pipeline's accuracy beside inmemory's, at the same epochs
    assert acc["epochs"] == 2 and acc["inmemory_test_acc"] == p["inmemory"]["test_acc"]
    for name in ("belady", "belady_outre", "outre"):
        a = acc["pipelines"][name]
        assert a["test_acc"] == p[name]["test_acc"]
        assert a["gap_points"] == pytest.approx(100 * (p["inmemory"]["test_acc"] - p[name]["test_acc"]))
    assert acc["pipelines"]["belady"]["gap_points"] == 0            # the same losses, so the same model
    assert [x["gap_points"] for x in sweep] == [acc["pipelines"][x["pipeline"]]["gap_points"] for x in sweep]
    for line in ("belady_outre at other history staleness thresholds", "belady disk read / belady_outre disk read",
                 "inmemory test acc - belady_outre test acc", "memory split: ", "beside inmemory's (gap"):
        assert line in printed


def test_disk_traffic_and_amplification(compared: tuple[dict, str, Path]) -> None:
    f, _, work = compared
    skip_where_reads_are_not_counted(work)
    p = f["pipelines"]
    assert p["inmemory"]["disk_read_bytes"] == 0 and p["inmemory"]["read_amplification"] is None
    for name in ("belady", "diskgnn", "ginex", "every-other"):
        assert p[name]["plan_miss_bytes"] > 0 and p[name]["disk_read_bytes"] >= p[name]["plan_miss_bytes"], name
    assert p["belady"]["plan_miss_bytes"] == p["ginex"]["plan_miss_bytes"]      # the same Belady plan
    # ginex reads a 4 KiB page per 188-byte row; belady reads packed segments
    assert p["ginex"]["read_amplification"] > 4 * p["belady"]["read_amplification"] >= 4
    assert all(f["ratios"][k] > 0 for k in DISK_RATIOS)
    assert f["ratios"]["belady_over_outre_bytes"] == pytest.approx(
        p["belady"]["disk_read_bytes"] / p["belady_outre"]["disk_read_bytes"])


def test_a_pipeline_that_fails_to_prepare_is_reported_and_the_others_run(compared: tuple[dict, str, Path]) -> None:
    f, printed, _ = compared
    bad = f["pipelines"]["bad_outre"]
    assert "prepare" in next(iter(bad["errors"])) and next(iter(bad["errors"].values())).startswith("history_memory: ")
    assert bad["epoch_s"] is None and f["pipelines"]["belady"]["epoch_s"] > 0
    assert "bad_outre: prepare failed" in printed


def test_a_users_pipeline_file_is_compared(compared: tuple[dict, str, Path]) -> None:
    f, _, _ = compared
    mine = f["pipelines"]["every-other"]
    assert mine["losses"] == f["pipelines"]["inmemory"]["losses"]      # exact: only where rows come from differs
    assert mine["plan_miss_bytes"] > 0 and f["prepare"]["every-other"]["cpu_rows"] > 0


def test_children_in_processes(belady_in_children: tuple[dict, str, Path], compared: tuple[dict, str, Path]) -> None:
    """The runs in child processes give the figures the in-process ones give, and the same training."""
    f, _, work = belady_in_children
    assert sorted(f["pipelines"]) == ["belady"]
    p, here = f["pipelines"]["belady"], compared[0]["pipelines"]["belady"]
    for key in KEYS:
        assert key in p, key
    assert p["errors"] is None and p["data_epoch_s"] > 0 and p["epoch_s"] > 0 and p["sequential_epoch_s"] > 0
    assert p["peak_rss_bytes"] > 0 and p["io_model_epoch_s"] > 0
    assert p["losses"] == here["losses"] and p["test_acc"] == here["test_acc"]
    assert p["plan_miss_bytes"] == here["plan_miss_bytes"] > 0
    if reads_are_counted(work):
        assert p["disk_read_bytes"] >= p["plan_miss_bytes"]
    assert not (work / "runs").exists()


def test_memory_limits(belady_in_children: tuple[dict, str, Path]) -> None:
    f, printed, _ = belady_in_children
    if not CGROUPS:
        assert f["no_cgroup"] and f["cgroup_limit_bytes"] is None and "NO memory limits" in printed
        return
    assert f["cgroup"].startswith(("v1 ", "v2 ")) and not f["no_cgroup"]
    assert f["cgroup_limit_bytes"] == f["allowance_bytes"] + f["feature_budget_bytes"] == f["allowance_bytes"] + (3500 << 10)
    assert f["data_cgroup_limit_bytes"] == f["data_allowance_bytes"] + f["feature_budget_bytes"]
    assert f["allowance_bytes"] >= 1.25 * f["allowance_probe_rss_bytes"]
    # the data path is measured without the model: its probe peaks lower, and its allowance carries every
    # assembled batch (the model's carries the ones the probe did not hold)
    split = f["budget_split"]
    assert 0 < f["data_allowance_probe_rss_bytes"] <= f["allowance_probe_rss_bytes"]
    assert f["data_allowance_bytes"] >= 1.25 * f["data_allowance_probe_rss_bytes"] + \
        split["assembled_batches"] * split["assembled_batch_bytes"]
    assert "data path (--model none) limited to" in printed
    for name, p in f["pipelines"].items():
        if name == "inmemory":
            assert p["cgroup_limit_bytes"] is None and p["cgroup_peak_bytes"] is None
            assert p["data_cgroup_limit_bytes"] is None and p["data_cgroup_peak_bytes"] is None
        else:
            assert p["cgroup_limit_bytes"] == f["cgroup_limit_bytes"] >= p["cgroup_peak_bytes"] > 0, name
            assert p["data_cgroup_limit_bytes"] == f["data_cgroup_limit_bytes"] >= p["data_cgroup_peak_bytes"] > 0, name
    assert _leftovers() == []


def test_repeats_keep_each_runs_fastest() -> None:
    from diskflow.bench.compare import pipeline_figures

    def child(data_s: float, model_s: float, acc: float) -> dict:
        epochs = [{"seconds": data_s, "read_bytes": 100, "batches": 3}] * 2
        report = {"final": {"test_acc": acc}, "epochs": [{"losses": [1.0, 0.5]}] * 2}
        return {"runs": {"data": {"epochs": epochs, "partial": None, "report": None, "train_peak_rss_bytes": 5},
                         "model": {"epochs": [{**e, "seconds": model_s} for e in epochs], "partial": None,
                                   "report": report, "train_peak_rss_bytes": 7}},
                "groups": {"data": {"cgroup_peak_bytes": 8, "limit_bytes": 9},
                           "model": {"cgroup_peak_bytes": 9, "limit_bytes": 10}}}

    s = pipeline_figures([child(2.0, 5.0, 0.5), child(1.0, 6.0, 0.7)], 6, 2, None, None)
    assert (s["data_epoch_s"], s["epoch_s"], s["test_acc"]) == (1.0, 5.0, 0.5)
    assert s["data_epoch_s_repeats"] == [2.0, 1.0] and s["epoch_s_repeats"] == [5.0, 6.0]
    assert s["disk_read_bytes"] == 200 and s["peak_rss_bytes"] == 7 and s["losses_repeatable"] is True
    assert (s["data_cgroup_peak_bytes"], s["data_cgroup_limit_bytes"]) == (8, 9)
    assert (s["cgroup_peak_bytes"], s["cgroup_limit_bytes"]) == (9, 10)


def test_outputs_left(compared: tuple[dict, str, Path]) -> None:
    _, _, work = compared
    kept = ["belady", *ENCODED, "diskgnn", "every-other", "ginex"]    # the shared samples' datasets stay
    # the OUTRE ones (samples of their own) are removed with their caches once their runs are done, and the
    # one whose preparation failed leaves nothing
    assert sorted(p.name for p in (work / "packed").iterdir()) == sorted([*kept, *(f"{n}.work" for n in kept)])
    assert not (work / "runs").exists()        # run directories removed without --keep


def test_a_budget_that_cannot_hold_the_staging_is_one_clear_error(tiny_store: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "compare", "--dataset", str(tiny_store), *TINY, "--workdir", str(tmp_path)]
    rc = main([*argv, "--feature-budget", "10%", "--no-cgroup"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "--feature-budget: 75.47 KiB (10.0% of the 754.75 KiB of features) cannot hold the trainer's 4 staging " \
           "buffers of 316.00 KiB (1.23 MiB) and 2.00 MiB of I/O buffers with any CPU tier; the smallest budget " \
           "that works is 3.23 MiB" in err
    assert not (tmp_path / "packed").exists()
    assert main([*argv, "--pipelines", "belady,pyg"]) == 2
    assert "--pipelines" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the cgroup helper

def test_hierarchy_from_the_mount_table(tmp_path: Path) -> None:
    v1 = "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\ncgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
    assert cgroup.find_hierarchy(v1) == cgroup.Hierarchy(1, Path("/sys/fs/cgroup/memory"))
    (tmp_path / "cgroup.controllers").write_text("cpu io memory pids\n")
    assert cgroup.find_hierarchy(f"cgroup2 {tmp_path} cgroup2 rw 0 0\n") == cgroup.Hierarchy(2, tmp_path)
    (tmp_path / "cgroup.controllers").write_text("cpu io\n")
    assert cgroup.find_hierarchy(f"cgroup2 {tmp_path} cgroup2 rw 0 0\n") is None
    assert cgroup.find_hierarchy("proc /proc proc rw 0 0\n") is None

def test_unavailable_reason_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert f"cannot create cgroups under {tmp_path / 'none'}" in str(
        cgroup.unavailable_reason(cgroup.Hierarchy(2, tmp_path / "none")))
    assert cgroup.unavailable_reason(cgroup.Hierarchy(2, tmp_path)) is None        # a writable root
    monkeypatch.setattr(cgroup, "find_hierarchy", lambda *_: None)
    assert "no memory cgroup hierarchy is mounted" in str(cgroup.unavailable_reason())


def test_current_cgroup_of_a_process() -> None:
    text = "4:memory:/a/b\n3:cpuset:/\n0::/u/v\n"
    assert cgroup.current_procs(cgroup.Hierarchy(1, Path("/m")), text) == Path("/m/a/b/cgroup.procs")
    assert cgroup.current_procs(cgroup.Hierarchy(2, Path("/u")), text) == Path("/u/u/v/cgroup.procs")
    assert cgroup.current_procs(cgroup.Hierarchy(1, Path("/m")), "0::/x\n") is None


def test_v2_limits_are_written(tmp_path: Path) -> None:
    (tmp_path / "cgroup.subtree_control").write_text("memory\n")
    (tmp_path / "cgroup.controllers").write_text("memory\n")
    cg = cgroup.MemoryCgroup.create("x", 123 << 20, cgroup.Hierarchy(2, tmp_path))
    assert cg.path == tmp_path / f"diskflow-x-{os.getpid()}" and cg.version == 2
    assert (cg.path / "memory.max").read_text() == str(123 << 20)
    assert cg.wrap(["python", "-c", "pass"])[:2] == ["/bin/sh", "-c"]
    assert cg.wrap(["python", "-c", "pass"])[3:] == [str(cg.path / "cgroup.procs"), "python", "-c", "pass"]


def test_unavailable_cgroups_are_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--no-cgroup: memory cgroups are unavailable"):
        cgroup.MemoryCgroup.create("x", 1 << 30, cgroup.Hierarchy(2, tmp_path / "missing"))


@pytest.mark.skipif(not CGROUPS, reason=f"memory cgroups unavailable: {cgroup.unavailable_reason()}")
def test_a_limited_child_is_killed_beyond_its_limit_and_its_cgroup_removed() -> None:
    big = [sys.executable, "-c", "x = b'1' * (256 << 20)"]
    r = cgroup.run_limited(big, name="oom", limit_bytes=64 << 20)
    assert r.returncode == -9 and r.oom_kills and r.cgroup_peak_bytes is not None and r.cgroup_peak_bytes <= 64 << 20
    assert cgroup.run_limited(big, name="ok", limit_bytes=None).returncode == 0
    assert _leftovers() == []


@pytest.mark.skipif(not CGROUPS, reason=f"memory cgroups unavailable: {cgroup.unavailable_reason()}")
def test_page_cache_counts_against_the_limit(tmp_path: Path) -> None:
    skip_where_reads_are_not_counted(tmp_path)
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(24 << 20))
    read3 = [sys.executable, "-c", f"for _ in range(3):\n f = open({str(data)!r}, 'rb')\n while f.read(1 << 20): pass"]
    drop_page_cache(data)
    free = cgroup.run_limited(read3, name="free", limit_bytes=None)
    drop_page_cache(data)
    tight = cgroup.run_limited(read3, name="tight", limit_bytes=20 << 20)
    assert free.returncode == tight.returncode == 0
    assert (24 << 20) <= free.read_bytes < 2 * (24 << 20)            # read once, then from the page cache
    assert tight.read_bytes >= 2 * (24 << 20)                          # the limit leaves no room to keep it


def test_a_timeout_kills_the_child() -> None:
    """Killed once its timeout passed: SIGKILL's status, so before its 30 s sleep ended, and not before 0.3 s."""
    r = cgroup.run_limited(["sleep", "30"], name="slow", limit_bytes=None, timeout_s=0.3)
    assert r.timed_out and r.returncode == -9 and r.wall_s >= 0.3


def test_writes_and_cpu_time_of_waited_for_descendants_are_counted(tmp_path: Path) -> None:
    """A grandchild's writes and CPU time reach the parent through wait4 (no cgroup needed)."""
    skip_where_reads_are_not_counted(tmp_path)
    out = tmp_path / "w.bin"
    grandchild = (f"import os, time\nf = open({str(out)!r}, 'wb'); f.write(os.urandom(8 << 20)); f.flush(); "
                  "os.fsync(f.fileno())\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass")
    child = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {grandchild!r}], check=True)"
    r = cgroup.run_limited([sys.executable, "-c", child], name="writes", limit_bytes=None)
    assert r.returncode == 0
    assert r.write_bytes >= 8 << 20 and r.cpu_s >= 0.3
