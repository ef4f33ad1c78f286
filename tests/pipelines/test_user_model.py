"""A user's own model, as the README shows it: one `.py` file that imports only torch, PyG and diskflow and
defines a `diskflow.Model`, taken by `--model FILE.py` on every path. Its losses are those of `run inmemory`
with the same file, bit for bit (within float-sum order for two GPU workers against two batches a step),
checkpoints refuse a changed file, and faults in the file are one line naming it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dask
import pytest
from cli_runs import cli_report, losses, two_gpu_workers_and_one, user_model_fixtures
from diskflow.cli import main
from diskflow.operators.train.checkpoint import latest_checkpoint, load_checkpoint
from diskflow.pipelines import streaming

import diskflow

# No built-in resembles it: max-aggregated SAGE layers, a skip connection from the input, and its own loss.
USER_MODEL = '''\
import torch
import torch.nn.functional as F
from torch_geometric.nn import SAGEConv
import diskflow


class MaxSkip(torch.nn.Module):
    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 16) -> None:
        super().__init__()
        self.conv1 = SAGEConv(in_channels, hidden_channels, aggr="max")
        self.conv2 = SAGEConv(hidden_channels, out_channels, aggr="max")
        self.skip = torch.nn.Linear(in_channels, out_channels, bias=False)

    def forward(self, x, edge_index):
        h = F.dropout(self.conv1(x, edge_index).relu(), p=0.2, training=self.training)
        return self.conv2(h, edge_index) + self.skip(x)


def smoothed(logits, target):
    return F.cross_entropy(logits, target, label_smoothing=0.1)


model = diskflow.Model("max-skip", MaxSkip, loss=smoothed)
'''
SETTINGS = ["--fanouts", "5,5", "--batch-size", "256", "--epochs", "1", "--hidden", "12", "--seed", "3",
            "--threads", "1", "--no-progress"]
STREAM = {"fanouts": (5, 5), "batch_size": 256, "epochs": 1, "hidden": 12, "seed": 3, "threads": 1,
          "superbatch_size": 3, "device": "cpu", "progress": False}


model_file, reference = user_model_fixtures("max_skip.py", USER_MODEL, SETTINGS)


def test_the_file_defines_a_public_model(model_file: Path) -> None:
    m = diskflow.load_model(model_file)
    assert isinstance(m, diskflow.Model) and m.name == "max-skip" and m.loss is not None
    assert m.source == str(model_file) and len(m.code_hash) == 64
    net = m.build(7, 3, hidden_channels=5)
    assert net.conv1.lin_l.weight.shape == (5, 7) and net.skip.weight.shape == (3, 7)
    assert diskflow.load_model("sage").name == "sage" and diskflow.load_model("sage").trim


def test_the_reference_trains_the_users_model(reference: dict[str, Any], tiny_store: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert reference["config"]["model"].endswith("max_skip.py") and len(losses(reference)) == 10
    plain = cli_report(["run", "inmemory", "--dataset", str(tiny_store), "--runs-dir", str(tmp_path), *SETTINGS], capsys)
    assert losses(plain) != losses(reference), "the built-in model is another model: the test can tell"


@pytest.mark.parametrize("pipeline", ["belady", "gnndrive"])
def test_run_pipelines_give_the_inmemorylosses(pipeline: str, model_file: Path, tiny_store: Path, tmp_path: Path,
                                                reference: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    with dask.config.set(scheduler="threads"):
        report = cli_report(["run", pipeline, "--dataset", str(tiny_store), "--model", str(model_file),
                       "--runs-dir", str(tmp_path), *SETTINGS], capsys)
    assert losses(report) == losses(reference)


def test_prepare_then_train_gives_the_inmemorylosses(model_file: Path, tiny_store: Path, tmp_path: Path,
                                                      reference: dict[str, Any],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with dask.config.set(scheduler="threads"):
        assert main(["prepare", "belady", "--dataset", str(tiny_store), "--out", str(tmp_path / "packed"),
                     "--cpu-memory", "8MiB", "--workers", "1", "--fanouts", "5,5", "--batch-size", "256",
                     "--epochs", "1", "--seed", "3"]) == 0
    capsys.readouterr()
    run_dir = tmp_path / "run"
    report = cli_report(["train", str(tmp_path / "packed"), "--model", str(model_file), "--run-dir", str(run_dir),
                   "--hidden", "12", "--threads", "1", "--no-progress"], capsys)
    assert losses(report) == losses(reference)
    ck = load_checkpoint(latest_checkpoint(run_dir / "checkpoints"))
    assert ck.state["model_identity"] == {"name": "max-skip", "code_hash": diskflow.load_model(model_file).code_hash}
    # an edited model file: --resume is one line naming the change
    model_file.write_text(USER_MODEL.replace("label_smoothing=0.1", "label_smoothing=0.2"))
    try:
        rc = main(["train", str(tmp_path / "packed"), "--model", str(model_file), "--run-dir", str(run_dir),
                   "--resume", "--hidden", "12", "--threads", "1", "--no-progress"])
        err = capsys.readouterr().err.strip()
    finally:
        model_file.write_text(USER_MODEL)
    assert rc == 2 and len(err.splitlines()) == 1
    assert "model 'max-skip' whose code has changed since" in err and "--resume" in err


def test_streaming_gives_the_inmemorylosses(model_file: Path, tiny_store: Path, tmp_path: Path,
                                             reference: dict[str, Any]) -> None:
    report = streaming.run(tiny_store, tmp_path / "run", model=str(model_file), workers=1, processes=False, **STREAM)
    assert losses(report) == losses(reference)


def test_two_gpu_workers_train_the_users_model(model_file: Path, tiny_store: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Worker processes: the model travels as the file's path and is built on each GPU worker."""
    _, one = two_gpu_workers_and_one(tiny_store, model_file, tmp_path, SETTINGS, STREAM, capsys)
    assert len(losses(one)) == 10


