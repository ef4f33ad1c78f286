"""The packed pipelines end to end: `run()` of belady, diskgnn and ginex prepares into the run directory
and trains with the same losses as the in-memory pipeline; `diskflow train PACKED` prints epochs and
the stage table, writes report.json, resumes an unfinished run, and fails cleanly on bad options."""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import pytest
from diskflow.cli import train as train_cmd
from diskflow.flow.pipeline import load_pipeline
from diskflow.flow.rundir import new_run_dir, read_report
from diskflow.operators.formats.store import Store
from diskflow.operators.prepare.tiers import staging_piece_bytes
from diskflow.operators.train.memory import io_buffer_bytes
from diskflow.operators.trainbuffers import staging_buffers
from diskflow.pipelines import belady, diskgnn, ginex, inmemory

from diskflow import cli
from diskflow.errors import ConfigError, DiskflowError

SETTINGS: dict[str, Any] = {"model": "sage", "hidden": 16, "fanouts": (5, 5), "batch_size": 256, "epochs": 2,
                            "lr": 0.01, "dropout": 0.2, "seed": 1, "threads": 1, "progress": False}


pytestmark = [pytest.mark.usefixtures("one_torch_thread", "sync_dask"), pytest.mark.plots]   # curves are drawn


@pytest.fixture(scope="module")
def reference(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return inmemory.run(tiny_store, new_run_dir(tmp_path_factory.mktemp("runs"), "ref"), **SETTINGS)


@pytest.fixture(scope="module")
def max_rows(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> int:
    """The largest batch of this round (from a throwaway prepare)."""
    out = tmp_path_factory.mktemp("probe") / "p"
    belady.prepare(tiny_store, out, fanouts=SETTINGS["fanouts"], batch_size=SETTINGS["batch_size"],
                   epochs=SETTINGS["epochs"], seed=SETTINGS["seed"], cpu_memory=1 << 30, quiet=True)
    return int(json.loads((out / "manifest.json").read_text())["round"]["max_batch_rows"])


@pytest.fixture(scope="module")
def budget(tiny_store: Path, max_rows: int) -> Callable[[int], int]:
    """A trainer budget (pipelined, queue depth 2) with room for `rows` CPU-tier rows."""
    st = Store(tiny_store)
    return lambda rows: (staging_buffers(2) * staging_piece_bytes(max_rows, st.row_bytes, len(st.shards))
                         + io_buffer_bytes() + rows * st.row_bytes)


@pytest.mark.parametrize("pipeline", [belady, diskgnn, ginex], ids=["belady", "diskgnn", "ginex"])
def test_run_prepares_into_the_run_dir_and_matches_inmemory(pipeline: Any, tiny_store: Path, tmp_path: Path,
                                                            reference: dict[str, Any], budget: Callable) -> None:
    run_dir = new_run_dir(tmp_path, pipeline.NAME)
    epochs: list[dict] = []
    report = pipeline.run(tiny_store, run_dir, cpu_memory=budget(400), on_epoch=epochs.append,
                          superbatch_size=4, **SETTINGS)
    assert report["pipeline"] == pipeline.NAME and (run_dir / "packed" / "manifest.json").is_file()
    assert read_report(run_dir) == json.loads(json.dumps(report))
    assert (run_dir / "curves.png").stat().st_size > 1000
    assert [e["epoch"] for e in epochs] == [1, 2]
    assert [e["losses"] for e in report["epochs"]] == [e["losses"] for e in reference["epochs"]]
    assert report["final"]["test_acc"] == reference["final"]["test_acc"]
    rows = report["tiers"]["rows"]
    assert rows["cpu"] > 0 and (rows["store"] if pipeline is ginex else rows["packed"]) > 0
    assert report["prepare"]["figures"]["cpu_rows"] > 0 and not report["prepare"]["skipped"]
    assert report["peak_rss_bytes"] > 0 and report["memory"]["host_bytes"] <= report["config"]["cpu_memory"]


def test_a_smaller_staging_piece_leaves_the_rest_to_the_cpu_tier(tiny_store: Path, tmp_path: Path,
                                                                 reference: dict[str, Any], max_rows: int) -> None:
    """``staging_piece``: a budget too small for the default staging pieces fits with 64 KiB ones, the CPU tier
    gets what they leave, batches with more packed bytes than a piece load in pieces, and the losses stay
    inmemory's; the cap is recorded in the manifest and the trainer sizes its buffers from it."""
    from diskflow.operators.formats.packed import PackedDataset

    st = Store(tiny_store)
    small = staging_piece_bytes(max_rows, st.row_bytes, len(st.shards), 64 << 10)
    assert small < staging_piece_bytes(max_rows, st.row_bytes, len(st.shards))
    cpu_memory = staging_buffers(2) * small + io_buffer_bytes() + 400 * st.row_bytes
    with pytest.raises(ConfigError, match="^cpu_memory: .* cannot hold the trainer's staging buffers"):
        belady.run(tiny_store, tmp_path / "default", cpu_memory=cpu_memory, superbatch_size=4, **SETTINGS)
    run_dir = new_run_dir(tmp_path, "piece")
    report = belady.run(tiny_store, run_dir, cpu_memory=cpu_memory, staging_piece="64KiB", superbatch_size=4,
                        **SETTINGS)
    assert [e["losses"] for e in report["epochs"]] == [e["losses"] for e in reference["epochs"]]
    assert report["prepare"]["figures"]["cpu_rows"] == 400 and report["tiers"]["rows"]["packed"] > 0
    assert report["memory"]["staging_piece_bytes"] == small and report["memory"]["host_bytes"] <= cpu_memory
    with PackedDataset(run_dir / "packed") as ds:
        assert ds.manifest["config"]["staging_piece"] == 64 << 10
        packed = [int(r.seg_rows.sum()) * ds.row_bytes for s in ds.superbatches for r in ds.index(s.key)]
    assert max(packed) > 64 << 10        # some batch's misses span several pieces
    # a streamed run sizes its tiers with the same cap, and its losses stay inmemory's
    from diskflow.pipelines import streaming

    stream_memory = staging_buffers(2) * small + io_buffer_bytes() + 400 * st.row_bytes
    rep = streaming.run(tiny_store, tmp_path / "stream", window=2, workers=1, processes=False, staging_piece="64KiB",
                        cpu_memory=stream_memory, superbatch_size=4, device="cpu", **SETTINGS)
    assert [e["losses"] for e in rep["epochs"]] == [e["losses"] for e in reference["epochs"]]
    assert rep["stream"]["tiers"]["staging_bytes"] == staging_buffers(2) * small


def test_run_is_reachable_as_diskflow_run(tiny_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert load_pipeline("ginex") is ginex.PIPELINE and ginex.run == ginex.PIPELINE.run
    code = cli.main(["run", "belady", "--dataset", str(tiny_store), "--epochs", "1", "--fanouts", "5,5",
                     "--batch-size", "256", "--hidden", "16", "--threads", "1", "--runs-dir", str(tmp_path),
                     "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert "epoch   1" in out and "report:" in out
    (run_dir,) = tmp_path.iterdir()
    report = read_report(run_dir)
    assert report["pipeline"] == "belady" and len(report["epochs"]) == 1
    assert report["memory"]["host_bytes"] <= report["config"]["cpu_memory"]   # the default budget holds
    assert cli.main(["run", "belady", "--dataset", str(tiny_store), "--staging-piece", "4KiB", "--runs-dir",
                     str(tmp_path / "bad")]) == 2
    assert "--staging-piece: must be at least 64.00 KiB" in capsys.readouterr().err
    assert not list((tmp_path / "bad").glob("*"))


def test_bad_budgets_are_config_errors(tiny_store: Path, tmp_path: Path, budget: Callable) -> None:
    with pytest.raises(ConfigError, match="^cpu_memory"):
        belady.run(tiny_store, tmp_path, cpu_memory="1KiB", **SETTINGS)
    with pytest.raises(ConfigError, match="^cpu_memory"):
        belady.run(tiny_store, tmp_path, cpu_memory="lots", **SETTINGS)
    with pytest.raises(ConfigError, match="^disk_budget"):
        ginex.run(tiny_store, tmp_path, cpu_memory=budget(100), disk_budget="1MiB", **SETTINGS)
    with pytest.raises(ConfigError, match="^queue_depth"):
        diskgnn.run(tiny_store, tmp_path, queue_depth=0, **SETTINGS)
    with pytest.raises(ConfigError, match="^staging_piece: must be at least 64.00 KiB"):
        belady.run(tiny_store, tmp_path, staging_piece="4KiB", **SETTINGS)
    with pytest.raises(ConfigError, match="^staging_piece"):
        belady.run(tiny_store, tmp_path, staging_piece="big", **SETTINGS)


@pytest.mark.parametrize("pipeline", [belady, ginex], ids=["belady", "ginex"])
def test_a_budget_error_names_the_smallest_budget_that_works(pipeline: Any, tiny_store: Path, tmp_path: Path) -> None:
    """One error, one figure: the budget it names runs (with an empty CPU tier), a byte less does not."""
    import re

    with pytest.raises(ConfigError, match="^cpu_memory: .*smallest budget that works") as err:
        pipeline.run(tiny_store, tmp_path / "tiny", cpu_memory="1KiB", **SETTINGS)
    need = int(re.search(r"\(([\d,]+) bytes, with an empty CPU tier\)", str(err.value)).group(1).replace(",", ""))
    with pytest.raises(ConfigError, match=f"smallest budget that works is .*{need:,} bytes"):
        pipeline.run(tiny_store, tmp_path / "less", cpu_memory=need - 1, **SETTINGS)
    report = pipeline.run(tiny_store, new_run_dir(tmp_path, "need"), cpu_memory=need, **SETTINGS)
    assert report["prepare"]["figures"]["cpu_rows"] == 0 and report["memory"]["host_bytes"] <= need
    assert len(report["epochs"]) == SETTINGS["epochs"]


# ----------------------------------------------------------------------------- diskflow train

@pytest.fixture(scope="module")
def packed(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory, budget: Callable) -> Path:
    out = tmp_path_factory.mktemp("packed") / "belady"
    with dask.config.set(scheduler="sync"):
        belady.prepare(tiny_store, out, fanouts=(5, 5), batch_size=256, superbatch_size=4, epochs=2, seed=1,
                       staging_batches=4, cpu_memory=budget(400) - io_buffer_bytes(), quiet=True)
    return out


def train_cli(argv: list[str]) -> int:
    """`diskflow train ...` through its own parser, so a user error surfaces as the exception itself
    (`test_diskflow_train_errors_exit_2` checks the real CLI's exit code)."""
    parser = argparse.ArgumentParser(prog="diskflow")
    sub = parser.add_subparsers(dest="command")
    train_cmd.register(sub)
    args = parser.parse_args(["train", *argv])
    return int(args.func(args))


def test_diskflow_train_prints_epochs_and_the_stage_table(packed: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    assert train_cli([str(packed), "--hidden", "16", "--lr", "0.01", "--threads", "1", "--runs-dir", str(tmp_path),
                      "--cpu-memory", "700%", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "epoch   1  loss" in out and "epoch   2  loss" in out and "seeds/s" in out
    for word in ("load", "assemble", "graph", "train", "busy s", "starved s", "requests", "rows from: cpu",
                 "peak RSS"):
        assert word in out, word
    (run_dir,) = tmp_path.iterdir()
    report = read_report(run_dir)
    assert {"stages", "queues", "io", "tiers", "epochs", "final"} <= set(report)
    assert report["config"]["cpu_memory"] == int(Store(report["dataset"]["store"]).feature_bytes * 7.0)
    assert (run_dir / "curves.png").is_file()


def test_diskflow_train_resumes_the_unfinished_run(packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="--resume: no unfinished run"):
        train_cli([str(packed), "--resume", "--runs-dir", str(tmp_path), "--no-progress"])
    real = train_cmd.print_epoch

    def stop_after_first(record: dict) -> None:
        real(record)
        raise KeyboardInterrupt

    monkeypatch.setattr(train_cmd, "print_epoch", stop_after_first)
    with pytest.raises(KeyboardInterrupt):
        train_cli([str(packed), "--hidden", "16", "--threads", "1", "--runs-dir", str(tmp_path), "--no-progress"])
    monkeypatch.setattr(train_cmd, "print_epoch", real)
    (run_dir,) = tmp_path.iterdir()
    assert not (run_dir / "report.json").exists()
    capsys.readouterr()
    assert train_cli([str(packed), "--hidden", "16", "--threads", "1", "--runs-dir", str(tmp_path), "--resume",
                      "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"run directory: {run_dir}" in out and "epoch   2" in out and "epoch   1" not in out
    report = read_report(run_dir)
    assert report["resumed_from"].endswith("e0001-b000000") and len(report["epochs"]) == 2


def test_diskflow_train_errors_leave_no_run_directory(packed: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="^cpu_memory: .* need at least"):
        train_cli([str(packed), "--cpu-memory", "1MiB", "--runs-dir", str(tmp_path), "--no-progress"])
    with pytest.raises(ConfigError, match="--cpu-memory"):
        train_cli([str(packed), "--cpu-memory", "much", "--runs-dir", str(tmp_path), "--no-progress"])
    with pytest.raises(DiskflowError, match="not a packed dataset"):
        train_cli([str(tmp_path / "nothing"), "--runs-dir", str(tmp_path), "--no-progress"])
    assert list(tmp_path.iterdir()) == []


def test_diskflow_train_is_registered_and_errors_exit_2(packed: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    assert "train" in cli.COMMANDS
    assert cli.main(["train", str(packed), "--cpu-memory", "1MiB", "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("diskflow train: error: --cpu-memory: 1.00 MiB") and "need at least" in err
    assert list(tmp_path.iterdir()) == []
