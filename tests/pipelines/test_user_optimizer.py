"""A user's optimizer, learning-rate schedule and gradient clipping, declared on their `diskflow.Model`: SGD with
momentum and weight decay, a step schedule and a clipping norm train through `run inmemory`, `run belady`,
streamed runs and two GPU workers with the same losses; a belady run killed after its first epoch and resumed
ends as the uninterrupted one (optimizer and scheduler state restored); `--weight-decay` and `--clip-grad`
reach the optimizer; and a factory that fails is one line naming the file."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import dask
import pytest
from cli_runs import cli_report, losses, two_gpu_workers_and_one, user_model_fixtures
from diskflow.cli import main
from diskflow.operators.train.checkpoint import latest_checkpoint, load_checkpoint
from diskflow.pipelines import streaming

import diskflow

USER_MODEL = '''\
import torch
from torch_geometric.nn import GraphSAGE
import diskflow


def sage(in_channels, out_channels, hidden_channels=16, num_layers=2):
    return GraphSAGE(in_channels, hidden_channels, num_layers, out_channels)


def sgd(params, lr, weight_decay):
    return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)


def every_other_epoch(optimizer):
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)


model = diskflow.Model("sage-sgd", sage, optimizer=sgd, scheduler=every_other_epoch, clip_grad=0.5)
'''
LR, EPOCHS = 0.1, 3
LRS = [0.1, 0.1, 0.05]        # StepLR(step_size=2): the third epoch at half the rate
SETTINGS = ["--fanouts", "5,5", "--batch-size", "256", "--epochs", str(EPOCHS), "--hidden", "12", "--seed", "3",
            "--lr", str(LR), "--weight-decay", "5e-4", "--threads", "1", "--no-progress"]
STREAM = {"fanouts": (5, 5), "batch_size": 256, "epochs": EPOCHS, "hidden": 12, "seed": 3, "lr": LR,
          "weight_decay": 5e-4, "threads": 1, "superbatch_size": 4, "device": "cpu", "progress": False}


model_file, reference = user_model_fixtures("sage_sgd.py", USER_MODEL, SETTINGS)


def test_the_users_optimizer_scheduler_and_clipping_train_the_model(reference: dict[str, Any]) -> None:
    cfg = reference["config"]
    assert cfg["optimizer"] == {"optimizer": "SGD", "scheduler": "StepLR", "schedule": "epoch", "clip_grad": 0.5}
    assert cfg["weight_decay"] == 5e-4 and cfg["lr"] == LR
    assert [r["lr"] for r in reference["epochs"]] == pytest.approx(LRS)
    assert len(losses(reference)) == 10 * EPOCHS


@pytest.mark.parametrize("change", ["adam", "clip", "decay"])
def test_each_setting_changes_thelosses(change: str, model_file: Path, tiny_store: Path, tmp_path: Path,
                                         reference: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """The test can tell: without the factory (Adam), with another clipping norm (the flag overrides the model's),
    or without weight decay, the same run's losses differ."""
    settings, path = list(SETTINGS), model_file
    if change == "adam":
        path = tmp_path / "sage_adam.py"
        path.write_text(USER_MODEL.replace("optimizer=sgd, scheduler=every_other_epoch, ", ""))
    elif change == "clip":
        settings += ["--clip-grad", "0.01"]
    else:
        settings[settings.index("--weight-decay") + 1] = "0"
    with dask.config.set(scheduler="sync"):
        other = cli_report(["run", "inmemory", "--dataset", str(tiny_store), "--model", str(path),
                      "--runs-dir", str(tmp_path / "runs"), *settings], capsys)
    assert losses(other) != losses(reference)
    opt = other["config"]["optimizer"]
    assert opt["optimizer"] == ("Adam" if change == "adam" else "SGD")
    assert opt["clip_grad"] == {"adam": 0.5, "clip": 0.01, "decay": 0.5}[change]


def test_run_belady_gives_the_inmemorylosses(model_file: Path, tiny_store: Path, tmp_path: Path,
                                              reference: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    with dask.config.set(scheduler="threads"):
        report = cli_report(["run", "belady", "--dataset", str(tiny_store), "--model", str(model_file),
                       "--runs-dir", str(tmp_path), *SETTINGS], capsys)
    assert losses(report) == losses(reference)
    assert [r["lr"] for r in report["epochs"]] == [r["lr"] for r in reference["epochs"]]
    assert report["config"]["optimizer"] == reference["config"]["optimizer"]
    # `diskflow train` on the packed dataset that run prepared takes the same flags
    trained = cli_report(["train", report["prepare"]["path"], "--model", str(model_file), "--hidden", "12", "--lr", str(LR),
                    "--weight-decay", "5e-4", "--threads", "1", "--run-dir", str(tmp_path / "train"),
                    "--no-progress"], capsys)
    assert losses(trained) == losses(reference) and trained["config"]["weight_decay"] == 5e-4
    clipped = cli_report(["train", report["prepare"]["path"], "--model", str(model_file), "--hidden", "12", "--lr", str(LR),
                    "--weight-decay", "5e-4", "--clip-grad", "0.01", "--threads", "1", "--run-dir",
                    str(tmp_path / "clipped"), "--no-progress"], capsys)
    assert losses(clipped) != losses(reference) and clipped["config"]["optimizer"]["clip_grad"] == 0.01


KILL_AFTER_EPOCH_1 = textwrap.dedent("""\
    import os, signal, sys
    import diskflow

    def on_epoch(record):
        if record["epoch"] == 1:
            os.kill(os.getpid(), signal.SIGKILL)

    store, model, run = sys.argv[1:4]
    diskflow.train(store, model, pipeline="belady", run_dir=run, on_epoch=on_epoch, fanouts=[5, 5], batch_size=256,
                   epochs={epochs}, hidden=12, seed=3, lr={lr!r}, weight_decay=5e-4, threads=1)
    sys.exit(3)
""").format(epochs=EPOCHS, lr=LR)


def test_a_killed_run_resumes_with_its_optimizer_and_scheduler(model_file: Path, tiny_store: Path, tmp_path: Path,
                                                               reference: dict[str, Any],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", KILL_AFTER_EPOCH_1, str(tiny_store), str(model_file), str(run)],
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    ck = load_checkpoint(latest_checkpoint(run / "checkpoints"))
    assert (ck.epoch, ck.batch) == (1, 0)
    assert ck.state["scheduler"]["last_epoch"] == 1 and ck.state["optimizer"]["state"], "both states are saved"
    with dask.config.set(scheduler="threads"):
        resumed = cli_report(["run", "belady", "--dataset", str(tiny_store), "--model", str(model_file),
                        "--resume", str(run), *SETTINGS], capsys)
    assert losses(resumed) == losses(reference)
    assert [r["lr"] for r in resumed["epochs"]] == pytest.approx(LRS)


def test_streaming_gives_the_inmemorylosses(model_file: Path, tiny_store: Path, tmp_path: Path,
                                             reference: dict[str, Any]) -> None:
    report = streaming.run(tiny_store, tmp_path / "run", model=str(model_file), workers=1, processes=False, **STREAM)
    assert losses(report) == losses(reference)
    assert [r["lr"] for r in report["epochs"]] == pytest.approx(LRS)
    assert report["trainer"]["config"]["optimizer"] == reference["config"]["optimizer"]


def test_two_gpu_workers_step_the_users_optimizer(model_file: Path, tiny_store: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Worker processes build the optimizer from the file; clipping follows the gradients' all-reduce, so two
    workers equal one that averages two batches a step."""
    two, one = two_gpu_workers_and_one(tiny_store, model_file, tmp_path, SETTINGS, STREAM, capsys)
    assert len(losses(one)) == 10 * EPOCHS
    assert [r["lr"] for r in two["epochs"]] == pytest.approx(LRS)


FAULTS = {
    "raises": ("def sgd(params, lr, weight_decay):\n    raise ValueError('no way')\n",
               "its optimizer factory raised ValueError: no way"),
    "not-an-optimizer": ("def sgd(params, lr, weight_decay):\n    return 3\n",
                         "its optimizer factory returned int, expected a torch.optim.Optimizer"),
    "no-decay-keyword": ("def sgd(params, lr):\n    return torch.optim.SGD(params, lr=lr)\n",
                         "optimizer factory takes no weight_decay keyword"),
}


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_a_faulty_optimizer_factory_is_one_line(name: str, tiny_store: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    text, fault = FAULTS[name]
    start = USER_MODEL.index("def sgd")
    path = tmp_path / f"{name}.py"
    path.write_text(USER_MODEL[:start] + text + USER_MODEL[USER_MODEL.index("\n\n\ndef every_other"):])
    rc = main(["run", "inmemory", "--dataset", str(tiny_store), "--model", str(path), "--runs-dir",
               str(tmp_path / "runs"), *SETTINGS])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert str(path) in err and fault in err, err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir()), "no run directory left"


def test_bad_values_are_refused_naming_the_option(tiny_store: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    for flag, value in (("--clip-grad", "0"), ("--clip-grad", "nan"), ("--weight-decay", "-1")):
        rc = main(["run", "inmemory", "--dataset", str(tiny_store), "--runs-dir", str(tmp_path), flag, value])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and flag in err, err
    with pytest.raises(diskflow.ConfigError, match="Model.schedule"):
        diskflow.Model("m", lambda i, o: None, schedule="batch")
    with pytest.raises(diskflow.ConfigError, match="Model.clip_grad"):
        diskflow.Model("m", lambda i, o: None, clip_grad=-1.0)
