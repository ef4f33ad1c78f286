"""The historical embedding cache's planning (`operators.prepare.history`) and the sampler's `stop` set it
prunes with: fresh embeddings prune, stale ones are pushed, staleness 1 never prunes, pruned nodes keep
their place but draw no neighbours while every other draw is unchanged, and the edges such a sample
reports (e_id, their CSC positions) are the unpruned sample's edges it keeps."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from diskflow.operators.formats.store import Store
from diskflow.operators.prepare.history import (
    HistoryPlanner,
    history_nodes,
    history_rows,
    local_positions,
)
from diskflow.operators.prepare.sample import NeighborSampler

from diskflow.errors import ConfigError


def test_planner_prunes_fresh_pushes_stale() -> None:
    p = HistoryPlanner(np.array([2, 5, 9, 11]), staleness=3)            # the fixed bound (OUTRE's), the default
    s0 = p.step(np.array([5, 7, 9]))                       # first sight: computed and pushed
    assert s0.pruned.tolist() == [] and s0.pushed.tolist() == [5, 9] and s0.pushed_slots.tolist() == [1, 2]
    s1 = p.step(np.array([9, 2]))                          # 9 computed at batch 0: fresh at 1 and 2
    assert s1.pruned.tolist() == [9] and s1.pruned_slots.tolist() == [2] and s1.pushed.tolist() == [2]
    s2 = p.step(np.array([5, 9, 2, 100]))
    assert s2.pruned.tolist() == [5, 9, 2] and s2.pushed.tolist() == []
    s3 = p.step(np.array([5, 2]))                          # 5 is 3 batches old now: stale; 2 still fresh
    assert s3.pushed.tolist() == [5] and s3.pruned.tolist() == [2]
    one = HistoryPlanner(np.array([1, 2]), staleness=1)
    for _ in range(3):
        st = one.step(np.array([1, 2]))
        assert st.pruned.size == 0 and st.pushed.tolist() == [1, 2]   # staleness 1: never reused


def test_adaptive_bound_expires_early_embeddings_first() -> None:
    def pushes(**kw: float) -> list[int]:
        p = HistoryPlanner(np.array([1]), staleness=100, **kw)
        return [i for i in range(98) if p.step(np.array([1])).pushed.size]

    assert pushes(ramp=0) == [0]                         # the fixed bound: the first embedding serves the round
    # an embedding computed at batch t serves at most max(1, t/2) batches, at most the staleness
    assert pushes(ramp=0.5) == [0, 1, 2, 3, 4, 6, 9, 13, 19, 28, 42, 63, 94]
    p = HistoryPlanner(np.array([1]), staleness=4, ramp=1.0)
    assert [bool(p.step(np.array([1])).pushed.size) for _ in range(12)] == \
        [True, True, True, False, True, False, False, False, True, False, False, False]   # then every 4th
    for bad in (-1, float("inf"), float("nan"), True, "0.5"):
        with pytest.raises(ConfigError, match="^history_ramp"):
            HistoryPlanner(np.array([1]), 10, ramp=bad)  # type: ignore[arg-type]


def test_cooldown_ends_the_round_exact() -> None:
    p = HistoryPlanner(np.array([1, 2]), staleness=100, ramp=0, total=10, cooldown=0.25)   # the last ceil(2.5) = 3
    steps = [p.step(np.array([1, 2])) for _ in range(10)]
    assert [s.pruned.size for s in steps] == [0, 2, 2, 2, 2, 2, 2, 0, 0, 0]
    assert all(s.pushed.tolist() == [1, 2] for s in steps[7:])
    without = HistoryPlanner(np.array([1]), staleness=100, ramp=0, cooldown=0.25)           # no total: no cool-down
    assert sum(without.step(np.array([1])).pruned.size for _ in range(10)) == 9
    for bad in (2, -0.1, float("nan"), None):
        with pytest.raises(ConfigError, match="^history_cooldown"):
            HistoryPlanner(np.array([1]), 10, total=5, cooldown=bad)  # type: ignore[arg-type]


def test_nodes_rows_and_positions() -> None:
    indptr = np.array([0, 1, 5, 5, 8, 12])                 # in-degrees 1, 4, 0, 3, 4
    assert history_nodes(indptr, 2).tolist() == [1, 4]     # the two highest, ties by lower id
    assert history_nodes(indptr, 0).size == 0 and history_nodes(indptr, 99).tolist() == [0, 1, 2, 3, 4]
    assert history_rows(4096, 16) == 128                    # float16 embeddings
    with pytest.raises(ConfigError, match="^history_staleness"):
        HistoryPlanner(np.array([1]), 0)
    n_id = np.array([10, 11, 7, 3, 8, 1])
    assert local_positions(n_id, 2, 5, np.array([8, 7])).tolist() == [4, 2]
    with pytest.raises(ValueError, match="not among"):
        local_positions(n_id, 2, 5, np.array([1]))


def _check_e_id(st: Store, sample) -> None:
    """e_id is each edge's position in the store's CSC `indices`: the source is read there, and the position
    lies in the target's in-edge range."""
    indptr, indices = np.asarray(st.indptr), np.asarray(st.indices)
    src, dst = sample.n_id[sample.edge_index[0]], sample.n_id[sample.edge_index[1]]
    assert sample.e_id.dtype == np.int64 and sample.e_id.shape == src.shape
    np.testing.assert_array_equal(indices[sample.e_id], src)
    assert ((sample.e_id >= indptr[dst]) & (sample.e_id < indptr[dst + 1])).all()


