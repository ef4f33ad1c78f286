"""diskflow as a PyG remote backend for typed stores (`diskflow.pyg`, `diskflow.pyghetero`): over a store
ingested from a HeteroData (a featureless type derived at ingest, one left featureless, a float16 type,
reverse edges) the feature store serves each type's own rows, the graph store each edge type's CSC, and
PyG's NodeLoader over the pair with the typed sampler gives the batches it gives over the HeteroData
itself; a stock to_hetero(GraphSAGE) trains on them."""
from __future__ import annotations

import pickle
from pathlib import Path

import dask
import numpy as np
import pytest
import torch
import torch_geometric.transforms as T
from diskflow.flow.ingest import run_ingest
from diskflow.operators.formats.store import Store
from diskflow.operators.ingest.pygimport import from_pyg
from torch_geometric.data import HeteroData, TensorAttr
from torch_geometric.data.graph_store import EdgeLayout
from torch_geometric.loader import NodeLoader
from torch_geometric.nn import GraphSAGE, to_hetero
from torch_geometric.sampler import NodeSamplerInput

from diskflow.errors import ConfigError
from diskflow.pyg import FeatureStore, GraphStore, NeighborSampler
from diskflow.pyghetero import HeteroNeighborSampler

FANOUTS = [3, 2]
DERIVE = ["institution=mean:author__affiliated_with__institution"]
SIZES = {"paper": 300, "author": 200, "institution": 20, "field": 15}


def _graph() -> HeteroData:
    """paper (float32, 8 wide, labels, splits), author (float16, 5 wide), institution and field featureless;
    reverse edges by ToUndirected."""
    g = np.random.default_rng(0)
    p, a, i, f = SIZES["paper"], SIZES["author"], SIZES["institution"], SIZES["field"]
    data = HeteroData()
    data["paper"].x = torch.from_numpy(g.normal(size=(p, 8)).astype(np.float32))
    data["paper"].y = torch.from_numpy(g.integers(0, 4, p))
    split = g.integers(0, 3, p)
    for k, name in enumerate(("train_mask", "val_mask", "test_mask")):
        data["paper"][name] = torch.from_numpy(split == k)
    data["author"].x = torch.from_numpy(g.normal(size=(a, 5)).astype(np.float16))
    data["institution"].num_nodes = i
    data["field"].num_nodes = f
    data["paper", "cites", "paper"].edge_index = torch.from_numpy(g.integers(0, p, (2, 1500)))
    data["author", "writes", "paper"].edge_index = torch.from_numpy(np.stack([g.integers(0, a, 900),
                                                                              g.integers(0, p, 900)]))
    data["author", "affiliated_with", "institution"].edge_index = torch.from_numpy(
        np.stack([g.integers(0, a, 250), g.integers(0, i, 250)]))
    data["paper", "has_topic", "field"].edge_index = torch.from_numpy(np.stack([g.integers(0, p, 400),
                                                                                g.integers(0, f, 400)]))
    return T.ToUndirected()(data)


@pytest.fixture(scope="module")
def graph() -> HeteroData:
    return _graph()


