"""Typed graphs end to end: a PyG HeteroData with three node types (two featureless, derived at ingest) and
reverse edges trains to the very same losses in memory and out of core, through stock hetero models."""
from __future__ import annotations

from pathlib import Path

import dask
import numpy as np
import pytest
import torch
import torch_geometric.transforms as T
from diskflow.cli import main
from diskflow.flow.ingest import run_ingest
from diskflow.flow.options import parse_fanouts
from diskflow.flow.pipeline import load_pipeline
from diskflow.operators.formats.store import Store
from diskflow.operators.ingest.pygimport import from_pyg
from diskflow.operators.ingest.synthhetero import synth_hetero_arrays, to_hetero_data
from torch_geometric.data import HeteroData
from torch_geometric.nn import HeteroConv, RGCNConv, SAGEConv

import diskflow
from diskflow.errors import ConfigError, InputError

DERIVE = ["author=mean:paper__rev_writes__author", "institution=mean:author__affiliated_with__institution"]
OPTS = {"model": "sage", "epochs": 2, "batch_size": 128, "fanouts": (4, 3), "hidden": 16, "progress": False,
        "threads": 1, "seed": 1, "device": "cpu"}


def _graph() -> HeteroData:
    return T.ToUndirected()(to_hetero_data(synth_hetero_arrays(1500, 700, 30, dim=16, classes=4, seed=0)))


@pytest.fixture(scope="module")
def typed_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("typed")
    from_pyg(_graph(), tmp / "raw")
    with dask.config.set(scheduler="sync"):
        run_ingest(tmp / "raw", tmp / "store", shard_rows=256, memory_budget="256KiB", derive=DERIVE)
    return tmp / "store"


def _run(pipeline: str, store: Path, out: Path, **extra: object) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    with dask.config.set(scheduler="sync"):
        return load_pipeline(pipeline).run(store, out, **{**OPTS, **extra})


def _losses(rep: dict) -> list:
    return [r["losses"] for r in rep["epochs"]]