def test_stop_prunes_subtrees_and_changes_no_other_draw(tiny_store: Path) -> None:
    st = Store(tiny_store)
    s = NeighborSampler(st.indptr, st.indices, [4, 3, 2], num_threads=2)
    seeds = st.split_ids("train")[:150]
    full = s.sample(seeds, 77)
    bs, n1 = full.num_sampled_nodes[0], full.num_sampled_nodes[1]
    hop1 = full.n_id[bs:bs + n1]
    stop = hop1[::4]
    cut = s.sample(seeds, 77, stop=stop)
    np.testing.assert_array_equal(cut.n_id[:bs + n1], full.n_id[:bs + n1])   # seeds and hop 1 unchanged
    assert cut.n_id.shape[0] < full.n_id.shape[0]
    stopped = local_positions(cut.n_id, bs, bs + n1, stop)
    assert not np.isin(cut.edge_index[1], stopped).any()                         # no neighbours drawn for them
    # every other node's draws are the full sample's: same (source, target) pairs in global ids
    g_full = {(int(full.n_id[a]), int(full.n_id[b])) for a, b in full.edge_index.T}
    g_cut = {(int(cut.n_id[a]), int(cut.n_id[b])) for a, b in cut.edge_index.T}
    assert g_cut < g_full
    expanded = set(hop1.tolist()) - set(stop.tolist())     # the hop-1 nodes not stopped draw what they drew
    assert {e for e in g_full if e[1] in expanded} <= g_cut
    _check_e_id(st, full)
    _check_e_id(st, cut)
    assert set(cut.e_id.tolist()) < set(full.e_id.tolist())                    # the same edges, fewer
    np.testing.assert_array_equal(s.sample(seeds, 77, stop=np.zeros(0, np.int64)).n_id, full.n_id)
    np.testing.assert_array_equal(s.sample(seeds, 77).n_id, full.n_id)          # marks cleared after a call
    with pytest.raises(ValueError, match="out of range"):
        s.sample(seeds, 77, stop=np.array([st.num_nodes]))
    np.testing.assert_array_equal(s.sample(seeds, 77).n_id, full.n_id)          # and after a failed one


def _tainted(sample, stop: np.ndarray) -> np.ndarray:
    """Per local id: a stop node, or a node every finder of which (the nodes that drew it when it joined) is one."""
    hops = np.cumsum([0, *sample.num_sampled_nodes])
    edges = np.cumsum([0, *sample.num_sampled_edges])
    n_id = np.asarray(sample.n_id)
    bad = np.isin(n_id, stop)
    bad[:hops[1]] = False                                   # the seeds
    for h in range(1, len(hops) - 1):
        child, finder = sample.edge_index[:, edges[h - 1]:edges[h]]
        new = (child >= hops[h]) & (child < hops[h + 1])
        clean = np.zeros(n_id.shape[0], bool)
        clean[child[new & ~bad[finder]]] = True             # drawn by at least one clean finder
        joined = np.arange(hops[h], hops[h + 1])
        bad[joined] |= ~clean[joined]
    return bad


def _stopped(tiny_store: Path, fanouts):
    """A sampler over the tiny store, 150 training seeds, their unpruned sample, and every third one-hop node
    of it to stop."""
    st = Store(tiny_store)
    s = NeighborSampler(st.indptr, st.indices, fanouts, num_threads=2)
    seeds = st.split_ids("train")[:150]
    full = s.sample(seeds, 77)
    bs, n1 = full.num_sampled_nodes[0], full.num_sampled_nodes[1]
    return st, s, seeds, full, full.n_id[bs:bs + n1][::3]


