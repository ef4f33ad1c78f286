"""Batches shaped like NeighborLoader's, the shared training loop, and the models."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from diskflow.operators.prepare.sample import NeighborSampler
from diskflow.operators.train.batches import (
    TEST_STREAM,
    TRAIN_STREAM,
    VAL_STREAM,
    InMemoryLoader,
    batch_seed,
    seed_batches,
    to_data,
)
from diskflow.operators.train.loop import deterministic, evaluate, forward, train_epoch
from diskflow.operators.train.models import MODELS, build_model
from diskflow.operators.train.session import TrainConfig

from diskflow.errors import ConfigError

NEIGHBORLOADER_FIELDS = {"x", "edge_index", "y", "n_id", "batch_size", "num_sampled_nodes", "num_sampled_edges"}


def homophilous_graph(n: int = 1203, classes: int = 4, dim: int = 13, deg: int = 6, seed: int = 3):
    """A small CSC graph whose in-neighbours mostly share the node's label; features carry a weak label signal."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    dst = np.repeat(np.arange(n), deg)
    src = rng.integers(0, n, dst.size)
    same = rng.random(dst.size) < 0.85
    sorted_by_label = np.argsort(y, kind="stable")
    starts = np.searchsorted(y[sorted_by_label], np.arange(classes))
    counts = np.bincount(y, minlength=classes)
    # a random node of the destination's class, vectorised
    pick = starts[y[dst]] + (rng.random(dst.size) * counts[y[dst]]).astype(np.int64)
    src[same] = sorted_by_label[pick[same]]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))]).astype(np.int64)
    indices = src[np.argsort(dst, kind="stable")].astype(np.int32)
    x = (0.3 * rng.normal(size=(classes, dim))[y] + rng.normal(size=(n, dim))).astype(np.float32)
    return indptr, indices, torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


@pytest.fixture(scope="module")
def graph():
    return homophilous_graph()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ------------------------------------------------------------------ seed batches and sampling seeds

def test_seed_batches_partition_the_seeds_in_a_fixed_order() -> None:
    seeds = np.arange(100, 1101, dtype=np.int64)  # 1001 seeds: the last batch is short
    batches = seed_batches(seeds, 64, epoch=0, seed=5)
    assert [b.size for b in batches] == [64] * 15 + [41]
    assert np.array_equal(np.sort(np.concatenate(batches)), seeds)
    again = seed_batches(seeds, 64, epoch=0, seed=5)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again))
    assert not np.array_equal(np.concatenate(batches), np.concatenate(seed_batches(seeds, 64, epoch=1, seed=5)))
    assert not np.array_equal(np.concatenate(batches), np.concatenate(seed_batches(seeds, 64, epoch=0, seed=6)))
    assert np.array_equal(np.concatenate(seed_batches(seeds, 64, 3, 5, shuffle=False)), seeds)
    with pytest.raises(ConfigError, match="^batch_size"):
        seed_batches(seeds, 0, 0, 0)


def test_batch_seeds_differ_by_batch_epoch_and_stream() -> None:
    seeds = {batch_seed(0, e, i, s) for e in range(3) for i in range(50) for s in (TRAIN_STREAM, VAL_STREAM, TEST_STREAM)}
    assert len(seeds) == 3 * 50 * 3
    assert all(0 <= s < 2**63 for s in seeds)
    assert batch_seed(7, 1, 2) == batch_seed(7, 1, 2) != batch_seed(8, 1, 2)


# ------------------------------------------------------------------ to_data

def test_to_data_has_neighborloader_fields_and_gathers_rows(graph) -> None:
    indptr, indices, _, _ = graph
    n = indptr.size - 1
    identity = torch.arange(n, dtype=torch.float32).unsqueeze(1).repeat(1, 3)  # row v is (v, v, v)
    labels = torch.arange(n, dtype=torch.int64) * 7
    seeds = np.array([5, 1200, 17, 640, 3, 999, 42], dtype=np.int64)
    sample = NeighborSampler(indptr, indices, [4, 3], num_threads=1).sample(seeds, seed=11)
    batch = to_data(sample, identity, labels)

    assert set(batch.keys()) == NEIGHBORLOADER_FIELDS
    assert batch.batch_size == seeds.size and isinstance(batch.batch_size, int)
    assert torch.equal(batch.n_id[:batch.batch_size], torch.from_numpy(seeds))
    assert batch.n_id.dtype == batch.edge_index.dtype == batch.y.dtype == torch.int64
    assert torch.equal(batch.x, identity[batch.n_id])
    assert torch.equal(batch.x[:, 0].long(), batch.n_id)
    assert torch.equal(batch.y, labels[batch.n_id])
    assert batch.num_sampled_nodes[0] == seeds.size and len(batch.num_sampled_nodes) == 3
    assert sum(batch.num_sampled_nodes) == batch.num_nodes == batch.n_id.numel()
    assert len(batch.num_sampled_edges) == 2 and sum(batch.num_sampled_edges) == batch.edge_index.size(1)
    assert batch.edge_index.shape[0] == 2 and int(batch.edge_index.max()) < batch.num_nodes
    # source -> target: every edge (u -> v) is an in-edge of v in the CSC, i.e. u in indices[indptr[v]:indptr[v+1]]
    src, dst = batch.n_id[batch.edge_index].numpy()
    csc_pairs = np.repeat(np.arange(n), np.diff(indptr)) * n + indices
    assert np.isin(dst * n + src, csc_pairs).all()
    # the first hop's edges all end at a seed
    first = batch.edge_index[:, :batch.num_sampled_edges[0]]
    assert int(first[1].max()) < batch.batch_size


