"""The Python API (`diskflow.ingest`, `prepare`, `train`, `PackedLoader`, `OnlineLoader`): what the commands run,
with their checks: a PyG `Data` goes to out-of-core batches and a report without the CLI, the API's runs equal the
CLI's, and bad input is one `DiskflowError` naming the file or option."""
from __future__ import annotations

import json
from pathlib import Path

import dask
import numpy as np
import pytest
import torch
from diskflow.cli import main
from torch_geometric.data import Data

import diskflow

SMALL = {"fanouts": (4, 4), "batch_size": 256, "superbatch_size": 4, "epochs": 2, "seed": 2}


@pytest.fixture(autouse=True)
def _threads():
    with dask.config.set(scheduler="threads"):
        yield


@pytest.fixture(scope="module")
def packed(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("api") / "packed"
    with dask.config.set(scheduler="threads"):
        r = diskflow.prepare(tiny_store, out, "belady", cpu_memory="6MiB", **SMALL)
    assert r.path == out and not r.skipped and r.figures["batches"] == 2 * 10
    return out


def test_a_pyg_data_goes_to_batches_without_the_cli(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    n = 900
    data = Data(x=torch.randn(n, 12, generator=g), edge_index=torch.randint(0, n, (2, 6000), generator=g),
                y=torch.randint(0, 3, (n,), generator=g))
    r = torch.rand(n, generator=g)
    data.train_mask, data.val_mask, data.test_mask = r < 0.6, (r >= 0.6) & (r < 0.8), r >= 0.8
    result = diskflow.ingest(data, tmp_path / "store")
    assert result.num_nodes == n and result.num_edges == 6000
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".diskflow-raw-")], "the raw staging is removed"
    diskflow.prepare(tmp_path / "store", tmp_path / "packed", cpu_memory="4MiB", fanouts=(3, 3), batch_size=128)
    with diskflow.PackedLoader(tmp_path / "packed", cpu_memory="4MiB") as loader:
        assert loader.dim == 12 and loader.num_classes == 3
        seeds = []
        for batch in loader:
            assert batch.x.shape == (batch.n_id.shape[0], 12)
            torch.testing.assert_close(batch.x, data.x[batch.n_id])        # the features the Data holds
            assert torch.equal(batch.y, data.y[batch.n_id])
            seeds.append(batch.n_id[: batch.batch_size])
    assert torch.equal(torch.sort(torch.cat(seeds)).values, torch.nonzero(data.train_mask).flatten())


def test_train_equals_the_cli(packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = diskflow.train(packed, "sage", run_dir=tmp_path / "api", hidden=8, threads=1)
    assert main(["train", str(packed), "--run-dir", str(tmp_path / "cli"), "--hidden", "8", "--threads", "1",
                 "--no-progress"]) == 0
    cli = json.loads((tmp_path / "cli" / "report.json").read_text())
    assert [r["losses"] for r in report["epochs"]] == [r["losses"] for r in cli["epochs"]]
    assert (tmp_path / "api" / "report.json").is_file() and report["tiers"]["total"] > 0


def test_train_takes_a_model_made_here(tiny_store: Path, tmp_path: Path) -> None:
    from torch_geometric.nn import GraphSAGE

    mine = diskflow.Model("sage-again", lambda i, o, hidden_channels: GraphSAGE(i, hidden_channels, 2, o, dropout=0.2),
                          trim=True)
    ours = diskflow.train(tiny_store, mine, run_dir=tmp_path / "mine", hidden=8, epochs=1, fanouts=(4, 4),
                          batch_size=256, threads=1)
    builtin = diskflow.train(tiny_store, "sage", run_dir=tmp_path / "sage", hidden=8, epochs=1, fanouts=(4, 4),
                             batch_size=256, threads=1)
    assert ours["epochs"][0]["losses"] == builtin["epochs"][0]["losses"]    # the same module, built the same way
    assert ours["config"]["model"] == "sage-again"


def test_the_online_loader_draws_every_training_seed(tiny_store: Path) -> None:
    loader = diskflow.OnlineLoader(tiny_store, batch_size=256, fanouts=(4, 4), cpu_memory="4MiB", seed=1)
    try:
        loader.set_epoch(0)
        seeds = np.concatenate([b.n_id[: b.batch_size].numpy() for b in loader])
    finally:
        loader.close()
    splits = np.load(tiny_store / "splits.npy")
    assert np.array_equal(np.sort(seeds), np.flatnonzero(splits == splits[seeds[0]]))


def test_bad_input_is_one_error(tiny_store: Path, packed: Path, tmp_path: Path) -> None:
    with pytest.raises(diskflow.InputError, match="not a diskflow store"):
        diskflow.prepare(tmp_path, tmp_path / "out")
    with pytest.raises(diskflow.ConfigError, match=r"^cpu_memory: .* the smallest budget that works is"):
        diskflow.prepare(tiny_store, tmp_path / "out", cpu_memory="10KiB", **SMALL)
    with pytest.raises(diskflow.ConfigError, match="^minhash: not an option of prepare"):
        diskflow.prepare(tiny_store, tmp_path / "out", minhash=3)
    with pytest.raises(diskflow.ConfigError, match="^epochs: not an option when training the packed dataset"):
        diskflow.train(packed, epochs=3)
    with pytest.raises(diskflow.ConfigError, match="^model: unknown model 'gin'"):
        diskflow.train(packed, "gin")
    with pytest.raises(diskflow.InputError, match="not a diskflow store"):
        diskflow.train(tmp_path)
    with pytest.raises(diskflow.InputError, match="not a packed dataset"):
        diskflow.PackedLoader(tiny_store)
    with pytest.raises(diskflow.ConfigError, match="^cpu_memory: "):
        diskflow.PackedLoader(packed, cpu_memory="lots")
    with pytest.raises(diskflow.InputError, match="torch_geometric Data"):
        diskflow.ingest(42, tmp_path / "store")
    with pytest.raises(diskflow.ConfigError, match="^split: "):
        diskflow.OnlineLoader(tiny_store, split="holdout")
    assert not (tmp_path / "out").exists() and not (tmp_path / "store").exists()
