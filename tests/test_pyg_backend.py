"""diskflow as a PyG remote backend (`diskflow.pyg`): PyG's own loaders over a store's FeatureStore and
GraphStore give the batches they give over the same graph in memory, a stock GraphSAGE trains through
them, the row cache keeps to its budget and serves the store's rows, and bad input fails in one line."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch_geometric.typing
from diskflow.operators.formats.store import Store
from diskflow.operators.prepare.sample import NeighborSampler as NativeSampler
from torch_geometric.data import Data
from torch_geometric.loader import LinkLoader, NeighborLoader, NodeLoader
from torch_geometric.nn import GraphSAGE

from diskflow.errors import ConfigError, InputError
from diskflow.pyg import FeatureStore, GraphStore, NeighborSampler, RowCache

BUDGET = "400KiB"           # the tiny store's 773 kB of features: about a quarter of its rows, beside the buffers
FANOUTS = [5, 5]


@pytest.fixture(scope="module")
def backend(tiny_store: Path) -> tuple[FeatureStore, GraphStore]:
    return FeatureStore(tiny_store, cache_memory=BUDGET), GraphStore(tiny_store)


def _in_memory(store: Store) -> Data:
    """The store as PyG users hold a graph today: every feature and label in RAM, edge_index from the CSC."""
    dst = np.repeat(np.arange(store.num_nodes), np.diff(store.indptr))
    edge_index = np.stack([np.asarray(store.indices, np.int64), dst])
    return Data(x=torch.from_numpy(store.read_features()), y=torch.from_numpy(store.labels.copy()),
                edge_index=torch.from_numpy(edge_index))


def _loader(data: object, graph: GraphStore, store: Store, seed: int = 11, **kw: object) -> NodeLoader:
    torch.manual_seed(0)        # the loader's shuffle; the sampler draws from its own seed
    return NodeLoader(data, node_sampler=NeighborSampler(graph, num_neighbors=FANOUTS, seed=seed),
                      input_nodes=torch.from_numpy(store.split_ids("train")), batch_size=256, shuffle=True, **kw)


def test_node_loader_gives_the_in_memory_batches(backend: tuple[FeatureStore, GraphStore]) -> None:
    features, graph = backend
    store = features.store
    remote = list(_loader((features, graph), graph, store))
    local = list(_loader(_in_memory(store), graph, store))
    assert len(remote) == len(local) == -(-store.split_ids("train").shape[0] // 256)
    for a, b in zip(remote, local, strict=True):
        for key in ("x", "y", "edge_index", "n_id"):
            assert torch.equal(a[key], b[key]), key
        assert a.batch_size == b.batch_size and a.num_sampled_nodes == b.num_sampled_nodes
        assert a.x.dtype == torch.float32 and a.num_nodes == a.n_id.numel()
    # what NeighborLoader puts on a batch: the native sampler's output for the batch's seeds
    first = remote[0]
    seeds = first.n_id[: first.batch_size]
    again = NativeSampler(store.indptr, store.indices, FANOUTS, 1).sample(seeds, seed=NeighborSampler(
        graph, FANOUTS, seed=11)._next_seed())
    assert np.array_equal(again.n_id, first.n_id.numpy()) and np.array_equal(again.edge_index, first.edge_index.numpy())
    assert list(first.num_sampled_edges) == again.num_sampled_edges


def test_stock_graphsage_trains_through_it(backend: tuple[FeatureStore, GraphStore], one_torch_thread: None) -> None:
    features, graph = backend
    store = features.store
    torch.manual_seed(0)
    model = GraphSAGE(store.feature_dim, 16, num_layers=len(FANOUTS), out_channels=store.num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for batch in _loader((features, graph), graph, store):
        opt.zero_grad()
        out = model(batch.x, batch.edge_index)[: batch.batch_size]
        loss = torch.nn.functional.cross_entropy(out, batch.y[: batch.batch_size])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert len(losses) > 3 and all(np.isfinite(losses))


@pytest.mark.parametrize("policy", ["degree", "lru"])
def test_cache_keeps_its_budget_and_serves_the_stores_rows(tiny_store: Path, policy: str) -> None:
    features = FeatureStore(tiny_store, cache_memory=BUDGET, policy=policy)
    cache, store = features.cache, features.store
    rows = store.read_features()
    rng = np.random.default_rng(0)
    for _ in range(6):      # random calls with repeats: every row right, whether it hit or was read
        ids = rng.integers(0, store.num_nodes, 3000)
        assert np.array_equal(features[None, "x", torch.from_numpy(ids)].numpy(), rows[ids])
    c = cache.counters()
    assert c["hits"] > 0 and c["misses"] > 0 and c["evicted"] > 0 and c["bytes_read"] > 0
    held = cache.cached()
    assert held.shape[0] == cache.slots and np.unique(held).shape[0] == held.shape[0]
    hits = c["hits"]
    assert np.array_equal(cache.gather(held[::-1]), rows[held[::-1]])      # all from the cache
    assert cache.counters()["hits"] - hits == held.shape[0] and cache.counters()["misses"] == c["misses"]
    mem = cache.memory()
    budget = 400 << 10
    assert mem["budget"] == budget and mem["total_bytes"] <= budget
    # what is really allocated: the slots, the tables, the staging rows, the reader's bounce buffer
    allocated = (cache.rows.nbytes + cache.slot_of.nbytes + cache.node_of.nbytes + cache.key.nbytes
                 + sum(a.nbytes for a in cache.policy.arrays()) + cache.reader.staging.nbytes
                 + cache.reader.reader.bounce_bytes)
    assert allocated == mem["total_bytes"]
    assert features[None, "y", 7].item() == store.labels[7] and features[None, "x", 2:5].shape == (3, store.feature_dim)
    mask = torch.zeros(store.num_nodes, dtype=torch.bool)
    mask[[3, 9]] = True
    assert torch.equal(features[None, "x", mask], torch.from_numpy(rows[[3, 9]]))
    whole = FeatureStore(tiny_store, cache_memory="200%", policy=policy).cache       # room for every row: never more slots
    assert whole.slots == store.num_nodes and whole.memory()["total_bytes"] <= 2 * store.feature_bytes
    with pytest.raises(IndexError, match="out of range"):
        features[None, "x", torch.tensor([store.num_nodes])]


def test_degree_cache_keeps_the_rows_most_neighbour_lists_hold(tiny_store: Path) -> None:
    store = Store(tiny_store)
    cache = FeatureStore(store, cache_memory=BUDGET).cache
    degree = np.bincount(np.asarray(store.indices), minlength=store.num_nodes)
    assert np.array_equal(cache.policy.degree, degree)
    rows = store.read_features()
    everything = np.random.default_rng(1).permutation(store.num_nodes)
    assert np.array_equal(cache.gather(everything), rows[everything])     # one call larger than the cache
    held = np.zeros(store.num_nodes, bool)
    held[cache.cached()] = True
    assert held.sum() == cache.slots and degree[held].min() >= degree[~held].max()
    admitted = cache.counts["admitted"]
    ids = np.random.default_rng(2).integers(0, store.num_nodes, 2000)
    assert np.array_equal(cache.gather(ids), rows[ids]) and cache.counts["admitted"] == admitted   # none ranks higher
    lru = FeatureStore(store, cache_memory=BUDGET, policy="lru").cache
    lru.gather(everything[: lru.slots])
    first = set(lru.cached().tolist())
    lru.gather(everything[lru.slots: lru.slots + 10])       # the 10 least recently used rows give way
    assert len(first - set(lru.cached().tolist())) == 10


def test_what_pyg_asks_of_the_stores(backend: tuple[FeatureStore, GraphStore]) -> None:
    features, graph = backend
    store = features.store
    assert [(a.group_name, a.attr_name) for a in features.get_all_tensor_attrs()] == [(None, "x"), (None, "y")]
    assert features.get_tensor_size(None, "x") == (store.num_nodes, store.feature_dim)
    assert features.get_tensor_size("node", "y") == (store.num_nodes,) and features.get_tensor_size(None, "z") is None
    assert (features.num_features, features.num_classes) == (store.feature_dim, store.num_classes)
    (attr,) = graph.get_all_edge_attrs()
    assert attr.edge_type is None and attr.layout.value == "csc" and attr.size == (store.num_nodes,) * 2
    row, colptr, perm = graph.csc()
    assert perm is None and row.dtype == colptr.dtype == torch.int64
    assert np.array_equal(row.numpy(), store.indices) and np.array_equal(colptr.numpy(), store.indptr)
    assert torch.equal(graph.get_edge_index(("node", "to", "node"), "csc")[0], row)
    assert not features.put_tensor(torch.zeros(1), None, "x", None) and not graph.put_edge_index((row, colptr), None, "csc")


def _pyg_lib_stand_in(colptr: torch.Tensor, row: torch.Tensor, seed: torch.Tensor, num_neighbors: list[int],
                      *rest: object) -> tuple[torch.Tensor, ...]:
    """pyg-lib's ``neighbor_sample`` (csc, directed, not disjoint) for the test: the native sampler over
    exactly the arrays PyG's NeighborSampler took from the GraphStore."""
    b = NativeSampler(colptr.numpy(), row.numpy(), num_neighbors, 1).sample(seed, seed=5)
    ei = torch.from_numpy(b.edge_index)
    return ei[0], ei[1], torch.from_numpy(b.n_id), None, b.num_sampled_nodes, b.num_sampled_edges


