"""Edge features on the training paths: in-memory batches carry `edge_attr` aligned with `edge_index` (the
store's rows at each sampled edge's `e_id`), a model that reads them trains on them, and a loader that does not
serve them refuses such a model in one line instead of training it without them."""
from __future__ import annotations

from pathlib import Path

import dask
import numpy as np
import pytest
import torch
from diskflow.flow.ingest import run_ingest
from diskflow.flow.pipeline import load_pipeline
from diskflow.flow.runtimes import memory
from diskflow.operators.formats.store import Store
from diskflow.operators.ingest.raw import write_raw_dataset
from diskflow.operators.prepare.sample import NeighborSampler
from diskflow.operators.train.batches import InMemoryLoader
from diskflow.operators.train.session import StoreFeatures

from diskflow.errors import ConfigError

RUN = {"epochs": 1, "batch_size": 64, "fanouts": (4, 3), "hidden": 16, "heads": 2, "progress": False, "threads": 1}


@pytest.fixture(scope="module")
def edge_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 600-node graph whose edges carry 3 features: the source's label, and two of noise."""
    rng = np.random.default_rng(1)
    root = tmp_path_factory.mktemp("edges")
    n = 600
    labels = rng.integers(0, 3, n)
    src, dst = rng.integers(0, n, 5000), rng.integers(0, n, 5000)
    attr = np.stack([labels[src], rng.standard_normal(5000), rng.standard_normal(5000)], 1).astype(np.float32)
    splits = np.array(["train", "val", "test"])[rng.choice(3, n, p=[0.6, 0.2, 0.2])]
    raw = write_raw_dataset(root / "raw", src=src, dst=dst, features=rng.standard_normal((n, 8)).astype(np.float32),
                            labels=labels, splits=splits, edge_attr=attr, edge_parts=2)
    with dask.config.set(scheduler="sync"):
        run_ingest(raw, root / "store", shard_rows=256)
    return root / "store"


def test_in_memory_batches_carry_the_sampled_edges_features(edge_store: Path) -> None:
    st = Store(edge_store)
    assert st.edge_features is not None and st.edge_features.dim == 3
    sampler = NeighborSampler(st.indptr, st.indices, [4, 3])
    loader = InMemoryLoader(torch.from_numpy(st.read_features()), torch.from_numpy(st.labels), sampler,
                            st.split_ids("train"), 64, True, 0, edge_features=StoreFeatures(st, edges=True))
    batch = next(iter(loader))
    e_id = batch.e_id.numpy()
    assert batch.edge_attr.shape == (batch.edge_index.shape[1], 3)
    assert np.array_equal(batch.edge_attr.numpy(), st.edge_features.gather(e_id))
    # each e_id is the CSC position of the edge it labels: its source is indices[e_id]
    assert np.array_equal(np.asarray(st.indices)[e_id], batch.n_id[batch.edge_index[0]].numpy())


@pytest.mark.parametrize("pipeline", ["belady", "ginex"])
def test_a_model_reading_edge_attr_has_identical_losses_in_memory_and_packed(edge_store: Path, tmp_path: Path,
                                                                            pipeline: str) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "b").mkdir()
    run = {**RUN, "epochs": 2}
    ref = memory.run(edge_store, tmp_path / "m", model="gat", **run)
    packed = load_pipeline(pipeline).run(edge_store, tmp_path / "b", model="gat", **run)
    assert ref["dataset"]["edge_dim"] == 3 and packed["dataset"]["edge_dim"] == 3
    for a, b in zip(ref["epochs"], packed["epochs"]):
        assert a["losses"] == b["losses"]
    edges = packed["prepare"]["figures"]["edges"]
    # the edge rows were tiered and planned, and the CPU tier did not hold them all
    assert edges["cpu_rows"] > 0 and edges["misses"] > 0 and 0.0 < edges["read_share"] < 1.0


