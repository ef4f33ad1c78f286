"""The historical embedding cache in training (`operators.train.history`, the memory loader's planner):
the hook writes pushed rows and substitutes pruned ones on a stock PyG model; staleness 1 trains exactly
as without the cache; a longer staleness gathers fewer rows; checkpoints carry the table; bad options
are refused."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diskflow.flow.pipeline import Pipeline
from diskflow.flow.rundir import new_run_dir
from diskflow.operators.prepare.history import DEFAULT_RAMP
from diskflow.operators.train.history import HistoryCache, history_of
from diskflow.operators.train.loop import forward
from diskflow.pipelines import inmemory
from torch_geometric.data import Data
from torch_geometric.nn.models import GraphSAGE

from diskflow.errors import ConfigError

COMMON = {"fanouts": (4, 3, 3), "batch_size": 200, "epochs": 3, "hidden": 12, "threads": 1, "progress": False,
          "eval_every": 3}


def test_the_hook_pushes_and_substitutes_on_a_stock_model() -> None:
    torch.manual_seed(0)
    model = GraphSAGE(5, 8, 3, 4)
    cache = HistoryCache.attach(model, rows=6)
    assert history_of(model) is cache and cache.table.shape == (6, 8)
    assert "diskflow_history.table" in model.state_dict()
    x = torch.randn(7, 5)
    edge_index = torch.tensor([[1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 2, 3]])
    seen: list[torch.Tensor] = []
    model.convs[1].register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    cache.table[4] = 7.0
    batch = Data(x=x, edge_index=edge_index, batch_size=1, hist_prune=torch.tensor([2]),
                 hist_prune_slot=torch.tensor([4]), hist_push=torch.tensor([1]), hist_push_slot=torch.tensor([0]))
    model.train()
    forward(model, batch)
    assert torch.all(seen[-1][2] == 7.0)                   # the pruned row is the cached one
    assert torch.equal(cache.table[0], seen[-1][1].half())  # the pushed row went into slot 0, as float16
    assert cache.pruned == 1 and cache.pushed == 1
    model.eval()
    before = cache.table.clone()
    forward(model, batch)                                  # evaluation: no substitution, nothing pushed
    assert not torch.all(seen[-1][2] == 7.0) and torch.equal(cache.table, before)
    with pytest.raises(ConfigError, match="two or more layers"):
        HistoryCache.attach(GraphSAGE(5, 8, 1, 4), 3)
    with torch.no_grad():
        model.convs[1].lin_l.bias.fill_(1e6)               # activations past float16's range
    model.train()
    with pytest.raises(ConfigError, match="^history_memory.*float16"):
        forward(model, batch)


def test_a_pruned_row_takes_the_cached_value_and_passes_the_gradient_on() -> None:
    """Straight-through: the value the last layer reads for a pruned node is its cached row, and the seed's
    loss still reaches what lies below it: node 7's features reach seed 0 only through pruned node 2's
    layer output (7 -> 5 -> 2 -> 0, three layers)."""
    torch.manual_seed(0)
    model = GraphSAGE(5, 8, 3, 4)
    cache = HistoryCache.attach(model, rows=6, dtype=torch.float32)
    cache.table[4] = 0.5
    x = torch.randn(8, 5, requires_grad=True)
    edge_index = torch.tensor([[1, 2, 3, 4, 5, 6, 7], [0, 0, 1, 1, 2, 3, 5]])
    seen: list[torch.Tensor] = []
    model.convs[1].register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    none = torch.tensor([], dtype=torch.long)
    batch = Data(x=x, edge_index=edge_index, batch_size=1, hist_prune=torch.tensor([2]),
                 hist_prune_slot=torch.tensor([4]), hist_push=none, hist_push_slot=none)
    model.train()
    forward(model, batch).sum().backward()
    assert torch.all(seen[-1][2] == 0.5)                   # the value: the cached row, exactly
    assert x.grad is not None
    assert float(x.grad[7].abs().sum()) > 0                # the gradient: through node 2's own computation


@pytest.mark.parametrize("fanouts", [(5, 4), (5, 4, 3), (4, 3, 3, 2)])
def test_a_fresh_cache_gives_the_unpruned_logits_under_the_last_hop_rule(tiny_store: Path, fanouts) -> None:
    """Push every one-hop node's input to the last layer, then prune half of them and substitute: with the
    model unchanged in between, a GraphSAGE of any depth gives the unpruned batch's seed logits under the
    last-hop rule (the pruned nodes' lower layers are still computed), and under the thin rule, whose extra
    neighbours feed only the pruned nodes' own (replaced) rows. Under OUTRE's subtree rule that holds
    for two layers only: deeper, the seeds' lower layers see the pruned nodes' features alone."""
    import numpy as np
    from diskflow.operators.formats.store import Store
    from diskflow.operators.prepare.history import HistoryStep, attach_plan, sample_planned
    from diskflow.operators.prepare.sample import NeighborSampler
    from diskflow.operators.train.batches import to_data

    st = Store(tiny_store)
    x, y = torch.from_numpy(st.read_features()), torch.from_numpy(np.asarray(st.labels, dtype=np.int64))
    sampler = NeighborSampler(st.indptr, st.indices, list(fanouts), num_threads=1)
    seeds = st.split_ids("train")[:64]
    full = sampler.sample(seeds, 9)
    hop1 = np.asarray(full.n_id[64:64 + full.num_sampled_nodes[1]], dtype=np.int64)
    slots = np.arange(hop1.shape[0], dtype=np.int64)
    none = np.zeros(0, dtype=np.int64)
    attach_plan(full, HistoryStep(none, none, hop1, slots))
    pruned_slots = slots[::2]                              # every other one-hop node, by its slot
    pruned = hop1[pruned_slots]
    torch.manual_seed(0)
    model = GraphSAGE(st.feature_dim, 16, len(fanouts), 5, dropout=0.0)
    HistoryCache.attach(model, rows=hop1.shape[0], dtype=torch.float32)     # exact rows: exact logits
    model.train()
    with torch.no_grad():
        want = forward(model, to_data(full, x, y))
        got = {}
        for rule, last_hop, thin in (("thin", True, 1), ("last-hop", True, 0), ("subtree", False, 0)):
            step = HistoryStep(pruned, pruned_slots, none, none, last_hop, thin)
            cut = sample_planned(sampler, seeds, 9, step)
            assert cut.n_id.shape[0] < full.n_id.shape[0]
            got[rule] = (forward(model, to_data(cut, x, y)), cut.n_id.shape[0])
    torch.testing.assert_close(got["last-hop"][0], want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got["thin"][0], want, rtol=1e-5, atol=1e-6)   # the same forward pass
    assert got["last-hop"][1] < got["thin"][1]                               # with a neighbour each below
    if len(fanouts) == 2:      # the same sample: nothing below the pruned nodes but their own last hop
        torch.testing.assert_close(got["subtree"][0], want, rtol=1e-5, atol=1e-6)
        assert got["subtree"][1] == got["last-hop"][1]
    else:                      # fewer nodes, and the approximation
        assert got["subtree"][1] < got["last-hop"][1]
        assert not torch.allclose(got["subtree"][0], want, rtol=1e-3, atol=1e-4)
    assert history_of(model).pruned == 3 * pruned.shape[0]
    # the default table, float16: the same logits but for its rounding
    torch.manual_seed(0)
    half = GraphSAGE(st.feature_dim, 16, len(fanouts), 5, dropout=0.0)
    assert HistoryCache.attach(half, rows=hop1.shape[0]).table.dtype == torch.float16
    half.train()
    with torch.no_grad():
        forward(half, to_data(full, x, y))
        cut = sampler.sample(seeds, 9, stop=pruned, last_hop=True)
        attach_plan(cut, HistoryStep(pruned, pruned_slots, none, none))
        torch.testing.assert_close(forward(half, to_data(cut, x, y)), want, rtol=1e-2, atol=1e-2)


def test_models_the_cache_cannot_serve_are_refused() -> None:
    from diskflow.operators.train.config import TrainConfig
    from torch_geometric.nn.models import GCN

    with pytest.raises(ConfigError, match="^model"):
        TrainConfig(model="gcn", history_rows=8)
    with pytest.raises(ConfigError, match="^num_layers"):
        TrainConfig(model="sage", fanouts=(3, 3, 3), num_layers=2, history_rows=8)
    TrainConfig(model="none", history_rows=8)              # nothing trained: nothing to refuse
    with pytest.raises(ConfigError, match="GCN"):
        HistoryCache.attach(GCN(5, 8, 3, 4), 4)


def test_staleness_one_trains_exactly_as_without_the_cache(tiny_store: Path, tmp_path: Path, one_torch_thread) -> None:
    plain = inmemory.run(tiny_store, new_run_dir(tmp_path, "plain"), **COMMON)
    s1 = inmemory.run(tiny_store, new_run_dir(tmp_path, "s1"), history_memory="64KiB", history_staleness=1, **COMMON)
    assert [e["losses"] for e in s1["epochs"]] == [e["losses"] for e in plain["epochs"]]
    assert s1["history"]["pruned"] == 0 and s1["history"]["pushed"] > 0
    assert [e["rows_gathered"] for e in s1["epochs"]] == [e["rows_gathered"] for e in plain["epochs"]]
    s20 = inmemory.run(tiny_store, new_run_dir(tmp_path, "s20"), history_memory="64KiB", history_staleness=20,
                       **COMMON)
    assert s20["history"]["pruned"] > 0 and s20["history"]["rows"] == 64 * 1024 // (12 * 2)
    assert sum(e["rows_gathered"] for e in s20["epochs"]) < sum(e["rows_gathered"] for e in plain["epochs"])
    assert [e["losses"] for e in s20["epochs"]] != [e["losses"] for e in plain["epochs"]]
    again = inmemory.run(tiny_store, new_run_dir(tmp_path, "again"), history_memory="64KiB", history_staleness=20,
                         **COMMON)
    assert [e["losses"] for e in again["epochs"]] == [e["losses"] for e in s20["epochs"]]   # repeatable


def test_a_pipeline_declares_the_cache(tiny_store: Path, tmp_path: Path, one_torch_thread) -> None:
    mine = Pipeline("hist", loader="memory", history_memory="64KiB", history_staleness=20)
    r = mine.run(tiny_store, new_run_dir(tmp_path, "p"), **COMMON)
    assert r["history"]["staleness"] == 20 and r["history"]["pruned"] > 0
    assert r["history"].get("ramp", 0.0) == DEFAULT_RAMP        # the bound the plan used (0: fixed, not named)
    assert mine.describe()["history_memory"] == "64KiB"
    assert Pipeline("h2", loader="stream", history_memory="1MiB").history_memory == "1MiB"   # streamed too
    with pytest.raises(ConfigError, match="Pipeline.history_memory"):
        Pipeline("h4", loader="stream", history_memory="auto")       # the split plans whole rounds
    with pytest.raises(ConfigError, match="Pipeline.history_staleness"):
        Pipeline("h3", loader="memory", history_memory="1MiB", history_staleness=0)
    with pytest.raises(ConfigError, match="Pipeline.history_prune"):
        Pipeline("h5", loader="memory", history_memory="1MiB", history_prune="all")
    assert mine.describe()["history_prune"] == "thin" and "history_cooldown" not in mine.describe()
    ended = Pipeline("hc", loader="memory", history_memory="64KiB", history_staleness=20, history_cooldown=0.5)
    assert ended.describe()["history_cooldown"] == 0.5
    exact = ended.run(tiny_store, new_run_dir(tmp_path, "hc"), **COMMON)
    assert exact["history"]["cooldown"] == 0.5 and 0 < exact["history"]["pruned"] < r["history"]["pruned"]
    assert ended.run(tiny_store, new_run_dir(tmp_path, "hc0"), history_cooldown=0.0, **COMMON)["history"] == \
        {**r["history"]}                                        # an option overrides the pipeline's own
    for field, bad in (("history_ramp", -0.5), ("history_cooldown", 2), ("history_cooldown", None)):
        with pytest.raises(ConfigError, match=f"^Pipeline.{field}: expected"):
            Pipeline("h7", loader="memory", history_memory="1MiB", **{field: bad})
    outre = Pipeline("h6", loader="memory", history_memory="64KiB", history_staleness=20, history_prune="subtree")
    sub = outre.run(tiny_store, new_run_dir(tmp_path, "sub"), **COMMON)
    assert sub["history"]["prune"] == "subtree" and sub["history"]["pruned"] == r["history"]["pruned"]
    assert sum(e["rows_gathered"] for e in sub["epochs"]) < sum(e["rows_gathered"] for e in r["epochs"])
    with pytest.raises(ConfigError, match="^history_memory"):
        inmemory.run(tiny_store, new_run_dir(tmp_path, "x"), history_memory="8B", **COMMON)
    with pytest.raises(ConfigError, match="two or more"):
        inmemory.run(tiny_store, new_run_dir(tmp_path, "y"), history_memory="64KiB",
                     **{**COMMON, "fanouts": (4,)})
    for option, given in (("history_staleness", {"history_staleness": 7}),
                          ("history_prune", {"history_prune": "subtree"}), ("history_ramp", {"history_ramp": 0.5}),
                          ("history_cooldown", {"history_cooldown": 0.2})):    # no cache for them to change
        with pytest.raises(ConfigError, match=option):
            inmemory.run(tiny_store, new_run_dir(tmp_path, "z"), **given, **COMMON)


def test_run_prints_the_staleness_and_the_share_served_from_history(capsys: pytest.CaptureFixture[str]) -> None:
    from diskflow.cli.run import _print_summary

    _print_summary({"history": {"rows": 96, "bytes": 2304, "staleness": 100, "ramp": 0.5, "prune": "last-hop",
                                "pruned": 30, "pushed": 10}})
    out = capsys.readouterr().out
    assert "staleness 100 at most, 0.5 x the model's age in batches when computed, last-hop rule" in out
    assert "75.0% of the cached nodes' embeddings in training batches were served from history" in out
