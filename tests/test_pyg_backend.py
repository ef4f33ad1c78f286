"""diskflow as a PyG remote backend (`diskflow.pyg`): PyG's own loaders over a store's FeatureStore and
GraphStore give the batches they give over the same graph in memory (node batches, and link batches with
a plain edge_label_index, edge ids and edge attributes), a stock GraphSAGE trains through them, the row
cache keeps to its budget and serves the store's rows, and bad input fails in one line."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch_geometric.typing
from diskflow.flow.ingest import run_ingest
from diskflow.operators.formats.store import Store
from diskflow.operators.ingest.pygimport import from_pyg
from diskflow.operators.prepare.sample import NeighborSampler as NativeSampler
from torch_geometric.data import Data
from torch_geometric.loader import LinkLoader, LinkNeighborLoader, NeighborLoader, NodeLoader
from torch_geometric.nn import GraphSAGE
from torch_geometric.sampler import NegativeSampling

from diskflow.errors import ConfigError, InputError
from diskflow.pyg import EDGE_TYPE, FeatureStore, GraphStore, NeighborSampler, RowCache, link_input

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
                      *rest: object) -> tuple[object, ...]:
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
    with pytest.raises(ConfigError) as refused:
        FeatureStore(tiny_store, cache_memory="10%")
    assert refused.value.option == "cache_memory" and f"the smallest budget that works is {least:,} bytes" in str(refused.value)
    assert "\n" not in str(refused.value)
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


@pytest.fixture(scope="module")
def edge_graph(tmp_path_factory: pytest.TempPathFactory) -> tuple[Data, Path]:
    """A PyG `Data` with edge features (random edges, so some repeated and some self-loops, in no order)
    and the store `diskflow.operators.ingest.pygimport` and ingest make of it."""
    import dask

    g = torch.Generator().manual_seed(3)
    n, e = 517, 4001
    data = Data(x=torch.randn(n, 6, generator=g), edge_index=torch.randint(0, n, (2, e), generator=g),
                edge_attr=torch.randn(e, 3, generator=g), y=torch.randint(0, 4, (n,), generator=g))
    root = tmp_path_factory.mktemp("edge_graph")
    with dask.config.set(scheduler="sync"):
        from_pyg(data, root / "raw")
        run_ingest(root / "raw", root / "store")
    return data, root / "store"


def test_node_batches_carry_the_stores_edge_features(edge_graph: tuple[Data, Path],
                                                      backend: tuple[FeatureStore, GraphStore]) -> None:
    """A node batch's ``e_id`` names the store's edge (CSC position) under each column of ``edge_index``,
    and its ``edge_attr`` is those edges' features; a store without edge features gives ``e_id`` alone."""
    features, graph = FeatureStore(edge_graph[1]), GraphStore(edge_graph[1])
    store = features.store
    assert store.edge_features is not None
    table = store.edge_features.read_all()
    assert features.num_edge_features == 3 and features.get_tensor_size(EDGE_TYPE, "edge_attr") == (store.num_edges, 3)
    assert torch.equal(features[(None, None), "edge_attr", torch.tensor([4, 0])], torch.from_numpy(table[[4, 0]]))
    assert [a.attr_name for a in features.get_all_tensor_attrs()] == ["x", "y"]   # edge rows go by e_id, not n_id
    loader = NodeLoader((features, graph), NeighborSampler(graph, FANOUTS, seed=4), input_nodes=torch.arange(200),
                        batch_size=64)
    for batch in loader:
        n_id, e_id = batch.n_id.numpy(), batch.e_id.numpy()
        assert batch.edge_attr.shape == (batch.edge_index.size(1), 3) and e_id.shape == (batch.edge_index.size(1),)
        assert np.array_equal(batch.edge_attr.numpy(), table[e_id])
        assert np.array_equal(np.asarray(store.indices)[e_id], n_id[batch.edge_index[0].numpy()])
        target = np.searchsorted(np.asarray(store.indptr), e_id, side="right") - 1      # the CSC column of each edge
        assert np.array_equal(target, n_id[batch.edge_index[1].numpy()])
    plain_features, plain_graph = backend
    batch = next(iter(NodeLoader((plain_features, plain_graph), NeighborSampler(plain_graph, FANOUTS, seed=4),
                                 input_nodes=torch.arange(50), batch_size=50)))
    assert "edge_attr" not in batch and batch.e_id.numel() == batch.edge_index.size(1)
    assert np.array_equal(np.asarray(plain_graph.indices)[batch.e_id.numpy()], batch.n_id[batch.edge_index[0]].numpy())


NEGATIVES = {"none": {}, "binary": {"neg_sampling_ratio": 1.0}, "triplet": {"neg_sampling": NegativeSampling("triplet", 2)}}


@pytest.mark.parametrize(("negatives", "form"), [("none", "plain"), ("binary", "plain"), ("binary", "tuple"),
                                                 ("triplet", "plain")])
