"""Smoke test of `diskflow bench hetero` on a tiny typed graph: the figures it writes, typed inmemory and belady
training to the same losses, and the derivation's floor reading exactly the bytes the rules read.

The bench's children run in this test's process (``--no-cgroup``, tests/bench_children.py), as compare's main
test runs them: a child process costs some 5 CPU seconds of importing torch and PyG, and the bench starts ten."""
from __future__ import annotations

import json
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest
from bench_children import compare_children_in_this_process
from diskflow.bench import hetero
from diskflow.cli import main
from diskflow.operators.formats.store import Store

from diskflow.errors import ConfigError

TINY = ["--papers", "1500", "--authors", "700", "--institutions", "30", "--dim", "16", "--classes", "4",
        "--train-frac", "0.2", "--val-frac", "0.05", "--test-frac", "0.2", "--fanouts", "4,3", "--batch-size", "64",
        "--superbatch-size", "4", "--epochs", "2", "--hidden", "16", "--feature-budget", "3500KiB", "--threads", "1",
        "--bw-bytes", str(1 << 20), "--repeats", "2", "--no-cgroup"]
KEYS = ("test_acc", "data_epoch_s", "epoch_s", "disk_read_bytes", "useful_bytes", "read_amplification", "losses",
        "store", "pipeline", "model")
HEADLINE = ("typed_minus_paper_points", "belady_data_vs_inmemory", "losses_identical", "paper_losses_identical",
            "derive_s", "derive_floor_s", "derive_over_floor")


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    work = tmp_path_factory.mktemp("bench-hetero")
    out = work / "figures.json"
    printed = StringIO()
    with compare_children_in_this_process(), redirect_stdout(printed):
        rc = main(["bench", "hetero", *TINY, "--workdir", str(work / "w"), "--json", str(out)])
    assert rc == 0, printed.getvalue()[-3000:]
    return json.loads(out.read_text()), printed.getvalue(), work / "w"


def test_every_run_has_its_figures(bench: tuple[dict, str, Path]) -> None:
    f, printed, _ = bench
    assert sorted(f["pipelines"]) == sorted(hetero.RUNS)
    for name, p in f["pipelines"].items():
        for key in KEYS:
            assert key in p, (name, key)
        assert p["errors"] is None, name
        assert len(p["data_epoch_s_repeats"]) == 2 and len(p["epoch_s_repeats"]) == 1, name      # --repeats 2
        assert p["data_epoch_s"] == min(p["data_epoch_s_repeats"]), name
        assert p["data_epoch_s"] > 0 and p["epoch_s"] > 0 and 0 <= p["test_acc"] <= 1, name
        assert [len(e) for e in p["losses"]] == [f["stores"][p["store"]]["batches_per_epoch"]] * 2, name
    assert set(HEADLINE) <= set(f["headline"]) and set(f["targets"]) == set(hetero.TARGETS)
    assert f["bench"] == "hetero" and len(f["date"]) == 10 and f["machine"] and f["machine_detail"]["cores"] >= 1
    assert f["no_cgroup"] and "NO memory limits" in printed
    for store in f["stores"].values():          # --dtype's default, as MAG240M stores its features
        assert store["dataset"]["dtype"] == "float16" == f["config"]["dtype"]
    assert "typed - paper-only test accuracy" in printed and "typed_belady" in printed
    assert f["config"]["staging_piece"] == 8 << 20      # belady's pieces (tiny batches take their own size)


def test_typed_in_memory_and_out_of_core_train_alike(bench: tuple[dict, str, Path]) -> None:
    f, printed, _ = bench
    p = f["pipelines"]
    assert f["headline"]["losses_identical"] is True and f["headline"]["paper_losses_identical"] is True
    assert p["typed_belady"]["losses"] == p["typed_inmemory"]["losses"]
    assert p["typed_belady"]["test_acc"] == p["typed_inmemory"]["test_acc"]
    assert p["typed_inmemory"]["model"] == "sage (to_hetero)" and p["paper_inmemory"]["model"] == "sage"
    assert "losses identical: True" in printed