def test_in_memory_loader_yields_every_train_seed_once_per_epoch(graph) -> None:
    indptr, indices, x, y = graph
    seeds = np.arange(0, 1203, 2, dtype=np.int64)  # 602 seeds
    loader = InMemoryLoader(x, y, NeighborSampler(indptr, indices, [3, 2], num_threads=1), seeds, 100,
                            shuffle=True, seed=4)
    assert len(loader) == 7
    loader.set_epoch(2)
    first = list(loader)
    assert len(first) == 7 and sum(b.batch_size for b in first) == seeds.size
    assert np.array_equal(np.sort(np.concatenate([b.n_id[:b.batch_size].numpy() for b in first])), seeds)
    assert set(loader.stage_s) == {"sample", "gather"} and all(v > 0 for v in loader.stage_s.values())
    second = list(loader)  # same epoch again: identical batches
    assert all(torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index) for a, b in zip(first, second))
    loader.set_epoch(3)
    assert not torch.equal(next(iter(loader)).n_id, first[0].n_id)


# ------------------------------------------------------------------ models

@pytest.mark.parametrize("name", MODELS)
def test_models_share_one_call(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(name, 9, 8, 3, num_layers=2, dropout=0.1, heads=2)
    x = torch.randn(10, 9)
    edge_index = torch.tensor([[1, 2, 3, 4], [0, 0, 1, 2]])
    assert model(x, edge_index).shape == (10, 3)


def test_mlp_ignores_edges_and_sage_does_not() -> None:
    torch.manual_seed(0)
    x = torch.randn(6, 5)
    edges = torch.tensor([[1, 2, 3], [0, 0, 1]])
    none = torch.zeros(2, 0, dtype=torch.long)
    mlp, sage = build_model("mlp", 5, 8, 3, 2).eval(), build_model("sage", 5, 8, 3, 2).eval()
    assert torch.equal(mlp(x, edges), mlp(x, none))
    assert not torch.allclose(sage(x, edges)[:2], sage(x, none)[:2])


def test_model_and_config_errors_name_the_option() -> None:
    with pytest.raises(ConfigError, match="^model: unknown model 'gin'"):
        build_model("gin", 4, 8, 2, 2)
    with pytest.raises(ConfigError, match="^hidden"):
        build_model("gat", 4, 10, 2, 2, heads=4)
    with pytest.raises(ConfigError, match="^fanouts"):
        TrainConfig(fanouts=(5, -2))
    with pytest.raises(ConfigError, match="^epochs"):
        TrainConfig(epochs=0)
    with pytest.raises(ConfigError, match="^lr"):
        TrainConfig(lr=-1.0)
    assert TrainConfig(fanouts=(4, 3, 2)).num_layers == 3


# ------------------------------------------------------------------ training loop

def _train(graph, model: str, seed: int, epochs: int = 3, lr: float = 0.01):
    indptr, indices, x, y = graph
    train_ids = np.arange(0, 900, dtype=np.int64)
    test_ids = np.arange(900, 1203, dtype=np.int64)
    sampler = NeighborSampler(indptr, indices, [5, 5], num_threads=1)
    train = InMemoryLoader(x, y, sampler, train_ids, 128, shuffle=True, seed=seed)
    test = InMemoryLoader(x, y, sampler, test_ids, 128, shuffle=False, seed=seed, stream=TEST_STREAM)
    torch.manual_seed(seed)
    net = build_model(model, x.size(1), 32, 4, num_layers=2)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    results = []
    with deterministic():
        for epoch in range(epochs):
            train.set_epoch(epoch)
            results.append(train_epoch(net, train, opt, "cpu"))
        acc = evaluate(net, test, "cpu")
    return results, acc


def test_train_epoch_learns_and_reports_stages(graph) -> None:
    results, acc = _train(graph, "sage", seed=0)
    r = results[0]
    assert r["batches"] == 8 and len(r["losses"]) == 8 and r["seeds"] == 900
    assert set(r["stage_s"]) == {"sample", "gather", "train"} and r["seconds"] > 0
    assert results[-1]["loss"] < results[0]["loss"] - 0.2
    assert acc > 0.6  # chance is 0.25


def test_training_is_deterministic_for_a_seed(graph) -> None:
    a, acc_a = _train(graph, "sage", seed=1, epochs=2)
    b, acc_b = _train(graph, "sage", seed=1, epochs=2)
    c, _ = _train(graph, "sage", seed=2, epochs=2)
    assert [r["losses"] for r in a] == [r["losses"] for r in b] and acc_a == acc_b
    assert [r["losses"] for r in a] != [r["losses"] for r in c]
    assert not torch.are_deterministic_algorithms_enabled()  # the context restored the global setting


@pytest.mark.parametrize("name", ["sage", "gat"])
def test_trimmed_forward_gives_the_same_seed_logits(graph, name: str) -> None:
    indptr, indices, x, y = graph
    sample = NeighborSampler(indptr, indices, [4, 3, 2], num_threads=1).sample(np.arange(0, 600, 7), seed=3)
    batch = to_data(sample, x, y)
    torch.manual_seed(0)
    model = build_model(name, x.size(1), 16, 4, num_layers=3).eval()
    with torch.no_grad():
        assert torch.equal(forward(model, batch), model(batch.x, batch.edge_index)[:batch.batch_size])