def test_bench_compare_takes_the_model(model_file: Path, tiny_store: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from bench_children import compare_children_in_this_process

    with compare_children_in_this_process():     # the children's runs in this process: no torch import each
        rc = main(["bench", "compare", "--dataset", str(tiny_store), "--pipelines", "inmemory,belady",
                   "--model", str(model_file), "--fanouts", "4,4", "--batch-size", "128", "--superbatch-size", "4",
                   "--epochs", "1", "--hidden", "8", "--feature-budget", "3500KiB", "--threads", "1",
                   "--bw-bytes", str(1 << 20), "--no-cgroup", "--workdir", str(tmp_path / "w"),
                   "--json", str(tmp_path / "f.json")])
    assert rc == 0, capsys.readouterr().err
    f = json.loads((tmp_path / "f.json").read_text())
    assert f["pipelines"]["belady"]["losses"] == f["pipelines"]["inmemory"]["losses"]
    # the bench trained the user's model: its in-memory run's losses are this run's (a built-in model's differ)
    mine = cli_report(["run", "inmemory", "--dataset", str(tiny_store), "--model", str(model_file), "--runs-dir",
                 str(tmp_path / "runs"), "--fanouts", "4,4", "--batch-size", "128", "--epochs", "1", "--hidden", "8",
                 "--seed", "0", "--threads", "1", "--no-progress"], capsys)
    assert f["pipelines"]["inmemory"]["losses"][0] == losses(mine)


NET = """\
import torch
import diskflow


class Net(torch.nn.Module):
    def __init__(self, i, o):
        super().__init__()
        self.lin = torch.nn.Linear(IN, OUT)

    def forward(self, x, edge_index):
        return self.lin(x)


model = diskflow.Model("net", Net)
"""
RAISES = """\
import diskflow


def make(i, o):
    raise ValueError("no way")


model = diskflow.Model("r", make)
"""
BAD = {
    "no_model.py": ("import diskflow\nx = 1\n", "defines no diskflow.Model objects at module level"),
    "raises.py": (RAISES, "its factory raised ValueError: no way"),
    "broken.py": ("import diskflow\nraise RuntimeError('boom')\n", "failed to import (RuntimeError: boom)"),
    "crash.py": (NET.replace("IN, OUT", "i + 1, o"), "forward failed on training batch 0 (x ["),
    "shape.py": (NET.replace("IN, OUT", "i, o + 2"), "forward returned [256, 7] on training batch 0"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_faulty_model_file_is_one_line(name: str, tiny_store: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    text, fault = BAD[name]
    path = tmp_path / name
    path.write_text(text)
    rc = main(["run", "inmemory", "--dataset", str(tiny_store), "--model", str(path), "--runs-dir",
               str(tmp_path / "runs"), "--fanouts", "5,5", "--batch-size", "256", "--epochs", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert str(path) in err and fault in err, err
