"""The pipelined trainer: losses identical to the in-memory pipeline batch by batch, the report's
figures, the data-only mode, checkpoints (resume after SIGKILL and after Ctrl-C mid-epoch gives
the uninterrupted run's losses and parameters), corrupt or mismatched checkpoints refused."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import dask
import pytest
import torch
from diskflow.flow.prepare import PrepareConfig, prepare
from diskflow.flow.rundir import new_run_dir
from diskflow.operators.formats.store import Store
from diskflow.operators.train.checkpoint import latest_checkpoint, load_checkpoint
from diskflow.operators.train.trainer import CHECKPOINTS, train_packed
from diskflow.pipelines import inmemory

from diskflow.errors import ConfigError, InputError

FANOUTS, BATCH, EPOCHS, SEED = (5, 5), 256, 2, 5
PER_EPOCH = 10          # batches per epoch of this round (the last one smaller)
MODEL = {"model": "sage", "hidden": 16, "lr": 0.01, "dropout": 0.2}
CPU_ROWS = 500


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def packed(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A belady packed dataset of a 2-epoch round (its last batch smaller), small CPU tier."""
    root = tmp_path_factory.mktemp("packed")
    base = {"fanouts": FANOUTS, "batch_size": BATCH, "superbatch_size": 2, "epochs": EPOCHS, "seed": SEED,
            "staging_batches": 1}
    with dask.config.set(scheduler="sync"):
        staging = prepare(tiny_store, root / "probe", PrepareConfig(**base, cpu_memory=1 << 30),  # type: ignore[arg-type]
                          quiet=True).figures["staging_bytes"]
        cfg = PrepareConfig(**base, cpu_memory=staging + CPU_ROWS * Store(tiny_store).row_bytes)  # type: ignore[arg-type]
        return prepare(tiny_store, root / "belady", cfg, quiet=True).path