def test_stock_neighbor_loader_reads_the_stores(backend: tuple[FeatureStore, GraphStore],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """PyG's own NeighborLoader over the pair, its pyg-lib call stood in for (no wheels here): the batches
    carry the store's rows and labels of their nodes and only edges of the graph."""
    features, graph = backend
    store = features.store
    monkeypatch.setattr(torch_geometric.typing, "WITH_PYG_LIB", True)
    monkeypatch.setattr(torch.ops.pyg, "neighbor_sample", _pyg_lib_stand_in, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = NeighborLoader((features, graph), num_neighbors=FANOUTS, batch_size=200,
                                input_nodes=torch.from_numpy(store.split_ids("train")))
    rows = store.read_features()
    dst = np.repeat(np.arange(store.num_nodes), np.diff(store.indptr))
    edges = np.asarray(store.indices, np.int64) * store.num_nodes + dst
    for batch in loader:
        n_id = batch.n_id.numpy()
        assert np.array_equal(batch.x.numpy(), rows[n_id]) and np.array_equal(batch.y.numpy(), store.labels[n_id])
        src, tgt = n_id[batch.edge_index.numpy()]
        assert np.isin(src * store.num_nodes + tgt, edges).all()


def test_link_loader_samples_around_edges(backend: tuple[FeatureStore, GraphStore]) -> None:
    features, graph = backend
    row, col, _ = graph.coo()
    loader = LinkLoader((features, graph), link_sampler=NeighborSampler((features, graph), FANOUTS, seed=2),
                        edge_label_index=(None, torch.stack([row[:300], col[:300]])), batch_size=100,
                        neg_sampling="binary")
    batch = next(iter(loader))
    assert batch.edge_label_index.shape == (2, 200) and batch.x.shape == (batch.n_id.numel(), features.store.feature_dim)


def test_the_default_cache_works_on_a_small_store(tiny_store: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The default 10% is below what the row cache needs on a store this small: raised to the smallest budget that
    works (and logged), where the same 10% given by the caller is refused in one line."""
    store = Store(tiny_store)
    least = RowCache.smallest_budget(store)
    assert store.feature_bytes // 10 < least
    with caplog.at_level("INFO", logger="diskflow"):
        features = FeatureStore(tiny_store)
    assert features.cache.budget == least and features.cache.slots >= 1
    assert any(m.startswith("cache_memory: the default (10%, ") for m in caplog.messages), caplog.messages
    ids = np.array([5, 4000, 5], np.int64)
    assert np.array_equal(features.gather(ids), store.gather(ids))
    with pytest.raises(ConfigError) as e:
        FeatureStore(tiny_store, cache_memory="10%")
    assert e.value.option == "cache_memory" and "\n" not in str(e.value)


def test_bad_input_fails_in_one_line(tiny_store: Path, tiny_raw: Path, tmp_path: Path) -> None:
    for path in (tmp_path / "nowhere", tmp_path):
        for make in (FeatureStore, GraphStore):
            with pytest.raises(InputError) as e:
                make(path)
            assert e.value.path == str(path) and "not a diskflow store" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(InputError, match="manifest.json"):
        FeatureStore(tiny_raw)
    store = Store(tiny_store)
    least = RowCache.smallest_budget(store)
    with pytest.raises(ConfigError) as e:
        FeatureStore(tiny_store, cache_memory="10%")
    assert e.value.option == "cache_memory" and f"the smallest budget that works is {least:,} bytes" in str(e.value)
    assert "\n" not in str(e.value)
    assert FeatureStore(tiny_store, cache_memory=least).cache.slots == 1
    with pytest.raises(ConfigError, match=f"smallest budget that works is {least:,} bytes"):
        FeatureStore(tiny_store, cache_memory=least - 1)
    with pytest.raises(ConfigError, match="cache_memory: not a byte size"):
        FeatureStore(tiny_store, cache_memory="lots")
    with pytest.raises(ConfigError, match="policy: expected one of degree, lru, got 'fifo'"):
        FeatureStore(tiny_store, cache_memory=BUDGET, policy="fifo")
    with pytest.raises(ConfigError, match="policy: expected one of degree, lru, got 'hybrid'"):
        FeatureStore(tiny_store, cache_memory=BUDGET, policy="hybrid")      # it looks ahead: online only
    with pytest.raises(ConfigError, match="num_neighbors"):
        NeighborSampler(GraphStore(tiny_store), [5, -2])


@pytest.mark.parametrize("uring", [True, False], ids=["auto", "pread"])
def test_loader_workers_read_with_their_own_reader(tiny_store: Path, uring: bool,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Forked loader workers open their own direct-I/O reader and sampler (rings and threads do not survive a
    fork): their batches carry the store's rows. With the pread fallback too (a host that refuses io_uring),
    whose parent's threads a worker must not try to join."""
    if not uring:
        monkeypatch.setenv("DISKFLOW_NO_URING", "1")
    features, graph = FeatureStore(tiny_store, cache_memory=BUDGET), GraphStore(tiny_store)
    store = features.store
    features.cache.gather(np.arange(10))        # the parent's reader exists before the fork
    rows = store.read_features()
    loader = _loader((features, graph), graph, store, num_workers=2, multiprocessing_context="fork")
    batches = list(loader)
    assert len(batches) == len(list(_loader((features, graph), graph, store)))
    for batch in batches:
        assert np.array_equal(batch.x.numpy(), rows[batch.n_id.numpy()])