@pytest.fixture(scope="module")
def inmemory_ref(typed_store: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The in-memory run of OPTS, the reference of every pipeline below that trains OPTS's model (once)."""
    return _run("inmemory", typed_store, tmp_path_factory.mktemp("inmemory-ref") / "m")


def test_the_store_derives_the_featureless_types(typed_store: Path) -> None:
    st = Store(typed_store)
    lay = st.hetero
    assert lay is not None and lay.target == "paper" and lay.featureless() == []
    assert [t.derived is not None for t in lay.node_types] == [False, True, True]
    x = st.read_features()
    g = _graph()
    paper, author = lay.node("paper"), lay.node("author")
    src, dst = g["author", "writes", "paper"].edge_index.numpy()
    sums = np.zeros((author.count, 16))
    np.add.at(sums, src, x[paper.offset + dst])
    deg = np.bincount(src, minlength=author.count)[:, None]
    want = np.where(deg > 0, sums / np.maximum(deg, 1), 0)
    np.testing.assert_allclose(x[author.offset:author.stop], want, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def ten_percent(typed_store: Path, tmp_path_factory: pytest.TempPathFactory) -> int:
    """A CPU budget of the trainer's fixed buffers plus a tier of 10% of the feature table's bytes."""
    f = diskflow.prepare(typed_store, tmp_path_factory.mktemp("floor") / "p", "belady", epochs=OPTS["epochs"],
                         batch_size=OPTS["batch_size"], fanouts=OPTS["fanouts"], seed=OPTS["seed"], quiet=True).figures
    return int(f["staging_bytes"] + f["io_buffer_bytes"] + Store(typed_store).feature_bytes // 10)


@pytest.mark.parametrize("pipeline", ["belady", "belady-disk-cache", "diskgnn", "ginex", "gnndrive"])
def test_out_of_core_equals_in_memory_bit_for_bit(typed_store: Path, tmp_path: Path, pipeline: str,
                                                  inmemory_ref: dict, request: pytest.FixtureRequest) -> None:
    ref = inmemory_ref
    extra: dict = {"superbatch_size": 4} if pipeline != "gnndrive" else {}
    if pipeline.startswith("belady"):
        extra["cpu_memory"] = request.getfixturevalue("ten_percent")
    if pipeline == "belady-disk-cache":       # packed copies capped below what packing wants: a disk cache
        extra["disk_budget"] = 1_200_000      # packing every miss needs about 1.7 MB here
    rep = _run(pipeline.split("-")[0], typed_store, tmp_path / pipeline, **extra)
    assert _losses(rep) == _losses(ref)
    assert rep["final"]["test_acc"] == ref["final"]["test_acc"]
    if pipeline.startswith("belady"):
        rows = rep["tiers"]["rows"]
        assert rows["cpu"] > 0 and rows["packed"] > 0     # both the CPU tier and the packed segments served rows
        if pipeline == "belady-disk-cache":
            assert rows["dcache"] > 0


def test_a_streamed_run_equals_in_memory(typed_store: Path, tmp_path: Path, inmemory_ref: dict) -> None:
    ref = inmemory_ref
    rep = load_pipeline("streaming").run(typed_store, tmp_path / "s", window=2, workers=1, processes=False,
                                         superbatch_size=4, **OPTS)
    assert _losses(rep) == _losses(ref)


class TypedSage(torch.nn.Module):
    """A HeteroConv of SAGEConvs, one per edge type: a model built for the typed graph by its factory."""

    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int, metadata: tuple) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList([
            HeteroConv({et: SAGEConv(c_in, c_out) for et in metadata[1]}, aggr="sum")
            for c_in, c_out in ((in_channels, hidden_channels), (hidden_channels, out_channels))])

    def forward(self, x_dict: dict, edge_index_dict: dict) -> dict:
        for i, conv in enumerate(self.convs):
            x_dict = conv(x_dict, edge_index_dict)
            if i == 0:
                x_dict = {k: v.relu() for k, v in x_dict.items()}
        return x_dict


def test_a_factory_taking_metadata_builds_its_own_hetero_model(typed_store: Path, tmp_path: Path) -> None:
    model = diskflow.Model("typed-sage", TypedSage)
    ref = _run("inmemory", typed_store, tmp_path / "m", model=model)
    rep = _run("belady", typed_store, tmp_path / "b", model=model, superbatch_size=4)
    assert _losses(rep) == _losses(ref) and np.isfinite(ref["epochs"][-1]["loss"])


class TypedRGCN(torch.nn.Module):
    """RGCN over a typed batch: the types stacked into one graph with an edge-type id per edge, as PyG's
    RGCN examples do (`HeteroData.to_homogeneous`)."""

    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int, metadata: tuple) -> None:
        super().__init__()
        self.node_types, self.edge_types = metadata
        r = len(self.edge_types)
        self.conv1 = RGCNConv(in_channels, hidden_channels, r)
        self.conv2 = RGCNConv(hidden_channels, out_channels, r)

    def forward(self, x_dict: dict, edge_index_dict: dict) -> dict:
        sizes = [x_dict[t].size(0) for t in self.node_types]
        start = dict(zip(self.node_types, np.cumsum([0, *sizes[:-1]]).tolist()))
        x = torch.cat([x_dict[t] for t in self.node_types])
        edges, kinds = [], []
        for k, et in enumerate(self.edge_types):
            ei = edge_index_dict.get(et)
            if ei is None or ei.numel() == 0:
                continue
            edges.append(ei + torch.tensor([[start[et[0]]], [start[et[2]]]]))
            kinds.append(torch.full((ei.size(1),), k, dtype=torch.long))
        edge_index, edge_type = torch.cat(edges, 1), torch.cat(kinds)
        h = self.conv2(self.conv1(x, edge_index, edge_type).relu(), edge_index, edge_type)
        return dict(zip(self.node_types, h.split(sizes)))


def test_an_rgcn_over_the_types_trains_the_same_out_of_core(typed_store: Path, tmp_path: Path) -> None:
    model = diskflow.Model("typed-rgcn", TypedRGCN)
    ref = _run("inmemory", typed_store, tmp_path / "m", model=model)
    rep = _run("belady", typed_store, tmp_path / "b", model=model, superbatch_size=4)
    assert _losses(rep) == _losses(ref) and np.isfinite(ref["epochs"][-1]["loss"])


def test_packed_loader_yields_pyg_heterodata(typed_store: Path, tmp_path: Path) -> None:
    diskflow.prepare(typed_store, tmp_path / "p", "belady", epochs=1, batch_size=64, fanouts=(3, 2), quiet=True)
    lay = Store(typed_store).hetero
    with diskflow.PackedLoader(tmp_path / "p") as loader:
        batch = next(iter(loader))
    assert isinstance(batch, HeteroData)
    assert set(batch.node_types) == {"paper", "author", "institution"} and len(batch.edge_types) == 5
    assert batch["paper"].batch_size == 64 and batch["paper"].y.shape == batch["paper"].n_id.shape
    for t in lay.node_types:
        store = batch[t.name]
        assert store.x.shape == (store.n_id.numel(), t.dim) and len(store.num_sampled_nodes) == 3
    for et in batch.edge_types:
        assert batch[et].edge_index.dtype == torch.long and batch[et].e_id.numel() == batch[et].edge_index.size(1)


def test_what_a_typed_store_refuses(typed_store: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="^history_memory: a typed store's sampler does not prune"):
        _run("outre", typed_store, tmp_path / "o")
    # without derivation, the featureless types' nodes would join batches with no rows
    from_pyg(_graph(), tmp_path / "raw")
    with dask.config.set(scheduler="sync"):
        run_ingest(tmp_path / "raw", tmp_path / "bare", shard_rows=256)
    with pytest.raises(InputError, match="node type 'author' has no features"):
        _run("inmemory", tmp_path / "bare", tmp_path / "i")
    code = main(["run", "inmemory", "--dataset", str(tmp_path / "bare"), "--runs-dir", str(tmp_path / "cli"),
                 "--epochs", "1", "--no-progress"])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "has no features" in err[0]
    # no labelled node type: the seeds' type is unknown
    unlabelled = _graph()
    for key in ("y", "train_mask", "val_mask", "test_mask"):
        del unlabelled["paper"][key]
    from_pyg(unlabelled, tmp_path / "raw-nolabels")
    with dask.config.set(scheduler="sync"):
        run_ingest(tmp_path / "raw-nolabels", tmp_path / "nolabels", shard_rows=256, derive=DERIVE)
    code = main(["run", "inmemory", "--dataset", str(tmp_path / "nolabels"), "--runs-dir", str(tmp_path / "cli"),
                 "--epochs", "1", "--no-progress"])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "needs seeds of one labelled node type" in err[0], err


FANOUTS = ("paper__cites__paper=4,3;author__writes__paper=3,2;paper__rev_writes__author=2,2;"
           "author__affiliated_with__institution=1,1;institution__rev_affiliated_with__author=2,2")


def test_fanouts_per_edge_type_from_the_command_line(typed_store: Path, tmp_path: Path,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    common = ["--dataset", str(typed_store), "--epochs", "1", "--batch-size", "128", "--hidden", "16", "--threads",
              "1", "--no-progress", "--fanouts", FANOUTS]
    assert main(["run", "inmemory", *common, "--runs-dir", str(tmp_path / "m")]) == 0
    assert main(["run", "belady", *common, "--runs-dir", str(tmp_path / "b")]) == 0
    import json
    reps = [json.loads(next((tmp_path / d).glob("*/report.json")).read_text()) for d in ("m", "b")]
    assert reps[0]["epochs"][0]["losses"] == reps[1]["epochs"][0]["losses"]
    capfd.readouterr()
    bad = FANOUTS.replace("paper__cites__paper", "paper__writes__paper")
    code = main(["run", "belady", *common[:-1], bad, "--runs-dir", str(tmp_path / "x")])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "unknown edge type 'paper__writes__paper'" in err[0], err
    # a dict in Python: the same fanouts as the command line's, the same samples out of core
    ref = _run("belady", typed_store, tmp_path / "d", epochs=1, fanouts=parse_fanouts(FANOUTS))
    rep = _run("inmemory", typed_store, tmp_path / "e", epochs=1, fanouts={
        ("paper", "cites", "paper"): [4, 3], ("author", "writes", "paper"): [3, 2],
        ("paper", "rev_writes", "author"): [2, 2], ("author", "affiliated_with", "institution"): [1, 1],
        ("institution", "rev_affiliated_with", "author"): [2, 2]})
    assert _losses(ref) == _losses(rep)


def test_two_gpu_workers_train_a_typed_store_as_one_with_two_batches_a_step(typed_store: Path, tmp_path: Path) -> None:
    """`--gpus 2`: two data-parallel workers, each with its own lane of typed rows, take the steps one worker
    takes with batches_per_step=2 (the float sums' order aside)."""
    opts = {**OPTS, "epochs": 1, "superbatch_size": 4, "window": 2}
    streaming = load_pipeline("streaming")
    one = streaming.run(typed_store, tmp_path / "one", workers=1, processes=False, batches_per_step=2, **opts)
    two = streaming.run(typed_store, tmp_path / "two", workers=2, processes=True, gpus=2, **opts)
    flat = [x for r in one["epochs"] for x in r["losses"]]
    assert [x for r in two["epochs"] for x in r["losses"]] == pytest.approx(flat, rel=1e-5, abs=1e-6)


class _Cut(Exception):
    pass


def test_a_streamed_typed_run_resumes_where_it_stopped(typed_store: Path, tmp_path: Path) -> None:
    """Stopped after two superbatches, a streamed run on a typed store resumes from its checkpoint (the
    to_hetero model's state included) to the uninterrupted run's losses."""
    opts = {**OPTS, "superbatch_size": 4, "window": 2, "workers": 1, "processes": False}
    streaming = load_pipeline("streaming")
    whole = streaming.run(typed_store, tmp_path / "whole", **opts)
    seen: list[str] = []

    def cut(out: dict) -> None:
        seen.append(out["key"])
        if len(seen) == 2:
            raise _Cut

    with pytest.raises(_Cut):
        streaming.run(typed_store, tmp_path / "cut", on_superbatch=cut, **opts)
    rep = streaming.run(typed_store, tmp_path / "cut", resume=True, **opts)
    assert rep["resumed_from"] and rep["stream"]["start_index"] == 2
    assert [x for r in rep["epochs"] for x in r["losses"]] == [x for r in whole["epochs"] for x in r["losses"]]


def test_the_online_loader_yields_heterodata(typed_store: Path) -> None:
    lay = Store(typed_store).hetero
    loader = diskflow.OnlineLoader(typed_store, batch_size=64, fanouts=(3, 2), threads=1)
    try:
        batch = next(iter(loader))
    finally:
        loader.close()
    assert isinstance(batch, HeteroData) and batch["paper"].batch_size == 64
    assert {t.name: batch[t.name].x.size(1) for t in lay.node_types} == {t.name: t.dim for t in lay.node_types}
    assert batch["paper"].y.shape == batch["paper"].n_id.shape