def test_packed_batches_carry_the_store_edge_rows_and_verify_checks_them(edge_store: Path, tmp_path: Path) -> None:
    from diskflow.operators.formats.verify import verify
    from diskflow.operators.train.loader import PackedLoader

    from diskflow.errors import InputError

    with dask.config.set(scheduler="sync"):
        load_pipeline("belady").prepare(edge_store, tmp_path / "p", quiet=True, fanouts=(4, 3), batch_size=64,
                                        epochs=2, cpu_memory=600_000)
    st = Store(edge_store)
    assert st.edge_features is not None
    for pipelined in (True, False):
        loader = PackedLoader(tmp_path / "p", pipelined=pipelined)
        n = 0
        for batch in loader:
            assert batch.edge_attr.shape == (batch.edge_index.shape[1], 3)
            assert np.array_equal(batch.edge_attr.numpy(), st.edge_features.gather(batch.e_id.numpy()))
            loader.release(batch)
            n += 1
        assert n == loader.num_batches and loader.stats()["edges"]["tiers"]["total"] > 0
        loader.close()
    # a budget given as a share of the features is a share of the node and edge rows together
    from diskflow.operators.formats.manifest import read_manifest
    from diskflow.operators.formats.packed import budget_bytes

    assert st.budget_bytes == st.feature_bytes + st.num_edges * st.edge_features.row_bytes
    assert budget_bytes(read_manifest(tmp_path / "p") or {}) == st.budget_bytes
    report = verify(tmp_path / "p", full=True)
    assert report["edges"]["compared_batches"] == report["batches"]
    part = max((tmp_path / "p" / "edges").glob("round-*/part-*"), key=lambda f: f.stat().st_size)
    with open(part, "r+b") as f:            # one flipped byte in a packed edge segment
        f.seek(5)
        b = f.read(1)
        f.seek(5)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(InputError, match="edges"):
        verify(tmp_path / "p", full=True)


def test_a_budget_that_cannot_hold_both_tables_is_refused_naming_them(edge_store: Path, tmp_path: Path) -> None:
    with dask.config.set(scheduler="sync"), pytest.raises(ConfigError, match="node rows .* edge rows"):
        load_pipeline("belady").prepare(edge_store, tmp_path / "p", quiet=True, fanouts=(4, 3), batch_size=64,
                                        cpu_memory=500_000)
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("pipeline", ["gnndrive", "outre"])
def test_online_and_split_memory_pipelines_serve_edge_rows(edge_store: Path, tmp_path: Path, pipeline: str) -> None:
    """An online pipeline reads edge rows through the page cache; OUTRE's memory split plans each candidate
    within the node rows' part of the budgets (the plan it keeps is the one the loader's budget holds)."""
    report = load_pipeline(pipeline).run(edge_store, tmp_path, model="gat", **RUN)
    assert report["epochs"][0]["loss"] is not None and report["dataset"]["edge_dim"] == 3


STREAM = {**RUN, "epochs": 2, "superbatch_size": 3, "device": "cpu", "window": 2, "cpu_memory": 4_800_000}


def test_a_streamed_run_carries_planned_edge_rows(edge_store: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A streamed run plans the edge rows on a chain of their own and ships them with each superbatch: a model
    that reads edge_attr trains on them with the in-memory run's losses, bit for bit."""
    from diskflow.pipelines import streaming

    (tmp_path / "m").mkdir()
    ref = memory.run(edge_store, tmp_path / "m", model="gat", **{k: v for k, v in STREAM.items()
                                                                 if k not in ("superbatch_size", "device", "window",
                                                                              "cpu_memory")})
    # (the bundles travel through a shared directory here, `stage`; the other tests' travel through Dask)
    rep = streaming.run(edge_store, tmp_path / "s", workers=1, processes=False, model="gat",
                        stage=str(tmp_path / "stage"), **STREAM)
    assert [r["losses"] for r in rep["epochs"]] == [r["losses"] for r in ref["epochs"]]
    assert rep["dataset"]["edge_dim"] == 3 and rep["stream"]["edge_tiers"]["cpu_rows"] > 0
    rows = rep["trainer"]["edges"]["tiers"]["rows"]
    assert rows["cpu"] > 0 and rows["packed"] > 0       # the edge rows' CPU tier held some, and some were packed
    from diskflow.cli.run import _print_summary

    _print_summary(rep)         # what `diskflow run streaming` prints of them
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("edge rows:"))
    assert f"{rep['stream']['edge_tiers']['cpu_rows']:,} (CPU)" in line and "packed" in line


class _Cut(Exception):
    pass