@pytest.fixture(scope="module")
def typed_store(graph: HeteroData, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("pyghetero")
    from_pyg(graph, tmp / "raw")
    with dask.config.set(scheduler="sync"):
        run_ingest(tmp / "raw", tmp / "store", shard_rows=64, memory_budget="256KiB", derive=DERIVE)
    return tmp / "store"


@pytest.fixture(scope="module")
def backend(typed_store: Path) -> tuple[FeatureStore, GraphStore]:
    return FeatureStore(typed_store, cache_memory="330KiB"), GraphStore(typed_store)


def test_feature_store_serves_each_types_own_rows(backend: tuple[FeatureStore, GraphStore],
                                                 graph: HeteroData) -> None:
    features, _ = backend
    store = features.store
    table = store.read_features()
    assert [(a.group_name, a.attr_name) for a in features.get_all_tensor_attrs()] == [
        ("paper", "x"), ("paper", "y"), ("author", "x"), ("institution", "x")]
    for name in ("paper", "author"):
        x = features[name, "x", None]
        assert x.dtype == graph[name].x.dtype and torch.equal(x, graph[name].x), name
        assert features.get_tensor_size(name, "x") == tuple(graph[name].x.shape)
    inst = store.hetero.node("institution")
    derived = features["institution", "x", None]
    assert inst.derived is not None and derived.shape == (inst.count, 5) and derived.dtype == torch.float16
    assert torch.equal(derived, torch.from_numpy(table[inst.offset:inst.stop, :5].astype(np.float16)))
    assert torch.equal(features["paper", "y", None], graph["paper"].y)
    # PyG's index forms, over local ids
    assert torch.equal(features["author", "x", 7], graph["author"].x[7])
    assert torch.equal(features["author", "x", 3:9], graph["author"].x[3:9])
    mask = torch.zeros(SIZES["author"], dtype=torch.bool)
    mask[[2, 150]] = True
    assert torch.equal(features["author", "x", mask], graph["author"].x[[2, 150]])
    with pytest.raises(IndexError, match=r"author node id 200 is out of range \[0, 200\)"):
        features["author", "x", torch.tensor([200])]
    # one batch's x of every type: one read of the row cache
    calls = features.cache.counts["calls"]
    ids = {"paper": torch.tensor([5, 1]), "author": torch.tensor([9]), "institution": torch.tensor([0, 19])}
    got = features.multi_get_tensor([TensorAttr(n, "x", i) for n, i in ids.items()])
    assert features.cache.counts["calls"] == calls + 1
    assert torch.equal(got[0], graph["paper"].x[[5, 1]]) and torch.equal(got[1], graph["author"].x[[9]])
    assert torch.equal(got[2], derived[[0, 19]])


def test_feature_store_refuses_what_it_does_not_hold(backend: tuple[FeatureStore, GraphStore]) -> None:
    features, _ = backend
    with pytest.raises(KeyError, match=r"unknown node type 'venue' .*paper, author, institution, field"):
        features["venue", "x", None]
    with pytest.raises(KeyError, match="unknown node type None"):
        features[None, "x", None]
    with pytest.raises(KeyError, match=r"node type 'field' has no 'x' \(it serves nothing"):
        features["field", "x", None]
    with pytest.raises(KeyError, match=r"node type 'author' has no 'y' \(it serves 'x'\)"):
        features["author", "y", None]
    assert features.get_tensor_size("field", "x") is None and features.get_tensor_size("venue", "x") is None


def test_graph_store_gives_each_edge_types_csc(backend: tuple[FeatureStore, GraphStore], graph: HeteroData) -> None:
    _, gs = backend
    attrs = gs.get_all_edge_attrs()
    assert [a.edge_type for a in attrs] == graph.edge_types
    assert gs.metadata() == (graph.node_types, graph.edge_types)
    for attr in attrs:
        src, _, dst = attr.edge_type
        assert attr.layout == EdgeLayout.CSC and attr.size == (SIZES[src], SIZES[dst])
        row, colptr = gs.get_edge_index(attr)
        assert row.dtype == colptr.dtype == torch.long and colptr.numel() == SIZES[dst] + 1
        cols = torch.repeat_interleave(torch.arange(SIZES[dst]), colptr.diff())
        ours = np.lexsort(np.stack([row.numpy(), cols.numpy()])[::-1])
        theirs_ei = graph[attr.edge_type].edge_index.numpy()
        theirs = np.lexsort(theirs_ei[::-1])
        # the same multiset of (source, destination) pairs
        assert np.array_equal(np.stack([row.numpy(), cols.numpy()])[:, ours], theirs_ei[:, theirs]), attr.edge_type
        coo_row, coo_col, _ = gs.coo([attr.edge_type])      # PyG converts from the csc layout itself
        assert torch.equal(coo_row[attr.edge_type], row) and torch.equal(coo_col[attr.edge_type], cols)
    with pytest.raises(KeyError):
        gs.get_edge_index(("paper", "writes", "author"), "csc")
    want = torch.from_numpy(np.flatnonzero(graph["paper"].train_mask.numpy()))
    assert torch.equal(gs.split_ids("train"), want) and torch.equal(gs.split_ids("train", "paper"), want)
    assert gs.split_ids("val", "author").numel() == 0
    with pytest.raises(ConfigError, match="node_type.*unknown node type 'venue'"):
        gs.split_ids("train", "venue")
    with pytest.raises(ValueError, match="typed store"):
        gs.edges()


def _loader(data: object, sampler: HeteroNeighborSampler) -> NodeLoader:
    return NodeLoader(data, node_sampler=sampler, input_nodes=("paper", torch.arange(40, 140)), batch_size=30)


def test_node_loader_over_the_pair_gives_the_heterodatas_batches(backend: tuple[FeatureStore, GraphStore],
                                                                 graph: HeteroData) -> None:
    features, gs = backend
    table = features.store.read_features()
    remote = list(_loader((features, gs), HeteroNeighborSampler(gs, FANOUTS, seed=7)))
    local_sampler = HeteroNeighborSampler(graph, FANOUTS, seed=7)
    local = list(_loader(graph, local_sampler))
    assert HeteroNeighborSampler((features, gs), FANOUTS).edge_permutation is None
    assert len(remote) == len(local) == 4
    inst = features.store.hetero.node("institution")
    for a, b in zip(remote, local, strict=True):
        assert set(a.node_types) == set(b.node_types) and set(a.edge_types) == set(b.edge_types)
        for nt in b.node_types:
            assert torch.equal(a[nt].n_id, b[nt].n_id), nt
            assert a[nt].num_nodes == b[nt].num_nodes == b[nt].n_id.numel(), nt
            assert a[nt].num_sampled_nodes == b[nt].num_sampled_nodes, nt
        for nt in ("paper", "author"):
            assert a[nt].x.dtype == b[nt].x.dtype and torch.equal(a[nt].x, b[nt].x), nt
        want = table[inst.offset + a["institution"].n_id.numpy(), :5].astype(np.float16)
        assert torch.equal(a["institution"].x, torch.from_numpy(want))
        assert "x" not in a["field"] and "x" not in b["institution"]
        assert torch.equal(a["paper"].y, b["paper"].y) and "y" not in a["author"]
        assert a["paper"].batch_size == b["paper"].batch_size and torch.equal(a["paper"].input_id, b["paper"].input_id)
        for et in b.edge_types:
            assert torch.equal(a[et].edge_index, b[et].edge_index), et
            assert a[et].num_sampled_edges == b[et].num_sampled_edges, et
            # a store's edge ids are CSC positions; PyG maps the HeteroData's through the permutation
            assert torch.equal(local_sampler.edge_permutation[et][a[et].e_id], b[et].e_id), et
            row, _ = gs.get_edge_index(et, "csc")
            assert torch.equal(row[a[et].e_id], a[et[0]].n_id[a[et].edge_index[0]]), et
    # a node type as input_nodes: PyG counts its nodes from the graph store's edge attributes
    assert len(NodeLoader((features, gs), node_sampler=HeteroNeighborSampler(gs, FANOUTS), input_nodes="paper",
                          batch_size=100)) == 3


def test_stock_to_hetero_graphsage_trains_on_the_pairs_batches(backend: tuple[FeatureStore, GraphStore],
                                                               one_torch_thread: None) -> None:
    features, gs = backend
    torch.manual_seed(0)
    model = to_hetero(GraphSAGE((-1, -1), 16, num_layers=len(FANOUTS), out_channels=4), gs.metadata(), aggr="sum")
    field = torch.nn.Embedding(SIZES["field"], 8)        # the featureless type learns its rows
    loader = NodeLoader((features, gs), node_sampler=HeteroNeighborSampler(gs, FANOUTS, seed=3),
                        input_nodes=("paper", gs.split_ids("train")), batch_size=32, shuffle=True)
    batch = next(iter(loader))
    x_dict = {nt: batch[nt].x.float() for nt in ("paper", "author", "institution")}
    x_dict["field"] = field(batch["field"].n_id)
    with torch.no_grad():
        model(x_dict, batch.edge_index_dict)        # the lazy layers take their widths
    opt = torch.optim.Adam([*model.parameters(), *field.parameters()], lr=1e-2)
    losses = []
    for step, batch in enumerate(loader):
        if step == 4:
            break
        x_dict = {nt: batch[nt].x.float() for nt in ("paper", "author", "institution")}
        x_dict["field"] = field(batch["field"].n_id)
        opt.zero_grad()
        n = batch["paper"].batch_size
        out = model(x_dict, batch.edge_index_dict)["paper"][:n]
        loss = torch.nn.functional.cross_entropy(out, batch["paper"].y[:n])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert len(losses) == 4 and all(np.isfinite(losses))


def test_samplers_refuse_the_other_kind_of_store(backend: tuple[FeatureStore, GraphStore], tiny_store: Path) -> None:
    _, gs = backend
    with pytest.raises(TypeError, match="typed store: sample it with diskflow.pyghetero.HeteroNeighborSampler"):
        NeighborSampler(gs, FANOUTS)
    with pytest.raises(TypeError, match="homogeneous store: sample it with diskflow.pyg.NeighborSampler"):
        HeteroNeighborSampler(GraphStore(tiny_store), FANOUTS)
    with pytest.raises(TypeError, match="expected a torch_geometric HeteroData"):
        HeteroNeighborSampler(Store(tiny_store), FANOUTS)       # type: ignore[arg-type]


def test_the_typed_sampler_pickles_as_its_store(backend: tuple[FeatureStore, GraphStore]) -> None:
    _, gs = backend
    seeds = NodeSamplerInput(None, torch.arange(10, 30), input_type="paper")
    ours = HeteroNeighborSampler(gs, FANOUTS, seed=2)
    again = pickle.loads(pickle.dumps(ours))     # a spawned loader worker's copy opens the store afresh
    assert again.graph is not gs and again.graph.store.path == gs.store.path and again.edge_permutation is None
    a, b = ours.sample_from_nodes(seeds), again.sample_from_nodes(seeds)
    assert all(torch.equal(a.node[t], b.node[t]) for t in a.node)
    assert all(torch.equal(a.edge[k], b.edge[k]) and torch.equal(a.row[k], b.row[k]) for k in a.edge)
