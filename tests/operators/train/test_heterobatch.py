"""Typed batches: the typed sampler's flat sample, split into a `HeteroData`, has the fields, types and
shapes (and here the values) PyG's heterogeneous `NodeLoader` gives for the same seeds and draws."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch_geometric.transforms as T
from diskflow.operators.prepare.sample import NeighborSampler
from diskflow.operators.prepare.typedsample import TypedNeighborSampler
from diskflow.operators.train.heterobatch import hetero_batch
from torch_geometric.data import Data, HeteroData
from torch_geometric.loader import NodeLoader

from diskflow.errors import ConfigError
from diskflow.pyghetero import HeteroNeighborSampler, hetero_csc


def mag_like(seed: int = 0, papers: int = 300, authors: int = 200, insts: int = 20) -> HeteroData:
    g = np.random.default_rng(seed)
    data = HeteroData()
    data["paper"].x = torch.from_numpy(g.normal(size=(papers, 8)).astype(np.float32))
    data["paper"].y = torch.from_numpy(g.integers(0, 4, papers))
    data["author"].x = torch.from_numpy(g.normal(size=(authors, 5)).astype(np.float32))
    data["institution"].num_nodes = insts
    data["paper", "cites", "paper"].edge_index = torch.from_numpy(g.integers(0, papers, (2, 1500)))
    data["author", "writes", "paper"].edge_index = torch.from_numpy(
        np.stack([g.integers(0, authors, 900), g.integers(0, papers, 900)]))
    data["author", "affiliated_with", "institution"].edge_index = torch.from_numpy(
        np.stack([g.integers(0, authors, 250), g.integers(0, insts, 250)]))
    return T.ToUndirected()(data)


def flat_batch(data: HeteroData, layout, batch) -> Data:
    """The flat `Data` a diskflow loader builds: rows of the padded global table, labels over global ids."""
    width = max(t.dim for t in layout.node_types)
    table = torch.zeros(layout.num_nodes, width)
    labels = torch.full((layout.num_nodes,), -1, dtype=torch.long)
    for t in layout.node_types:
        if t.has_features:
            table[t.offset:t.stop, :t.dim] = data[t.name].x
        if "y" in data[t.name]:
            labels[t.offset:t.stop] = data[t.name].y
    n_id = torch.from_numpy(batch.n_id.astype(np.int64))
    return Data(x=table[n_id], y=labels[n_id], n_id=n_id, edge_index=torch.from_numpy(batch.edge_index),
                e_id=torch.from_numpy(batch.e_id), batch_size=batch.batch_size,
                num_sampled_nodes=batch.num_sampled_nodes, num_sampled_edges=batch.num_sampled_edges)


def test_one_type_equals_the_homogeneous_sampler() -> None:
    g = np.random.default_rng(1)
    n, e = 400, 4000
    src, dst = g.integers(0, n, e), g.integers(0, n, e)
    data = HeteroData()
    data["v"].x = torch.zeros(n, 2)
    data["v", "to", "v"].edge_index = torch.from_numpy(np.stack([src, dst]))
    layout, rel, _ = hetero_csc(data)
    typed = TypedNeighborSampler(layout, rel, [5, 3, 2], target="v", num_threads=2)
    plain = NeighborSampler(rel[0][0], rel[0][1], [5, 3, 2], num_threads=1)
    seeds = g.choice(n, 50, replace=False)
    a, b = typed.sample(seeds, 11), plain.sample(seeds, 11)
    for f in ("n_id", "edge_index", "e_id"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges


def test_typed_sample_draws_real_edges_within_fanouts() -> None:
    data = mag_like()
    layout, rel, _ = hetero_csc(data)
    fan = {("paper", "cites", "paper"): [4, 2], ("author", "writes", "paper"): [3, 3],
           ("paper", "rev_writes", "author"): [2, 2], ("author", "affiliated_with", "institution"): [1, 1],
           ("institution", "rev_affiliated_with", "author"): [5, 5]}
    s = TypedNeighborSampler(layout, rel, fan, num_threads=1)
    seeds = np.arange(0, 64, dtype=np.int64) + layout.node("paper").offset
    b = s.sample(seeds, 3)
    assert np.unique(b.n_id).size == b.n_id.size
    t_of = layout.type_of(b.n_id)
    r_of = layout.edge_type_of(b.e_id)
    for k, et in enumerate(layout.edge_types):
        sel = r_of == k
        indptr, indices = rel[k]
        pos = b.e_id[sel] - et.edge_offset
        src, dst = b.n_id[b.edge_index[0][sel]], b.n_id[b.edge_index[1][sel]]
        assert (t_of[b.edge_index[0][sel]] == layout.node_index(et.src)).all()
        assert (t_of[b.edge_index[1][sel]] == layout.node_index(et.dst)).all()
        s_local = src - layout.node(et.src).offset
        d_local = dst - layout.node(et.dst).offset
        np.testing.assert_array_equal(indices[pos], s_local)
        assert ((pos >= indptr[d_local]) & (pos < indptr[d_local + 1])).all()
        # every destination draws min(degree, fanout) edges of this type at its hop
        ids, counts = np.unique(d_local, return_counts=True)
        deg = indptr[ids + 1] - indptr[ids]
        assert (counts <= np.minimum(deg, max(fan[et.key]))).all()
    assert s.sample(seeds, 3).n_id.tolist() == b.n_id.tolist()
    many = TypedNeighborSampler(layout, rel, fan, num_threads=3).sample(seeds, 3)
    np.testing.assert_array_equal(many.edge_index, b.edge_index)


def test_fanout_dict_naming_an_unknown_edge_type_is_refused() -> None:
    layout, rel, _ = hetero_csc(mag_like())
    with pytest.raises(ConfigError, match="unknown edge type 'paper__writes__author'"):
        TypedNeighborSampler(layout, rel, {("paper", "writes", "author"): [2]})
    with pytest.raises(ConfigError, match="differ in length"):
        TypedNeighborSampler(layout, rel, {("paper", "cites", "paper"): [2], ("author", "writes", "paper"): [2, 2]})


def test_batch_has_pyg_nodeloaders_fields_types_and_shapes() -> None:
    data = mag_like()
    sampler = HeteroNeighborSampler(data, [3, 2], seed=5)
    mirror = HeteroNeighborSampler(data, [3, 2], seed=5)
    seeds = torch.arange(40, 80)
    loader = NodeLoader(data, node_sampler=sampler, input_nodes=("paper", seeds), batch_size=20)
    layout = mirror.layout
    for i, pyg in enumerate(loader):
        flat = mirror.sampler.sample(seeds[i * 20:(i + 1) * 20].numpy() + layout.node("paper").offset,
                                     mirror._next_seed(), target="paper")
        ours = hetero_batch(flat_batch(data, layout, flat), layout, "paper")
        assert set(ours.node_types) == set(pyg.node_types) and set(ours.edge_types) == set(pyg.edge_types)
        for nt in pyg.node_types:
            # diskflow's batches, typed or not, leave out input_id (the seeds' positions in the loader's
            # input) and seed_time (no temporal sampling)
            theirs = set(pyg[nt].to_dict()) - {"input_id", "seed_time"}
            assert set(ours[nt].keys()) == theirs, nt
            for k in theirs:
                a, b = ours[nt][k], pyg[nt][k]
                if isinstance(b, torch.Tensor):
                    assert a.dtype == b.dtype and a.shape == b.shape, (nt, k)
                    assert torch.equal(a, b), (nt, k)
                else:
                    assert a == b, (nt, k)
        for et in pyg.edge_types:
            assert set(ours[et].keys()) == set(pyg[et].keys()), et
            a, b = ours[et].edge_index, pyg[et].edge_index
            assert a.dtype == b.dtype and torch.equal(a, b), et
            # PyG maps e_id to the HeteroData's own columns; a store's edge ids are its CSC positions
            assert torch.equal(mirror.edge_permutation[et][ours[et].e_id], pyg[et].e_id), et
            assert ours[et].num_sampled_edges == pyg[et].num_sampled_edges