def test_link_neighbor_loader_gives_the_in_memory_batches(edge_graph: tuple[Data, Path], negatives: str,
                                                          form: str) -> None:
    """PyG's LinkNeighborLoader with diskflow's sampler, over the store (a plain [2, P] tensor, or PyG's
    ``(None, tensor)``) and over the in-memory Data it came from, with the same seed: the same batches.
    Node ids are the Data's in both; edge ids are CSC positions over the store and ``edge_index`` columns
    over the Data, one the other through the sampler's `edge_permutation`."""
    data, path = edge_graph
    features, graph = FeatureStore(path), GraphStore(path)
    local_sampler = NeighborSampler(data, FANOUTS)
    assert np.array_equal(local_sampler.indptr, graph.indptr) and np.array_equal(local_sampler.indices, graph.indices)
    perm = local_sampler.edge_permutation
    assert perm is not None and torch.equal(data.edge_index[0][perm], torch.from_numpy(np.asarray(graph.indices, np.int64)))
    pairs = torch.cat([data.edge_index[:, ::9], torch.randint(0, data.num_nodes, (2, 60),
                                                              generator=torch.Generator().manual_seed(5))], dim=1)

    def batches(source: object, sampler: NeighborSampler, edge_label_index: object) -> list[Data]:
        loader = LinkNeighborLoader(source, num_neighbors=FANOUTS, edge_label_index=edge_label_index, batch_size=64,
                                    shuffle=True, neighbor_sampler=sampler, **NEGATIVES[negatives])
        torch.manual_seed(7)        # the shuffle, the negatives and the sampler's seeds: one stream for both
        return list(loader)

    remote = batches((features, graph), NeighborSampler(graph, FANOUTS), pairs if form == "plain" else (None, pairs))
    local = batches(data, local_sampler, pairs)
    assert len(remote) == len(local) == -(-pairs.size(1) // 64)
    label_keys = {"none": ("edge_label_index",), "binary": ("edge_label_index", "edge_label"),
                  "triplet": ("src_index", "dst_pos_index", "dst_neg_index")}[negatives]
    table = features.store.edge_features.read_all()
    for a, b in zip(remote, local, strict=True):
        for key in ("n_id", "edge_index", "x", "y", "edge_attr", "input_id", *label_keys):
            assert torch.equal(a[key], b[key]), key
        assert torch.equal(perm[a.e_id], b.e_id)
        assert np.array_equal(a.edge_attr.numpy(), table[a.e_id.numpy()])
        assert torch.equal(b.edge_attr, data.edge_attr[b.e_id])
        assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges
        # the seed links themselves: their end nodes' local ids, positives first
        seeds = pairs[:, a.input_id]
        if negatives == "triplet":
            assert torch.equal(a.n_id[a.src_index], seeds[0]) and torch.equal(a.n_id[a.dst_pos_index], seeds[1])
            assert a.dst_neg_index.shape == (a.input_id.numel(), 2)
        else:
            k = a.input_id.numel()
            assert torch.equal(a.n_id[a.edge_label_index[:, :k]], seeds)
            if negatives == "binary":
                assert torch.equal(a.edge_label, torch.cat([torch.ones(k), torch.zeros(k)]))
                assert a.edge_label_index.size(1) == 2 * k
            else:       # PyG's own rule: no negatives and no labels given, no edge_label
                assert "edge_label" not in a and "edge_label" not in b and a.edge_label_index.size(1) == k
        assert torch.equal(a.n_id[: a.num_sampled_nodes[0]], a.n_id[: a.num_sampled_nodes[0]].unique())   # sorted seeds


def test_link_inputs_pyg_forms_and_refusals(edge_graph: tuple[Data, Path]) -> None:
    """Every form of ``edge_label_index`` PyG documents for a homogeneous graph works over a diskflow pair;
    any other is a ConfigError naming ``edge_label_index`` (never PyG's bare AssertionError), and link times
    (no temporal sampling here) a ValueError naming ``edge_label_time``."""
    features, graph = FeatureStore(edge_graph[1]), GraphStore(edge_graph[1])
    pairs = graph.edges()[:, :50]
    every = graph.edges()
    assert every.shape == (2, graph.store.num_edges) and torch.equal(every[0], torch.from_numpy(np.asarray(graph.indices, np.int64)))
    for form, expect in ((pairs, pairs), ((None, pairs), pairs), ((EDGE_TYPE, pairs), pairs), (None, every),
                         (EDGE_TYPE, every), ((None, None), every), ([EDGE_TYPE, None], every)):
        input_type, edges = link_input(graph, form)
        assert input_type is None and torch.equal(edges, expect)
    sampler = NeighborSampler(graph, FANOUTS)
    loader = LinkLoader((features, graph), link_sampler=sampler, edge_label_index=(EDGE_TYPE, pairs), batch_size=25)
    assert len(list(loader)) == 2
    bad = {
        "one edge type": ((("user", "rates", "movie"), pairs), "has one edge type"),
        "shape": (torch.zeros(3, 4, dtype=torch.long), r"\[2, P\] tensor .* got shape \[3, 4\]"),
        "float": (pairs.float(), "must be integers"),
        "range": (pairs + graph.num_nodes, r"must lie in \[0, 517\)"),
        "array": (pairs.numpy(), "got ndarray"),
        "list": ([1, 2, 3], "got a list of 3"),
    }
    for name, (value, message) in bad.items():
        with pytest.raises(ConfigError, match=message) as e:
            LinkNeighborLoader((features, graph), num_neighbors=FANOUTS, edge_label_index=value, neighbor_sampler=sampler)
        assert e.value.option == "edge_label_index" and "\n" not in str(e.value), name
    timed = LinkLoader((features, graph), link_sampler=sampler, edge_label_index=pairs, edge_label_time=torch.zeros(50),
                       batch_size=25)
    with pytest.raises(ValueError, match="edge_label_time: diskflow's neighbour sampler does not sample by time"):
        next(iter(timed))
    with pytest.raises(TypeError, match="got str"):
        NeighborSampler("graph", FANOUTS)       # type: ignore[arg-type]
    with pytest.raises(InputError, match="has no link split"):
        graph.link_edges("train")
