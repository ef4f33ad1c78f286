"""`prepare` with a historical embedding cache planned offline: the round's samples are pruned where a
fresh embedding stands in and carry the plan; the pruned packed dataset replays bit-exact; staleness 1
samples exactly the round without the cache; training from it gives the in-memory pipeline's online
plan's losses, bit for bit."""
from __future__ import annotations

from pathlib import Path

import dask
import numpy as np
import pytest
from diskflow.flow.prepare import PrepareConfig, prepare
from diskflow.flow.rundir import new_run_dir
from diskflow.operators.formats.packed import PackedDataset
from diskflow.operators.formats.store import Store
from diskflow.operators.formats.verify import verify
from diskflow.operators.prepare.history import EMBEDDING_BYTES

from diskflow.errors import ConfigError

BASE = {"fanouts": (4, 3, 3), "batch_size": 200, "superbatch_size": 4, "epochs": 3, "seed": 5}
HIDDEN = 12
MEMORY = 96 * HIDDEN * EMBEDDING_BYTES      # 96 cached embeddings


pytestmark = pytest.mark.usefixtures("sync_dask")


@pytest.fixture(scope="module")
def rounds(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("history")
    with dask.config.set(scheduler="sync"):
        out = {}
        for name, extra in (("plain", {}),
                            ("s1", {"history_memory": MEMORY, "history_staleness": 1, "history_select": "degree"}),
                            ("s20", {"history_memory": MEMORY, "history_staleness": 20, "history_select": "degree"}),
                            ("s20a", {"history_memory": MEMORY, "history_staleness": 20}),
                            ("s20sub", {"history_memory": MEMORY, "history_staleness": 20, "history_select": "degree",
                                        "history_prune": "subtree"}),
                            ("s20bare", {"history_memory": MEMORY, "history_staleness": 20, "history_select": "degree",
                                         "history_prune": "last-hop"}),
                            ("s20rc", {"history_memory": MEMORY, "history_staleness": 20, "history_select": "degree",
                                       "history_ramp": 0.25, "history_cooldown": 0.5})):
            cfg = PrepareConfig(**BASE, cpu_memory=4 << 20, history_dim=HIDDEN, **extra)
            out[name] = prepare(tiny_store, root / name, cfg, quiet=True)
    return out


def _samples(path: Path) -> list:
    with PackedDataset(path) as ds:
        return [s for sb in ds.superbatches for s in ds.samples(sb.key)]


@pytest.mark.parametrize("name", ["s20", "s20sub", "s20bare"])
def test_pruned_round_replays_exactly_and_carries_its_plan(rounds, tiny_store: Path, name: str) -> None:
    r = rounds[name]
    h = r.figures["history"]
    rule = {"s20": "thin", "s20sub": "subtree", "s20bare": "last-hop"}[name]
    assert h == {**h, "rows": 96, "dim": HIDDEN, "staleness": 20, "bytes": MEMORY, "prune": rule}
    assert h["pruned"] > 0 and h["pushed"] > 0
    assert r.figures["accesses"] < rounds["plain"].figures["accesses"]     # pruned subtrees are not read
    v = verify(r.path, full=True)
    assert v["compared_batches"] == v["batches"] and v["compared_rows"] == r.figures["accesses"]
    features = Store(tiny_store).read_features()
    with PackedDataset(r.path) as ds:
        for (_, feats), s in zip(ds.replay(), (s for sb in ds.superbatches for s in ds.samples(sb.key))):
            assert feats.tobytes() == features[np.asarray(s.n_id, dtype=np.int64)].tobytes()
    pruned = pushed = drawn = 0
    for s in _samples(r.path):
        prune, prune_slot, push, push_slot = s.history
        bs, n1 = s.num_sampled_nodes[0], s.num_sampled_nodes[1]
        assert np.all((prune >= bs) & (prune < bs + n1)) and np.all((push >= bs) & (push < bs + n1))
        drawn += int(np.isin(s.edge_index[1], prune).sum())     # neighbours drawn for pruned nodes
        assert np.all(prune_slot < 96) and np.all(push_slot < 96)
        pruned, pushed = pruned + prune.shape[0], pushed + push.shape[0]
    assert (pruned, pushed) == (h["pruned"], h["pushed"])
    # the subtree rule draws nothing below a pruned node; the last-hop rules all but its subtree's last hop
    assert (drawn == 0) == (rule == "subtree")


def test_the_last_hop_rules_read_between_the_subtree_rule_and_no_cache(rounds) -> None:
    plain, thin, last_hop, subtree = (rounds[n].figures for n in ("plain", "s20", "s20bare", "s20sub"))
    assert thin["history"]["pruned"] == last_hop["history"]["pruned"] == subtree["history"]["pruned"]  # one plan
    assert subtree["accesses"] < last_hop["accesses"] < thin["accesses"] < plain["accesses"]


def test_the_round_s_most_frequent_one_hop_nodes_prune_more_than_degree(rounds, tiny_store: Path) -> None:
    from diskflow.operators.prepare.history import history_nodes_by_count

    by_count, by_degree = rounds["s20a"], rounds["s20"]
    assert by_count.figures["history"]["select"] == "accesses" and by_degree.figures["history"]["select"] == "degree"
    assert by_count.figures["history"]["pruned"] > by_degree.figures["history"]["pruned"]
    assert by_count.figures["accesses"] < by_degree.figures["accesses"]
    v = verify(by_count.path, full=True)                                   # and it replays exactly
    assert v["compared_batches"] == v["batches"] and v["compared_rows"] == by_count.figures["accesses"]
    # the choice: most batches first, ties by lower id
    hop1 = [[np.array([5, 3, 9]), np.array([3, 9])], [np.array([9, 7])]]
    assert history_nodes_by_count(hop1, 10, 2).tolist() == [3, 9]
    assert history_nodes_by_count(hop1, 10, 3).tolist() == [3, 5, 9]
    assert history_nodes_by_count(hop1, 10, 0).size == 0 and history_nodes_by_count([], 10, 4).size == 0


def test_the_ramp_and_the_cool_down_buy_fresher_embeddings_with_bytes(rounds, tiny_store: Path,
                                                                      tmp_path: Path, one_torch_thread) -> None:
    """history_ramp and history_cooldown reach the plan: early embeddings expire sooner, the round's last half
    prunes nothing, more rows are read than with the fixed bound, and the options key the cached stages and
    are named in the figures; the memory loader's online plan with the same options trains alike."""
    from diskflow.operators.train.trainer import train_packed
    from diskflow.pipelines import inmemory

    fixed, rc = rounds["s20"].figures, rounds["s20rc"].figures
    assert rc["history"]["ramp"] == 0.25 and rc["history"]["cooldown"] == 0.5
    assert "ramp" not in fixed["history"] and "cooldown" not in fixed["history"]
    assert 0 < rc["history"]["pruned"] < fixed["history"]["pruned"]
    assert fixed["accesses"] < rc["accesses"] < rounds["plain"].figures["accesses"]
    samples = _samples(rounds["s20rc"].path)
    half = len(samples) - len(samples) // 2
    assert all(s.history[0].shape[0] == 0 for s in samples[half:])        # the round ends exact
    assert any(s.history[0].shape[0] for s in samples[:half])
    model = {"model": "sage", "hidden": HIDDEN, "seed": BASE["seed"], "eval_every": 3}
    packed = train_packed(rounds["s20rc"].path, new_run_dir(tmp_path, "p"), threads=1, **model)
    online = inmemory.run(tiny_store, new_run_dir(tmp_path, "m"), fanouts=BASE["fanouts"],
                          batch_size=BASE["batch_size"], epochs=BASE["epochs"], threads=1, progress=False,
                          history_memory=MEMORY, history_staleness=20, history_select="degree",
                          history_ramp=0.25, history_cooldown=0.5, **model)
    assert [e["losses"] for e in packed["epochs"]] == [e["losses"] for e in online["epochs"]]
    assert online["history"]["ramp"] == 0.25 and online["history"]["cooldown"] == 0.5
    assert packed["history"]["pruned"] == online["history"]["pruned"] == rc["history"]["pruned"]


def test_staleness_one_samples_the_round_without_the_cache(rounds) -> None:
    plain, s1 = _samples(rounds["plain"].path), _samples(rounds["s1"].path)
    assert len(plain) == len(s1)
    for a, b in zip(plain, s1):
        np.testing.assert_array_equal(a.n_id, b.n_id)
        np.testing.assert_array_equal(a.edge_index, b.edge_index)
        assert a.history is None and b.history[0].shape[0] == 0            # nothing pruned, only pushes
    assert rounds["s1"].figures["history"]["pruned"] == 0


def test_training_the_planned_round_equals_the_online_plan(rounds, tiny_store: Path, tmp_path: Path,
                                                           one_torch_thread) -> None:
    from diskflow.operators.train.trainer import train_packed
    from diskflow.pipelines import inmemory

    model = {"model": "sage", "hidden": HIDDEN, "seed": BASE["seed"], "eval_every": 3}
    common = {"fanouts": BASE["fanouts"], "batch_size": BASE["batch_size"], "epochs": BASE["epochs"], "threads": 1,
              "progress": False, "history_memory": MEMORY, "history_staleness": 20, **model}
    packed = train_packed(rounds["s20"].path, new_run_dir(tmp_path, "p"), threads=1, **model)
    online = inmemory.run(tiny_store, new_run_dir(tmp_path, "m"), **{**common, "history_select": "degree"})
    assert [e["losses"] for e in packed["epochs"]] == [e["losses"] for e in online["epochs"]]
    assert packed["history"]["pruned"] == online["history"]["pruned"]
    # OUTRE's subtree rule, planned offline and online alike: the same losses, not the last-hop rule's
    packed_sub = train_packed(rounds["s20sub"].path, new_run_dir(tmp_path, "ps"), threads=1, **model)
    online_sub = inmemory.run(tiny_store, new_run_dir(tmp_path, "ms"),
                              **{**common, "history_select": "degree", "history_prune": "subtree"})
    assert [e["losses"] for e in packed_sub["epochs"]] == [e["losses"] for e in online_sub["epochs"]]
    assert [e["losses"] for e in packed_sub["epochs"]] != [e["losses"] for e in packed["epochs"]]
    assert online_sub["history"]["prune"] == "subtree" and online["history"]["prune"] == "thin"
    # by default both choose the round's most frequent one-hop nodes (the online run draws them first)
    packed_a = train_packed(rounds["s20a"].path, new_run_dir(tmp_path, "pa"), threads=1, **model)
    online_a = inmemory.run(tiny_store, new_run_dir(tmp_path, "ma"), **common)
    assert [e["losses"] for e in packed_a["epochs"]] == [e["losses"] for e in online_a["epochs"]]
    assert packed_a["history"]["pruned"] == online_a["history"]["pruned"] > packed["history"]["pruned"]
    with pytest.raises(ConfigError, match="hidden=12"):
        train_packed(rounds["s20"].path, new_run_dir(tmp_path, "q"), threads=1, hidden=16)
    data_only = train_packed(rounds["s20"].path, new_run_dir(tmp_path, "d"), threads=1, model="none")
    assert len(data_only["epochs"]) == BASE["epochs"]                     # no model: no width to match
    # the in-memory pipeline on the planned round's stored samples builds the same table
    stored = inmemory.run(tiny_store, new_run_dir(tmp_path, "s"), fanouts=BASE["fanouts"],
                          batch_size=BASE["batch_size"], epochs=BASE["epochs"], threads=1, progress=False,
                          samples=rounds["s20"].path, **model)
    assert [e["losses"] for e in stored["epochs"]] == [e["losses"] for e in packed["epochs"]]
    assert stored["history"]["rows"] == 96
    with pytest.raises(ConfigError, match="fix the history cache"):
        inmemory.run(tiny_store, new_run_dir(tmp_path, "t"), fanouts=BASE["fanouts"], batch_size=BASE["batch_size"],
                     epochs=BASE["epochs"], progress=False, samples=rounds["s20"].path, history_memory=MEMORY, **model)


def test_the_outre_pipelines_prepare_and_train(tiny_store: Path, tmp_path: Path, one_torch_thread) -> None:
    from diskflow.flow.pipeline import load_pipeline

    store = Store(tiny_store)
    opts = {"fanouts": BASE["fanouts"], "batch_size": BASE["batch_size"], "epochs": 2, "hidden": HIDDEN,
            "threads": 1, "progress": False, "cpu_memory": "8MiB", "superbatch_size": 4}
    for name in ("outre", "belady_outre"):
        assert load_pipeline(name).history_memory == "auto"       # by default the memory split sizes the cache
        r = load_pipeline(name).run(tiny_store, new_run_dir(tmp_path, name), history_memory="5%", **opts)
        f = r["prepare"]["figures"]
        assert f["batch_order"] == "partition" and f["partition"]["parts"] >= 2
        assert f["history"]["bytes"] <= store.feature_bytes * 5 // 100 and f["history"]["pruned"] > 0
        assert r["history"]["rows"] == f["history"]["rows"] and len(r["epochs"]) == 2
        v = verify(Path(r["prepare"]["path"]), full=True)
        assert v["compared_batches"] == v["batches"]
        assert r["definition"]["packing"] == (name != "outre")           # outre packs nothing
        assert r["definition"]["cpu_tier"] == ("static" if name == "outre" else "belady")
    off = load_pipeline("belady_outre").run(tiny_store, new_run_dir(tmp_path, "off"), history_memory=0, **opts)
    assert "history" not in off["prepare"]["figures"] and "history" not in off


def test_the_width_keys_the_cached_samples(rounds, tiny_store: Path, tmp_path: Path) -> None:
    """Twice the width and twice the bytes: the same rows, but a round planned for the other width."""
    cfg = PrepareConfig(**BASE, cpu_memory=4 << 20, history_dim=2 * HIDDEN, history_memory=2 * MEMORY,
                        history_staleness=20)
    r = prepare(tiny_store, rounds["s20"].path, cfg, quiet=True)
    assert not r.skipped and r.figures["history"]["dim"] == 2 * HIDDEN and r.figures["history"]["rows"] == 96
    prepare(tiny_store, rounds["s20"].path, PrepareConfig(**BASE, cpu_memory=4 << 20, history_dim=HIDDEN,
                                                          history_memory=MEMORY, history_staleness=20), quiet=True)


def test_history_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="^history_select"):
        PrepareConfig(**BASE, history_memory=MEMORY, history_select="pagerank").validate()
    with pytest.raises(ConfigError, match="^history_prune.*last-hop, subtree"):
        PrepareConfig(**BASE, history_memory=MEMORY, history_prune="deep").validate()
    with pytest.raises(ConfigError, match="^history_prune"):
        PrepareConfig(**BASE, history_prune="subtree").validate()          # no cache to prune for
    with pytest.raises(ConfigError, match="^history_staleness"):
        PrepareConfig(**BASE, history_staleness=7).validate()              # no cache to be stale
    for option, value in (("history_ramp", 0.5), ("history_cooldown", 0.1)):
        with pytest.raises(ConfigError, match=f"^{option}: applies to a historical embedding cache only"):
            PrepareConfig(**BASE, **{option: value}).validate()
    for option, value in (("history_ramp", -1.0), ("history_cooldown", 1.5), ("history_cooldown", "all")):
        with pytest.raises(ConfigError, match=f"^{option}: expected"):
            PrepareConfig(**BASE, history_memory=MEMORY, **{option: value}).validate()
    with pytest.raises(ConfigError, match="^partitions"):
        PrepareConfig(**BASE, partitions=12).validate()                    # shuffled batches: no partition
    with pytest.raises(ConfigError, match="^history_staleness"):
        PrepareConfig(**BASE, history_memory=MEMORY, history_staleness=0).validate()
    with pytest.raises(ConfigError, match="^history_memory"):
        PrepareConfig(**BASE, history_memory=8).validate()
    with pytest.raises(ConfigError, match="two or more hops"):
        PrepareConfig(**{**BASE, "fanouts": (4,)}, history_memory=MEMORY).validate()