def test_the_figures_are_consistent(bench: tuple[dict, str, Path]) -> None:
    f, _, _ = bench
    h, p, s = f["headline"], f["pipelines"], f["stores"]
    assert h["typed_minus_paper_points"] == pytest.approx(
        100 * (p["typed_inmemory"]["test_acc"] - p["paper_inmemory"]["test_acc"]))
    assert h["belady_data_vs_inmemory"] == pytest.approx(p["typed_belady"]["data_epoch_s"] /
                                                        p["typed_inmemory"]["data_epoch_s"])
    assert h["derive_s"] > 0 and h["derive_floor_s"] > 0
    assert h["derive_over_floor"] == pytest.approx(h["derive_s"] / h["derive_floor_s"])
    assert f["derive"]["floor"]["bytes"] > 0 and not f["derive"]["store_reused"]
    # the typed store: three node types, every one with rows; the paper-only store: the papers alone
    typed, paper = s["typed"]["dataset"], s["paper"]["dataset"]
    assert typed["node_types"] == {"paper": 1500, "author": 700, "institution": 30} and paper["nodes"] == 1500
    assert typed["train"] == paper["train"] > 0 and typed["test"] == paper["test"] > 0
    assert paper["edges"] == typed["edge_types"]["paper__cites__paper"]
    for kind in hetero.STORES:
        assert s[kind]["feature_budget_bytes"] == 3500 << 10 and s[kind]["feature_bytes"] > 0
        assert p[f"{kind}_belady"]["useful_bytes"] is not None and p[f"{kind}_inmemory"]["useful_bytes"] is None
    # no time was measured as less than nothing; bytes read are bytes
    for name, q in p.items():
        assert q["disk_read_bytes"] >= 0 and q["data_epoch_s"] > 0, name


def test_derive_floor_reads_the_rules_rows_and_csc(bench: tuple[dict, str, Path]) -> None:
    _, _, work = bench
    store = Store(work / "store" / "typed")
    lay = store.hetero
    assert lay is not None
    reads = hetero.derive_reads(store)
    assert {r["type"] for r in reads} == {"author", "institution"}
    rows = {t: sum(r["stop"] - r["start"] for r in reads if r["type"] == t and r["what"].endswith("rows"))
            for t in ("author", "institution")}
    assert rows == {"author": lay.node("paper").count * store.row_bytes,
                    "institution": lay.node("author").count * store.row_bytes}
    csc = [r for r in reads if r["what"] in ("indptr", "indices")]
    assert len(csc) == 4 and all(r["stop"] == r["path"].stat().st_size > 0 for r in csc)
    floor = hetero.derive_floor(store)
    wanted = sum(r["stop"] - r["start"] for r in reads)
    assert wanted <= floor["bytes"] < wanted + 2 * 4096 * len(reads)    # whole 4 KiB blocks
    assert floor["seconds"] > 0 and set(floor["types"]) == {"author", "institution"}


def test_a_second_run_reuses_the_stores(bench: tuple[dict, str, Path], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The stores of the same configuration are reused, and the JSON says the derive seconds are the first run's;
    a budget too small for the trainer's buffers is one clear error naming the store."""
    f, _, work = bench
    out = tmp_path / "again.json"
    with compare_children_in_this_process(), redirect_stdout(StringIO()):
        rc = main(["bench", "hetero", *TINY, "--workdir", str(work), "--json", str(out), "--epochs", "1"])
    assert rc == 0
    again = json.loads(out.read_text())
    assert again["derive"]["store_reused"] and again["derive"]["seconds"] == f["derive"]["seconds"]
    assert again["build"] == {"reused": True}
    assert main(["bench", "hetero", *TINY, "--workdir", str(work), "--feature-budget", "10%"]) == 2
    err = capsys.readouterr().err
    assert "--feature-budget: the typed store: " in err and "cannot hold the trainer's" in err


def test_bad_options_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "hetero", *TINY, "--workdir", str(tmp_path / "w"), "--papers", "0"]) == 2
    assert "--papers: must be >= 1, got 0" in capsys.readouterr().err
    assert main(["bench", "hetero", *TINY, "--workdir", str(tmp_path / "w"), "--staging-piece", "1KiB"]) == 2
    assert "--staging-piece: must be at least 64.00 KiB" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--epochs"):
        import argparse

        parser = argparse.ArgumentParser()
        hetero.add_arguments(parser)
        hetero.run(parser.parse_args([*TINY, "--workdir", str(tmp_path / "w2"), "--epochs", "0"]))
