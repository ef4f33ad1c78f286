"""The automatic memory split (``history_split``, ``--history-memory auto``): prepare samples and plans
the round once per candidate share of the caches' memory given to embeddings, and keeps the split
whose plan reads the fewest rows from disk. Every point of the curve is exact: preparing with that
split given by hand reads the same rows; the packed dataset is the chosen candidate's, replays
bit-exact, and carries the curve and its plot."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import dask
import numpy as np
import pytest
from diskflow.flow.memsplit import SPLIT_PLOT, SPLIT_SHARES, best_split, describe_split, refine_shares
from diskflow.flow.options import history_options
from diskflow.flow.prepare import PrepareConfig, prepare
from diskflow.operators.formats.packed import PackedDataset
from diskflow.operators.formats.store import Store
from diskflow.operators.formats.verify import verify
from diskflow.operators.prepare.history import EMBEDDING_BYTES

from diskflow.errors import ConfigError

HIDDEN = 8
CFG = PrepareConfig(fanouts=(4, 3, 3), batch_size=200, superbatch_size=4, epochs=2, seed=3, cpu_memory=2_450_000,
                    history_dim=HIDDEN, history_staleness=30, history_split=True)

pytestmark = [pytest.mark.usefixtures("sync_dask"), pytest.mark.plots]     # the split's curve is drawn


@pytest.fixture(scope="module")
def split_run(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("memsplit")
    with dask.config.set(scheduler="sync"):
        return prepare(tiny_store, root / "auto", CFG, quiet=True), root


def test_curve_has_every_share_and_the_best_is_chosen(split_run) -> None:
    r, _ = split_run
    split = r.figures["memory_split"]
    # the grid first, then the midpoints between its best and that best's neighbours
    grid = [p for p in split["curve"] if p["share"] in SPLIT_SHARES]
    assert split["curve"][:len(grid)] == grid and [p["share"] for p in grid] == sorted(p["share"] for p in grid)
    refined = split["curve"][len(grid):]
    assert refined and [p["share"] for p in refined] == [x for x in refine_shares(grid)
                                                         if x in {p["share"] for p in refined}]
    curve = sorted(split["curve"], key=lambda p: p["share"])
    none = curve[0]
    assert none["history_bytes"] == 0 and none["pruned"] == 0 and none["cpu_bytes"] == split["budget"] > 0
    most = 4111 * HIDDEN * EMBEDDING_BYTES                  # an embedding for every node of the graph
    for p in curve[1:]:
        assert p["history_bytes"] == min(int(split["budget"] * p["share"]), most) // (HIDDEN * EMBEDDING_BYTES) * (HIDDEN * EMBEDDING_BYTES)
        assert p["history_rows"] == p["history_bytes"] // (HIDDEN * EMBEDDING_BYTES)
        # the CPU tier its own plan got: what the budget leaves beside the embeddings and the staging of
        # its (pruned, so smaller) batches
        assert 0 < p["cpu_bytes"] and p["cpu_bytes"] + p["history_bytes"] < CFG.cpu_memory
    # a share asking for more than every node's embedding is the capped one, searched once
    assert [p["history_bytes"] for p in curve] == sorted({p["history_bytes"] for p in curve})
    assert curve[-1]["history_bytes"] == most and len(grid) < len(SPLIT_SHARES)
    # more embeddings prune more subtrees, so fewer rows are gathered at all
    assert [p["accesses"] for p in curve] == sorted((p["accesses"] for p in curve), reverse=True)
    assert curve[-1]["pruned"] > 0
    best = min(p["disk_bytes"] for p in curve)
    assert split["chosen"]["disk_bytes"] == best
    assert 0 < split["chosen"]["share"] < SPLIT_SHARES[-1]     # this graph's curve has its minimum inside
    assert best < none["disk_bytes"] and best < curve[-1]["disk_bytes"]
    assert split["chosen"] == min((p for p in curve if p["disk_bytes"] == best), key=lambda p: p["history_bytes"])
    # the packed dataset is the chosen candidate's
    assert r.figures["plan_miss_bytes"] == split["chosen"]["disk_bytes"]
    assert r.figures["cpu_rows"] * r.figures["row_bytes"] == split["chosen"]["cpu_bytes"]
    assert r.figures["accesses"] == split["chosen"]["accesses"]
    if split["chosen"]["history_rows"]:
        assert r.figures["history"]["rows"] == split["chosen"]["history_rows"]
    assert (r.path / SPLIT_PLOT).stat().st_size > 0
    with PackedDataset(r.path) as ds:
        assert ds.manifest["config"]["history_split"] is True
    assert "to embeddings" in describe_split(split)


def test_every_point_is_what_that_split_reads(split_run, tiny_store: Path) -> None:
    r, root = split_run
    split = r.figures["memory_split"]
    point = split["curve"][3]          # a split other than the chosen one may be checked too
    cfg = replace(CFG, history_split=False, history_memory=point["history_bytes"],
                  cpu_memory=CFG.cpu_memory - point["history_bytes"])
    with dask.config.set(scheduler="sync"):
        by_hand = prepare(tiny_store, root / "by-hand", cfg, quiet=True)
    assert by_hand.figures["misses"] == point["disk_rows"]
    assert by_hand.figures["accesses"] == point["accesses"]
    assert by_hand.figures["history"]["pruned"] == point["pruned"]


def test_chosen_round_replays_exactly(split_run, tiny_store: Path) -> None:
    r, _ = split_run
    v = verify(r.path, full=True)
    assert v["compared_batches"] == v["batches"] and v["compared_rows"] == r.figures["accesses"]
    features = Store(tiny_store).read_features()
    with PackedDataset(r.path) as ds:
        samples = (s for sb in ds.superbatches for s in ds.samples(sb.key))
        for (_, feats), s in zip(ds.replay(), samples):
            assert feats.tobytes() == features[np.asarray(s.n_id, dtype=np.int64)].tobytes()


def test_rerun_is_up_to_date_and_keeps_one_candidate(split_run, tiny_store: Path) -> None:
    r, _ = split_run
    with dask.config.set(scheduler="sync"):
        again = prepare(tiny_store, r.path, CFG, quiet=True)
    assert again.skipped and again.figures["memory_split"] == r.figures["memory_split"]
    work = Path(str(r.path) + ".work")
    assert len(list(work.glob("samples-*"))) == 1 and len(list(work.glob("plans-*"))) == 1


def test_best_split_breaks_ties_towards_fewer_embeddings() -> None:
    curve = [{"share": s, "history_bytes": h, "disk_bytes": d} for s, h, d in ((0, 0, 9), (.1, 10, 5), (.2, 20, 5))]
    assert best_split(curve)["share"] == .1


def test_staleness_one_searches_nothing_and_other_selections_key_the_dataset(split_run, tiny_store: Path) -> None:
    r, root = split_run
    with dask.config.set(scheduler="sync"):
        s1 = prepare(tiny_store, root / "s1", replace(CFG, history_staleness=1), quiet=True)
        degree = prepare(tiny_store, r.path, replace(CFG, history_select="degree"), quiet=True)
    assert [p["share"] for p in s1.figures["memory_split"]["curve"]] == [0.0] and "history" not in s1.figures
    assert not degree.skipped and degree.figures["history"]["select"] == "degree"


def test_bad_split_options_are_refused() -> None:
    with pytest.raises(ConfigError, match="^history_memory"):
        replace(CFG, history_memory=1 << 20).validate()
    with pytest.raises(ConfigError, match="^history_memory"):
        replace(CFG, cpu_memory=0).validate()
    with pytest.raises(ConfigError, match="^history_memory"):
        replace(CFG, fanouts=(5,)).validate()
    with pytest.raises(ConfigError, match="^history_select"):
        replace(CFG, history_split=False, history_staleness=100, history_select="degree").validate()   # no cache
    assert history_options("auto", 16, 1 << 20) == {
        "history_memory": 0, "history_split": True, "history_dim": 16, "history_staleness": 100,
        "history_prune": "thin", "history_ramp": 0.0, "history_cooldown": 0.0}
    # a pipeline's own rule where none is given
    assert history_options("1MiB", 16, 1 << 20, SimpleNamespace(history_cooldown=0.2), ramp=0.5)["history_cooldown"] == 0.2
    assert history_options("auto", 16, 1 << 20, SimpleNamespace(history_prune="subtree"))["history_prune"] == "subtree"
    with pytest.raises(ConfigError, match="^history_staleness"):
        history_options(None, 16, 1 << 20, staleness=7)
    with pytest.raises(ConfigError, match="^history_prune"):
        history_options(None, 16, 1 << 20, prune="subtree")              # no cache to prune for
    with pytest.raises(ConfigError, match="^history_prune"):
        history_options("1MiB", 16, 1 << 20, prune="deepest")
    with pytest.raises(ConfigError, match="^history_cooldown: applies"):
        history_options(None, 16, 1 << 20, cooldown=0.2)                 # no cache to end exact
    with pytest.raises(ConfigError, match="^history_ramp: expected"):
        history_options("1MiB", 16, 1 << 20, ramp=-2)


def test_the_cli_and_a_pipeline_take_auto(tiny_store: Path, tmp_path: Path, capsys, one_torch_thread) -> None:
    from diskflow.cli import main
    from diskflow.flow.pipeline import Pipeline
    from diskflow.flow.rundir import new_run_dir

    out = tmp_path / "packed"
    assert main(["prepare", "belady_outre", "--dataset", str(tiny_store), "--out", str(out), "--cpu-memory",
                 "4530000", "--history-memory", "auto", "--hidden", str(HIDDEN), "--fanouts", "4,3,3",
                 "--batch-size", "200", "--superbatch-size", "4", "--workers", "1"]) == 0
    assert "memory split" in capsys.readouterr().out and (out / SPLIT_PLOT).exists()
    mine = Pipeline("auto_split", history_memory="auto", history_staleness=30)
    r = mine.run(tiny_store, new_run_dir(tmp_path, "auto"), fanouts=(4, 3, 3), batch_size=200, superbatch_size=4,
                 epochs=1, hidden=HIDDEN, threads=1, progress=False, cpu_memory=4_530_000)
    split = r["prepare"]["figures"]["memory_split"]
    assert r.get("history", {}).get("rows", 0) == split["chosen"]["history_rows"] and len(r["epochs"]) == 1
    with pytest.raises(ConfigError, match="Pipeline.history_memory"):
        Pipeline("auto_mem", loader="memory", history_memory="auto")


def test_the_refinement_tries_the_midpoints_around_the_best() -> None:
    def pt(share: float, disk: int) -> dict:
        return {"share": share, "disk_bytes": disk, "history_bytes": int(share * 100)}

    assert refine_shares([pt(0.0, 9), pt(0.5, 5), pt(0.25, 4)]) == [0.125, 0.375]      # any order
    assert refine_shares([pt(0.0, 9), pt(0.5, 5)]) == [0.25]                             # the last is best
    assert refine_shares([pt(0.0, 9), pt(0.5, 5), pt(0.25, 6), pt(0.75, 7)]) == [0.375, 0.625]
    assert refine_shares([pt(0.0, 4), pt(0.5, 5)]) == [0.25]                             # ties: fewer embeddings
    assert refine_shares([pt(0.0, 9)]) == []
