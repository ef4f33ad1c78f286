"""A link task end to end: seed edges and their negatives drawn ahead like every other read, the same batches
in memory and packed (identical losses), no leakage of validation edges into training samples, and the
one-line refusals."""
from __future__ import annotations

from pathlib import Path

import dask
import numpy as np
import pytest
from diskflow.flow.ingest import run_ingest
from diskflow.flow.pipeline import load_pipeline
from diskflow.flow.runtimes import memory
from diskflow.operators.formats.store import Store
from diskflow.operators.ingest.raw import write_raw_dataset
from diskflow.operators.prepare.sample import NeighborSampler
from diskflow.operators.prepare.task import Task, attach_labels, epoch_seeds, eval_link_batches, link_batches
from diskflow.operators.train.linkmetrics import link_figures, roc_auc

from diskflow.errors import ConfigError, InputError

LINK = {"task": "link", "epochs": 2, "batch_size": 800, "fanouts": (4, 3), "hidden": 16, "progress": False,
        "eval_every": 2, "threads": 1}


@pytest.fixture(scope="module")
def link_store(tiny_raw: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny_raw` with a seeded random edge split (5% validation, 10% test) and 30 negatives per positive."""
    out = tmp_path_factory.mktemp("link") / "store"
    with dask.config.set(scheduler="sync"):
        run_ingest(tiny_raw, out, shard_rows=1000, link_split=(0.05, 0.1), link_negatives=30)
    return out


def test_link_batches_are_pyg_link_batches() -> None:
    edges = np.array([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]])
    (b, c) = link_batches(edges, 3, epoch=0, seed=1, task=Task("link", 2.0), num_nodes=10)
    for batch in (b, c):
        pairs = batch.seeds[batch.label_index]             # the pairs in global ids
        positives = int(batch.label.sum())
        assert batch.label_index.shape[1] == 3 * positives   # two negatives per positive
        assert np.array_equal(batch.seeds, np.unique(pairs)) # sorted distinct endpoints, as PyG's unique()
        assert set(map(tuple, pairs[:, :positives].T)) <= set(map(tuple, edges.T))
        assert (batch.label[:positives] == 1).all() and (batch.label[positives:] == 0).all()
    again = link_batches(edges, 3, epoch=0, seed=1, task=Task("link", 2.0), num_nodes=10, only=range(1, 2))
    assert np.array_equal(again[0].seeds, c.seeds) and np.array_equal(again[0].label_index, c.label_index)
    other = link_batches(edges, 3, epoch=1, seed=1, task=Task("link", 2.0), num_nodes=10)
    assert any(not np.array_equal(x.label_index, y.label_index) for x, y in zip((b, c), other))


def test_degree_weighted_negatives_follow_in_degree() -> None:
    indptr = np.array([0, 0, 0, 90, 100])           # node 2 has in-degree 90, node 3 ten, 0 and 1 none
    edges = np.zeros((2, 500), dtype=np.int64)
    batches = link_batches(edges, 500, 0, 3, Task("link", 4.0, "degree"), 4, indptr=indptr)
    pairs = batches[0].seeds[batches[0].label_index][:, 500:]
    share = float((pairs == 2).mean())
    assert set(np.unique(pairs)) <= {2, 3} and 0.85 < share < 0.95


def test_evaluation_batches_rank_each_positive_against_its_negatives() -> None:
    edges = np.array([[0, 1, 2], [3, 4, 5]])
    negatives = np.array([[6, 7], [8, 9], [6, 9]])
    batches = eval_link_batches(edges, negatives, batch_size=8, seed=0, stream=1)
    assert [int(b.label.sum()) for b in batches] == [2, 1]        # 8 // (2 + 2) positives a batch
    first = batches[0]
    pairs = first.seeds[first.label_index]
    assert pairs[:, :2].tolist() == [[0, 1], [3, 4]]
    assert pairs[:, 2:].tolist() == [[0, 0, 1, 1], [6, 7, 8, 9]]


def test_link_figures_match_their_definitions() -> None:
    pos = np.array([0.9, 0.2, 0.5])
    neg = np.array([[0.1, 0.3], [0.4, 0.2], [0.5, 0.6]])
    f = link_figures(pos, neg, hits_k=1)
    # ranks: 1; 2.5 (one above, one tie); 2.5 (one tie, one above)
    assert f["mrr"] == pytest.approx((1 + 1 / 2.5 + 1 / 2.5) / 3)
    assert f["hits"] == pytest.approx(1 / 3)
    brute = np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg.ravel()])
    assert roc_auc(pos, neg) == pytest.approx(brute)


def test_validation_edges_are_not_reachable_from_training_samples(tmp_path: Path) -> None:
    """A validation edge between two nodes that nothing else joins would be predicted trivially if message
    passing could see it: it is not in the store's graph, so no training sample reaches across it."""
    rng = np.random.default_rng(0)
    n = 200
    src = rng.integers(0, n - 2, 1500)
    dst = rng.integers(0, n - 2, 1500)
    pairs = np.unique(np.stack([src, dst])[:, src != dst], axis=1)      # distinct pairs: one split each
    src, dst = pairs[0], pairs[1]
    split = np.where(rng.random(src.shape[0]) < 0.1, "test", "train").astype(object)
    # nodes n-2 and n-1: joined only by a validation edge, both ways
    src = np.concatenate([src, [n - 2, n - 1]])
    dst = np.concatenate([dst, [n - 1, n - 2]])
    split = np.concatenate([split, ["val", "val"]])
    raw = write_raw_dataset(tmp_path / "raw", src=src, dst=dst,
                            features=rng.standard_normal((n, 4)).astype(np.float32),
                            labels=np.zeros(n, np.int64), splits=["train"] * n, edge_split=split)
    with dask.config.set(scheduler="sync"):
        run_ingest(raw, tmp_path / "store")
    st = Store(tmp_path / "store")
    held = {tuple(e) for name in ("val", "test") for e in st.link_edges(name).T.tolist()}
    assert (n - 2, n - 1) in held
    sampler = NeighborSampler(st.indptr, st.indices, [-1, -1])
    for epoch in range(2):
        for b in epoch_seeds(st, 64, epoch, 5, Task("link", 3.0)):
            s = attach_labels(sampler.sample(b.seeds, b.sampling_seed), b)
            n_id = np.asarray(s.n_id)
            sampled = {tuple(e) for e in n_id[np.asarray(s.edge_index)].T.tolist()}     # (src, dst) pairs
            assert not sampled & held
    assert int(np.diff(st.indptr)[n - 2]) == 0 and int(np.diff(st.indptr)[n - 1]) == 0


def test_link_losses_are_identical_in_memory_and_packed(link_store: Path, tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "b").mkdir()
    ref = memory.run(link_store, tmp_path / "m", **LINK)
    packed = load_pipeline("belady").run(link_store, tmp_path / "b", **LINK)
    for a, b in zip(ref["epochs"], packed["epochs"]):
        assert a["losses"] == b["losses"]
    final = ref["final"]
    assert final["test_mrr"] == packed["final"]["test_mrr"] and final["test_auc"] == packed["final"]["test_auc"]
    assert 0.0 < final["test_mrr"] <= 1.0 and final["hits_k"] == 50
    assert packed["config"]["task"] == "link"


def test_a_link_task_needs_an_edge_split(tiny_store: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="a link task needs an edge split"):
        memory.run(tiny_store, tmp_path, **LINK)


def test_link_options_are_checked(link_store: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="batches"):
        memory.run(link_store, tmp_path, **{**LINK, "batches": "partition"})
    with pytest.raises(ConfigError, match="neg_sampling"):
        memory.run(link_store, tmp_path, **{**LINK, "neg_sampling": "hard"})
    with pytest.raises(ConfigError, match="neg_ratio"):
        load_pipeline("belady").prepare_config(neg_ratio=2.0).validate()


# 45,330 training edges: 57 batches an epoch at 800; streamed at 1800, 26 batches, superbatches of 4 ending in
# one of 2 (each GPU worker a batch), stepped two by two in the one-worker run
STREAM = {**LINK, "model": "sage", "superbatch_size": 4, "device": "cpu", "seed": 1, "epochs": 1, "eval_every": 1,
          "batch_size": 1800}


def _losses(report: dict) -> list[float]:
    return [x for r in report["epochs"] for x in r["losses"]]


def test_a_link_task_streams_as_it_prepares(link_store: Path, tmp_path: Path) -> None:
    from diskflow.pipelines import belady, streaming

    with dask.config.set(scheduler="sync"):
        ref = belady.run(link_store, tmp_path / "ref", **STREAM)
    rep = streaming.run(link_store, tmp_path / "stream", window=2, workers=1, processes=False, **STREAM)
    assert _losses(rep) == _losses(ref)
    assert rep["final"]["test_mrr"] == ref["final"]["test_mrr"] and rep["config"]["task"] == "link"


def test_a_link_task_trains_on_two_gpu_workers(link_store: Path, tmp_path: Path) -> None:
    """Two data-parallel workers equal one worker stepping every two batches (the float sums' order aside)."""
    from diskflow.pipelines import streaming

    one = streaming.run(link_store, tmp_path / "one", window=2, workers=1, processes=False, batches_per_step=2,
                        **STREAM)
    two = streaming.run(link_store, tmp_path / "two", window=2, workers=2, processes=True, gpus=2, **STREAM)
    assert _losses(two) == pytest.approx(_losses(one), rel=1e-5, abs=1e-6)
    assert two["final"]["test_mrr"] == pytest.approx(one["final"]["test_mrr"], rel=1e-4)