@pytest.mark.parametrize("fanouts", [[4, 3], [4, 3, 2], [3, 3, 2, 2]])
def test_last_hop_stop_keeps_every_hop_but_the_last_below_stopped_nodes(tiny_store: Path, fanouts) -> None:
    st, s, seeds, full, stop = _stopped(tiny_store, fanouts)
    cut = s.sample(seeds, 77, stop=stop, last_hop=True)
    last = len(fanouts)
    before_last = sum(full.num_sampled_nodes[:last])
    # every hop but the last is the full sample's, node for node and edge for edge
    np.testing.assert_array_equal(cut.n_id[:before_last], full.n_id[:before_last])
    np.testing.assert_array_equal(cut.num_sampled_edges[:-1], full.num_sampled_edges[:-1])
    kept = sum(full.num_sampled_edges[:-1])
    np.testing.assert_array_equal(cut.edge_index[:, :kept], full.edge_index[:, :kept])
    np.testing.assert_array_equal(cut.e_id[:kept], full.e_id[:kept])
    _check_e_id(st, cut)
    # at the last hop, exactly the stopped nodes and the nodes only they drew draw nothing; the others
    # draw what they drew
    skip = np.flatnonzero(_tainted(full, stop)[:before_last])
    g_full = {(int(full.n_id[a]), int(full.n_id[b])) for a, b in full.edge_index[:, kept:].T}
    g_cut = {(int(cut.n_id[a]), int(cut.n_id[b])) for a, b in cut.edge_index[:, kept:].T}
    dropped = set(full.n_id[skip].tolist())
    assert g_cut == {e for e in g_full if e[1] not in dropped}
    kept_last = ~np.isin(full.n_id[full.edge_index[1, kept:]], list(dropped))
    np.testing.assert_array_equal(cut.e_id[kept:], full.e_id[kept:][kept_last])  # the same edges, in order
    if last == 2:                       # two hops: the subtree rule's sample
        sub = s.sample(seeds, 77, stop=stop)
        np.testing.assert_array_equal(cut.n_id, sub.n_id)
        np.testing.assert_array_equal(cut.edge_index, sub.edge_index)
    else:
        assert skip.shape[0] > stop.shape[0]            # some nodes were reached through stopped ones only
    np.testing.assert_array_equal(s.sample(seeds, 77).n_id, full.n_id)          # nothing left marked


@pytest.mark.parametrize("fanouts", [[4, 3], [4, 3, 2], [3, 3, 2, 2]])
def test_thin_draws_neighbours_for_the_nodes_the_last_hop_rule_leaves_bare(tiny_store: Path, fanouts) -> None:
    st, s, seeds, full, stop = _stopped(tiny_store, fanouts)
    bare = s.sample(seeds, 77, stop=stop, last_hop=True)
    thin = s.sample(seeds, 77, stop=stop, last_hop=True, thin=1)
    last = len(fanouts)
    before_last = sum(full.num_sampled_nodes[:last])
    kept = sum(full.num_sampled_edges[:-1])
    np.testing.assert_array_equal(thin.n_id[:before_last], full.n_id[:before_last])     # the hops above
    np.testing.assert_array_equal(thin.edge_index[:, :kept], full.edge_index[:, :kept])
    np.testing.assert_array_equal(thin.e_id[:kept], full.e_id[:kept])
    _check_e_id(st, thin)
    # at the last hop: the nodes the last-hop rule leaves bare draw one graph neighbour each (none where
    # they have none); every other node draws what it draws under the last-hop rule
    frontier = np.arange(sum(full.num_sampled_nodes[:last - 1]), before_last)     # the last hop's
    skip = np.zeros(before_last, bool)
    skip[frontier] = _tainted(full, stop)[frontier]
    child, finder = thin.edge_index[:, kept:]
    per_node = np.bincount(finder, minlength=before_last)
    degree = np.diff(st.indptr)[full.n_id[:before_last]]
    np.testing.assert_array_equal(per_node[skip], np.minimum(degree[skip], 1))
    assert per_node[skip].sum() > 0
    g_thin = {(int(thin.n_id[a]), int(thin.n_id[b])) for a, b in zip(child, finder)}
    g_bare = {(int(bare.n_id[a]), int(bare.n_id[b])) for a, b in bare.edge_index[:, kept:].T}
    bare_nodes = set(full.n_id[np.flatnonzero(skip)].tolist())
    assert {e for e in g_thin if e[1] not in bare_nodes} == g_bare
    indptr, indices = np.asarray(st.indptr), np.asarray(st.indices)
    for u, v in ((u, v) for u, v in g_thin if v in bare_nodes):
        assert u in indices[indptr[v]:indptr[v + 1]]                            # a real in-neighbour
    assert bare.n_id.shape[0] < thin.n_id.shape[0] <= full.n_id.shape[0]
    # thin=0 is the last-hop rule; as many as the fanout is the unpruned sample
    np.testing.assert_array_equal(s.sample(seeds, 77, stop=stop, last_hop=True, thin=0).n_id, bare.n_id)
    wide = s.sample(seeds, 77, stop=stop, last_hop=True, thin=fanouts[-1])
    np.testing.assert_array_equal(wide.n_id, full.n_id)
    np.testing.assert_array_equal(wide.edge_index, full.edge_index)
    np.testing.assert_array_equal(wide.e_id, full.e_id)
    with pytest.raises(ValueError, match="thin"):
        s.sample(seeds, 77, stop=stop, last_hop=True, thin=-1)