def test_a_streamed_run_with_edge_rows_resumes_where_it_stopped(edge_store: Path, tmp_path: Path) -> None:
    """Stopped after two superbatches, the run resumes from its checkpoint: both tables' CPU tiers are the
    ones their plans left there, and the losses are the uninterrupted run's."""
    from diskflow.pipelines import streaming

    whole = streaming.run(edge_store, tmp_path / "whole", workers=1, processes=False, model="gat", **STREAM)
    seen: list[str] = []

    def cut(out: dict) -> None:
        seen.append(out["key"])
        if len(seen) == 2:
            raise _Cut

    run_dir = tmp_path / "cut"
    with pytest.raises(_Cut):
        streaming.run(edge_store, run_dir, workers=1, processes=False, model="gat", on_superbatch=cut, **STREAM)
    from diskflow.operators.formats.packed import EDGE_IDS
    from diskflow.operators.train.checkpoint import latest_checkpoint

    saved = latest_checkpoint(run_dir / "checkpoints")
    assert saved is not None and (saved / EDGE_IDS).is_file()     # the edge rows' tier, which the resume starts from
    rep = streaming.run(edge_store, run_dir, workers=1, processes=False, model="gat", resume=True, **STREAM)
    assert rep["resumed_from"] and rep["stream"]["start_index"] == 2
    losses = [x for r in whole["epochs"] for x in r["losses"]]
    assert [x for r in rep["epochs"] for x in r["losses"]] == losses


def test_edge_rows_stream_to_two_gpu_workers(edge_store: Path, tmp_path: Path) -> None:
    """Each GPU worker plans and receives the edge rows of its own share; two equal one stepping every two
    batches (the float sums' order aside). A CPU tier the workers share holds node rows only: refused."""
    from diskflow.pipelines import streaming

    one = streaming.run(edge_store, tmp_path / "one", workers=1, processes=False, model="gat", batches_per_step=2,
                        **STREAM)
    two = streaming.run(edge_store, tmp_path / "two", workers=2, processes=True, gpus=2, model="gat", **STREAM)
    flat = [x for r in one["epochs"] for x in r["losses"]]
    assert [x for r in two["epochs"] for x in r["losses"]] == pytest.approx(flat, rel=1e-5, abs=1e-6)
    assert all(lane["tiers"] for lane in two["stream"]["lanes"])
    with pytest.raises(ConfigError, match="^cache: a shared CPU tier holds node rows only"):
        streaming.run(edge_store, tmp_path / "shared", workers=2, processes=True, gpus=2, cache="shared",
                      model="gat", **STREAM)


def test_a_link_task_reads_edge_rows_on_every_path(tmp_path: Path) -> None:
    """Link prediction with edge features: a model that reads edge_attr has the in-memory run's losses and test
    MRR in belady (its default budget reserves the worst-case batch of pairs' endpoints in both tables) and
    streamed."""
    from diskflow.pipelines import belady, inmemory, streaming

    rng = np.random.default_rng(2)
    n = 800
    src, dst = rng.integers(0, n, 6000), rng.integers(0, n, 6000)
    raw = write_raw_dataset(tmp_path / "raw", src=src, dst=dst, features=rng.standard_normal((n, 8)).astype(np.float32),
                            labels=rng.integers(0, 3, n), splits=np.array(["train"] * n),
                            edge_attr=rng.standard_normal((6000, 4)).astype(np.float32), edge_parts=2)
    with dask.config.set(scheduler="sync"):
        run_ingest(raw, tmp_path / "store", shard_rows=256, link_split=(0.05, 0.1), link_negatives=20)
    opts = {"task": "link", "model": "gat", "epochs": 1, "batch_size": 200, "fanouts": (4, 3), "hidden": 16,
            "heads": 2, "progress": False, "threads": 1, "seed": 1, "device": "cpu"}
    for d in ("m", "b"):
        (tmp_path / d).mkdir()
    ref = inmemory.run(tmp_path / "store", tmp_path / "m", **opts)
    with dask.config.set(scheduler="sync"):
        packed = belady.run(tmp_path / "store", tmp_path / "b", superbatch_size=4, **opts)
    streamed = streaming.run(tmp_path / "store", tmp_path / "s", window=2, workers=1, processes=False,
                             superbatch_size=4, **opts)
    assert ref["dataset"]["edge_dim"] == 4
    for rep in (packed, streamed):
        assert [r["losses"] for r in rep["epochs"]] == [r["losses"] for r in ref["epochs"]]
        assert rep["final"]["test_mrr"] == ref["final"]["test_mrr"]