@pytest.fixture(scope="module")
def reference(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The in-memory pipeline on the same store, seed and round."""
    return inmemory.run(tiny_store, new_run_dir(tmp_path_factory.mktemp("runs"), "ref"), fanouts=FANOUTS,
                        batch_size=BATCH, epochs=EPOCHS, seed=SEED, threads=1, progress=False, **MODEL)


@pytest.fixture(scope="module")
def pipelined(packed: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return train_packed(packed, new_run_dir(tmp_path_factory.mktemp("runs"), "p"), threads=1, **MODEL)


def _params(run_dir: Path) -> dict[str, torch.Tensor]:
    ck = load_checkpoint(latest_checkpoint(Path(run_dir) / CHECKPOINTS))
    return ck.state["model"]


def _same_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_losses_are_identical_to_the_in_memory_pipeline(pipelined: dict, reference: dict) -> None:
    assert len(pipelined["epochs"]) == len(reference["epochs"]) == EPOCHS
    for mine, ref in zip(pipelined["epochs"], reference["epochs"]):
        assert len(mine["losses"]) == len(ref["losses"]) == PER_EPOCH
        assert mine["losses"] == ref["losses"]                       # exact floats, batch by batch
        assert (mine["loss"], mine["train_acc"]) == (ref["loss"], ref["train_acc"])
        assert (mine["val_acc"], mine["test_acc"]) == (ref["val_acc"], ref["test_acc"])
    assert pipelined["epochs"][-1]["loss"] < pipelined["epochs"][0]["loss"]


def test_sequential_stages_give_the_same_losses(packed: Path, pipelined: dict, tmp_path: Path) -> None:
    seq = train_packed(packed, new_run_dir(tmp_path, "s"), sequential=True, threads=1, **MODEL)
    assert [e["losses"] for e in seq["epochs"]] == [e["losses"] for e in pipelined["epochs"]]
    assert seq["queues"]["depth"] == 0 and pipelined["queues"]["depth"] == 2
    assert _same_params(_params(Path(seq["run_dir"])), _params(Path(pipelined["run_dir"])))


def test_the_report_has_stages_queues_io_tiers_and_memory(pipelined: dict, reference: dict, packed: Path) -> None:
    r = pipelined
    assert {"config", "dataset", "epochs", "final", "stage_s", "load_s", "peak_rss_bytes", "wall_s"} <= set(r)
    assert set(r["stages"]) == {"load", "assemble", "graph", "train"}
    assert all(v["busy_s"] > 0 for v in r["stages"].values())
    assert all(set(v) == {"busy_s", "starved_s", "blocked_s"} for v in r["stages"].values())
    assert {"load->assemble", "assemble->train", "graph->train"} <= set(r["queues"])
    io = r["io"]
    assert io["backend"] in ("uring", "pread") and io["requests"] > 0
    assert io["bytes_read"] >= io["useful_bytes"] > 0 and io["read_amplification"] >= 1
    assert sum(e["bytes_read"] for e in r["epochs"]) == io["bytes_read"]
    rows = r["tiers"]["rows"]
    assert rows["cpu"] > 0 and rows["packed"] > 0 and rows["store"] == rows["dcache"] == 0
    assert r["tiers"]["total"] == sum(rows.values()) and abs(sum(r["tiers"]["rates"].values()) - 1) < 1e-9
    assert io["useful_bytes"] == rows["packed"] * r["memory"]["row_bytes"]
    assert r["memory"]["peak_rss_bytes"] >= r["memory"]["rss_bytes"] > 0
    assert r["memory"]["cpu_tier_bytes"] == CPU_ROWS * r["memory"]["row_bytes"]
    assert r["config"]["seed"] == SEED and r["config"]["fanouts"] == list(FANOUTS) and r["config"]["epochs"] == EPOCHS
    assert r["dataset"]["splits"] == reference["dataset"]["splits"]
    assert r["final"]["test_acc"] == reference["final"]["test_acc"]
    for e in r["epochs"]:
        assert e["seeds_per_s"] > 0 and set(e["stage_s"]) == {"load", "assemble", "graph", "gather", "train", "eval"}


def test_model_none_runs_only_the_data_path(packed: Path, tmp_path: Path) -> None:
    r = train_packed(packed, tmp_path, model="none", threads=1)
    assert [e["losses"] for e in r["epochs"]] == [[], []] and r["epochs"][0]["loss"] is None
    assert r["epochs"][0]["seeds_per_s"] > 0 and r["tiers"]["total"] > 0
    assert not (tmp_path / CHECKPOINTS).exists()


def test_evaluation_is_skipped_when_the_store_is_unreachable(packed: Path, tmp_path: Path) -> None:
    copy = tmp_path / "moved"
    shutil.copytree(packed, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["store"]["path"] = str(tmp_path / "no-store")
    (copy / "manifest.json").write_text(json.dumps(manifest))
    run = tmp_path / "run"
    run.mkdir()
    r = train_packed(copy, run, threads=1, **MODEL)
    assert all(e["val_acc"] is None for e in r["epochs"]) and r["final"]["test_acc"] is None
    assert "evaluation skipped" in r["dataset"]["note"]
    with pytest.raises(InputError):
        train_packed(copy, run, threads=1, store=tmp_path / "nowhere", **MODEL)



def test_evaluation_can_be_turned_off(packed: Path, pipelined: dict[str, Any], tmp_path: Path) -> None:
    """evaluate=False trains the very same epochs and evaluates nothing."""
    r = train_packed(packed, tmp_path, threads=1, evaluate=False, **MODEL)
    assert [e["losses"] for e in r["epochs"]] == [e["losses"] for e in pipelined["epochs"]]
    assert all(e["val_acc"] is None and e["test_acc"] is None and e["stage_s"]["eval"] == 0 for e in r["epochs"])
    assert r["final"]["test_acc"] is None and "turned off" in r["dataset"]["note"]

# ----------------------------------------------------------------------------- checkpoints

KILL_AFTER_EPOCH_1 = textwrap.dedent("""
    import os, signal, sys, warnings
    warnings.simplefilter("ignore")
    import torch
    torch.set_num_threads(1)
    from diskflow.operators.train.trainer import train_packed

    def on_epoch(record):
        if record["epoch"] == 1:
            os.kill(os.getpid(), signal.SIGKILL)

    train_packed(sys.argv[1], sys.argv[2], threads=1, on_epoch=on_epoch, model="sage", hidden=16, lr=0.01, dropout=0.2)
    sys.exit(3)
""")


def test_resume_after_sigkill_gives_the_uninterrupted_run(packed: Path, pipelined: dict, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    proc = subprocess.run([sys.executable, "-c", KILL_AFTER_EPOCH_1, str(packed), str(run)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    ck = latest_checkpoint(run / CHECKPOINTS)
    assert ck is not None and ck.name == "e0001-b000000"
    assert {p.name for p in ck.iterdir()} == {"state.pt", "cpu_rows.npy", "cpu_ids.npy", "manifest.json"}
    resumed = train_packed(packed, run, resume=True, threads=1, **MODEL)
    assert resumed["resumed_from"] == str(ck)
    assert [e["losses"] for e in resumed["epochs"]] == [e["losses"] for e in pipelined["epochs"]]
    assert [e["val_acc"] for e in resumed["epochs"]] == [e["val_acc"] for e in pipelined["epochs"]]
    assert _same_params(_params(run), _params(Path(pipelined["run_dir"])))
    assert latest_checkpoint(run / CHECKPOINTS).name == "e0002-b000000"   # the older one was removed
    assert len(list((run / CHECKPOINTS).iterdir())) == 1


def test_ctrl_c_mid_epoch_saves_a_checkpoint_and_resume_is_exact(packed: Path, pipelined: dict,
                                                                   tmp_path: Path) -> None:
    count = {"n": 0}

    def on_batch(_: int) -> None:
        count["n"] += 1
        if count["n"] == PER_EPOCH + 4:      # 4th batch of the second epoch
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        train_packed(packed, tmp_path, threads=1, on_batch=on_batch, **MODEL)
    ck = load_checkpoint(latest_checkpoint(tmp_path / CHECKPOINTS))
    assert (ck.epoch, ck.batch) == (1, 4)
    assert len(ck.state["partial"]["losses"]) == 4
    assert ck.files.keys() >= {"cpu_rows.npy", "cpu_ids.npy"}      # the epoch-start tier, linked
    # a second interruption of the resumed run, in the same epoch, still resumes exactly
    count["n"] = -100

    def again(_: int) -> None:
        count["n"] += 1
        if count["n"] == -98:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        train_packed(packed, tmp_path, resume=True, threads=1, on_batch=again, **MODEL)
    assert latest_checkpoint(tmp_path / CHECKPOINTS).name == "e0001-b000006"
    resumed = train_packed(packed, tmp_path, resume=True, threads=1, **MODEL)
    assert [e["losses"] for e in resumed["epochs"]] == [e["losses"] for e in pipelined["epochs"]]
    assert [e["loss"] for e in resumed["epochs"]] == [e["loss"] for e in pipelined["epochs"]]
    assert _same_params(_params(tmp_path), _params(Path(pipelined["run_dir"])))


def test_a_corrupt_checkpoint_is_a_clear_error(packed: Path, tmp_path: Path) -> None:
    train_packed(packed, tmp_path, threads=1, **MODEL)
    ck = latest_checkpoint(tmp_path / CHECKPOINTS)
    state = ck / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0x01
    state.write_bytes(bytes(data))
    with pytest.raises(InputError, match="corrupt checkpoint: checksum mismatch") as e:
        train_packed(packed, tmp_path, resume=True, threads=1, **MODEL)
    assert e.value.path == str(state)
    (ck / "manifest.json").write_text("{")
    with pytest.raises(InputError, match="unreadable manifest"):
        train_packed(packed, tmp_path, resume=True, threads=1, **MODEL)


def test_resume_with_other_options_is_refused(packed: Path, tmp_path: Path) -> None:
    def stop(record: dict) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_packed(packed, tmp_path, threads=1, on_epoch=stop, **MODEL)
    with pytest.raises(ConfigError, match="^resume"):
        train_packed(packed, tmp_path, resume=True, threads=1, **{**MODEL, "hidden": 32})


def test_budgets_and_options_fail_before_training(packed: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="^cpu_memory"):
        train_packed(packed, tmp_path, cpu_memory=1000, **MODEL)
    with pytest.raises(ConfigError, match="^model"):
        train_packed(packed, tmp_path, **{**MODEL, "model": "transformer"})
    with pytest.raises(ConfigError, match="^device"):
        train_packed(packed, tmp_path, device="tpu", **MODEL)
    assert not (tmp_path / CHECKPOINTS).exists()
