"""The synthetic generator: deterministic, well-formed, power-law, homophilous, atomic, resumable."""
from __future__ import annotations

import json
from pathlib import Path

import dask
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from diskflow.cli import main
from diskflow.flow import synth as flow_synth
from diskflow.flow.synth import run_synth
from diskflow.operators.ingest.synth import Layout, SynthConfig, centroids, labels_of, synth_part
from pyarrow import ipc

from diskflow.errors import ConfigError, InputError

# 5 parts, the last one short; signal and homophily as the defaults were before 2026-11-28 (the thresholds below)
SMALL = {"num_nodes": 3001, "feature_dim": 13, "num_classes": 4, "part_nodes": 700, "homophily": 0.75, "signal": 1.0}


def synth(out: Path, **kw) -> Path:
    with dask.config.set(scheduler="sync"):
        return run_synth(SynthConfig(**{**SMALL, **kw}), out)


def read_raw(path: Path) -> dict[str, np.ndarray]:
    """All of a raw dataset's columns, as numpy arrays, in file order."""
    edges = pq.read_table(sorted((path / "edges").glob("part-*.parquet")))
    nodes = pq.read_table(sorted((path / "nodes").glob("part-*.parquet")))
    feats = [ipc.open_file(f).read_all() if f.suffix == ".arrow" else pq.read_table(f)
             for f in sorted((path / "features").glob("part-*"))]
    x = pa.concat_tables(feats)
    dim = x.schema.field("x").type.list_size
    return {
        "src": edges["src"].to_numpy(), "dst": edges["dst"].to_numpy(),
        "node_id": nodes["node_id"].to_numpy(), "label": nodes["label"].to_numpy(),
        "split": np.asarray(nodes["split"].cast(pa.string()).to_pylist()),
        "x_id": x["node_id"].to_numpy(),
        "x": x["x"].combine_chunks().flatten().to_numpy().reshape(-1, dim),
    }


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth(tmp_path_factory.mktemp("synth") / "raw", seed=3)


@pytest.fixture(scope="module")
def small_raw(small: Path) -> dict[str, np.ndarray]:
    return read_raw(small)


def test_schema_and_dtypes(small: Path) -> None:
    assert pq.read_schema(small / "edges" / "part-00000.parquet").equals(pa.schema([("src", pa.int64()), ("dst", pa.int64())]))
    nodes = pq.read_schema(small / "nodes" / "part-00000.parquet")
    assert nodes.field("node_id").type == pa.int64() and nodes.field("label").type == pa.int64()
    assert pa.types.is_dictionary(nodes.field("split").type)
    feats = ipc.open_file(small / "features" / "part-00004.arrow").schema
    assert feats.field("node_id").type == pa.int64()
    assert feats.field("x").type == pa.list_(pa.float32(), 13)
    assert sorted(p.name for p in (small / "features").iterdir()) == [f"part-0000{i}.arrow" for i in range(5)]


def test_float16_parquet_features(tmp_path: Path) -> None:
    out = synth(tmp_path / "raw", num_nodes=501, part_nodes=200, dtype="float16", feature_format="parquet")
    assert pq.read_schema(out / "features" / "part-00002.parquet").field("x").type == pa.list_(pa.float16(), 13)
    raw = read_raw(out)
    assert raw["x"].dtype == np.float16 and raw["x"].shape == (501, 13)
    assert json.loads((out / "manifest.json").read_text())["feature_bytes"] == 501 * 13 * 2


def test_node_ids_exactly_once(small_raw: dict[str, np.ndarray]) -> None:
    np.testing.assert_array_equal(np.sort(small_raw["node_id"]), np.arange(3001))
    np.testing.assert_array_equal(np.sort(small_raw["x_id"]), np.arange(3001))
    assert small_raw["x"].shape == (3001, 13)
    assert small_raw["src"].min() >= 0 and max(small_raw["src"].max(), small_raw["dst"].max()) < 3001


def test_manifest_counts_match_files(small: Path, small_raw: dict[str, np.ndarray]) -> None:
    m = json.loads((small / "manifest.json").read_text())
    assert m["format"] == "diskflow-raw"
    assert m["config"] == SynthConfig(**SMALL, seed=3).as_dict()
    assert (m["num_nodes"], m["num_edges"]) == (3001, len(small_raw["src"]))
    assert m["feature_bytes"] == 3001 * 13 * 4
    split_names, split_n = np.unique(small_raw["split"], return_counts=True)
    assert {k: v for k, v in m["split_counts"].items() if v} == dict(zip(split_names.tolist(), split_n.tolist()))
    same = small_raw["label"][np.argsort(small_raw["node_id"])]
    assert m["edge_homophily"] == pytest.approx(np.mean(same[small_raw["src"]] == same[small_raw["dst"]]))


def test_undirected_without_self_loops(small_raw: dict[str, np.ndarray]) -> None:
    src, dst = small_raw["src"], small_raw["dst"]
    assert not np.any(src == dst)
    fwd = np.sort(src * 3001 + dst)
    np.testing.assert_array_equal(fwd, np.sort(dst * 3001 + src))
    # duplicates are removed inside a task; only pairs drawn from both ends by two tasks repeat
    assert len(np.unique(fwd)) > 0.99 * len(fwd)
    assert 8 <= len(src) / 3001 <= 16  # avg_degree 15, less the duplicates a small graph draws


def test_degrees_are_heavy_tailed(small_raw: dict[str, np.ndarray]) -> None:
    deg = np.bincount(small_raw["dst"], minlength=3001)
    assert deg.max() > 15 * deg.mean()
    # hot nodes are scattered over the id range, not packed at low ids
    hot = np.argsort(deg)[-8:]
    assert hot.max() - hot.min() > 3001 // 4


def test_determinism(tmp_path: Path, small: Path, small_raw: dict[str, np.ndarray]) -> None:
    again = read_raw(synth(tmp_path / "again", seed=3))
    for key, value in small_raw.items():
        np.testing.assert_array_equal(again[key], value, err_msg=key)
    other = read_raw(synth(tmp_path / "other", seed=4))
    assert len(other["src"]) != len(small_raw["src"]) or not np.array_equal(other["src"], small_raw["src"])
    assert not np.array_equal(other["x"], small_raw["x"])


def test_one_part_alone_equals_its_share_of_the_whole(tmp_path: Path, small: Path) -> None:
    cfg = SynthConfig(**SMALL, seed=3)
    info = synth_part(cfg, tmp_path, 2)
    assert info["nodes"] == 700
    for sub, name in (("edges", "part-00002.parquet"), ("nodes", "part-00002.parquet")):
        assert pq.read_table(tmp_path / sub / name).equals(pq.read_table(small / sub / name))
    alone = ipc.open_file(tmp_path / "features" / "part-00002.arrow").read_all()
    assert alone.equals(ipc.open_file(small / "features" / "part-00002.arrow").read_all())
    np.testing.assert_array_equal(alone["node_id"].to_numpy(), np.arange(1400, 2100))


@pytest.mark.parametrize("homophily", [0.3, 0.9])
def test_edge_homophily_follows_config(tmp_path: Path, homophily: float) -> None:
    raw = read_raw(synth(tmp_path / "raw", homophily=homophily, num_nodes=2003))
    label = raw["label"][np.argsort(raw["node_id"])]
    measured = np.mean(label[raw["src"]] == label[raw["dst"]])
    assert measured == pytest.approx(homophily, abs=0.05)


def test_labels_follow_communities_with_noise() -> None:
    cfg = SynthConfig(**SMALL, label_noise=0.4)
    layout = Layout.of(cfg)
    v = np.arange(cfg.num_nodes)
    community = layout.community(v)
    np.testing.assert_array_equal(labels_of(SynthConfig(**SMALL), layout, v), community)
    changed = np.mean(labels_of(cfg, layout, v) != community)
    assert changed == pytest.approx(0.4 * 3 / 4, abs=0.04)  # a random class is the old one 1/4 of the time
    assert np.bincount(community).min() > 0 and np.bincount(community).max() - np.bincount(community).min() <= 1


def test_layout_is_a_bijection() -> None:
    layout = Layout.of(SynthConfig(num_nodes=1009 * 6, num_classes=6, seed=11))
    v = np.arange(layout.num_nodes)
    np.testing.assert_array_equal(np.sort(layout.rank(v)), v)
    c = layout.community(v)
    j = layout.rank(v) // 6
    np.testing.assert_array_equal(layout.node(c, j), v)


def test_features_carry_a_class_signal(small_raw: dict[str, np.ndarray]) -> None:
    x = small_raw["x"][np.argsort(small_raw["x_id"])]
    label = small_raw["label"][np.argsort(small_raw["node_id"])]
    means = np.stack([x[label == k].mean(axis=0) for k in range(4)])
    mu = centroids(SynthConfig(**SMALL, seed=3))
    np.testing.assert_array_equal(np.argmax(means @ mu.T, axis=1), np.arange(4))
    assert np.std(x - mu[label]) == pytest.approx(1.0, abs=0.03)  # the noise
    # one node's features alone are a weak signal: nearest centroid is right far from always
    assert 0.3 < np.mean(np.argmax(x @ mu.T, axis=1) == label) < 0.8


def test_split_fractions(tmp_path: Path) -> None:
    raw = read_raw(synth(tmp_path / "raw", num_nodes=4001, train_frac=0.5, val_frac=0.1, test_frac=0.25))
    frac = {k: np.mean(raw["split"] == k) for k in ("train", "val", "test", "none")}
    assert frac == pytest.approx({"train": 0.5, "val": 0.1, "test": 0.25, "none": 0.15}, abs=0.025)


def test_interrupted_run_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail_on_part_3(cfg, out_dir, part):
        if part == 3:
            raise RuntimeError("worker died")
        return synth_part(cfg, out_dir, part)

    monkeypatch.setattr(flow_synth, "synth_part", fail_on_part_3)
    with pytest.raises(RuntimeError, match="worker died"):
        synth(tmp_path / "raw")
    assert list(tmp_path.iterdir()) == []


def test_rerun_skips_unless_forced_or_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = synth(tmp_path / "raw", num_nodes=301, part_nodes=100)
    stamp = (out / "manifest.json").stat().st_mtime_ns
    calls: list[int] = []

    def counting(cfg, out_dir, part):
        calls.append(part)
        return synth_part(cfg, out_dir, part)

    monkeypatch.setattr(flow_synth, "synth_part", counting)
    synth(out, num_nodes=301, part_nodes=100)
    assert calls == [] and (out / "manifest.json").stat().st_mtime_ns == stamp
    with dask.config.set(scheduler="sync"):
        run_synth(SynthConfig(**{**SMALL, "num_nodes": 301, "part_nodes": 100}), out, force=True)
    assert sorted(calls) == [0, 1, 2, 3]  # the last part holds one node
    synth(out, num_nodes=301, part_nodes=100, seed=9)
    assert len(calls) == 8
    assert json.loads((out / "manifest.json").read_text())["config"]["seed"] == 9


def test_refuses_to_replace_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "thesis.tex").write_text("precious")
    with pytest.raises(InputError, match="not a diskflow raw dataset"):
        synth(tmp_path / "home")
    assert (tmp_path / "home" / "thesis.tex").read_text() == "precious"


@pytest.mark.parametrize("kw, option", [
    ({"num_nodes": 1}, "nodes"),
    ({"num_nodes": 10.5}, "nodes"),
    ({"feature_dim": 0}, "dim"),
    ({"num_classes": 1}, "classes"),
    ({"homophily": 1.5}, "homophily"),
    ({"avg_degree": 0}, "avg_degree"),
    ({"signal": float("nan")}, "signal"),
    ({"degree_exponent": 2.0}, "degree_exponent"),
    ({"dtype": "float64"}, "dtype"),
    ({"seed": -1}, "seed"),
    ({"train_frac": 0.7, "val_frac": 0.2, "test_frac": 0.2}, "test_frac"),
    ({"part_nodes": 0}, "part_nodes"),
    ({"feature_format": "csv"}, "feature_format"),
])
def test_bad_config_names_the_option(kw: dict, option: str) -> None:
    with pytest.raises(ConfigError, match=f"^{option}: "):
        SynthConfig(**kw)


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "raw"
    assert main(["synth", str(out), "--nodes", "211", "--dim", "5", "--classes", "3", "--part-nodes", "100",
                 "--workers", "1", "--format", "parquet", "--dtype", "float16"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("synth: 211 nodes, ") and line.endswith(str(out))
    m = json.loads((out / "manifest.json").read_text())
    assert m["config"]["feature_format"] == "parquet" and m["shards"]["features"] == 3
    assert main(["synth", str(out), "--nodes", "1"]) == 2
    assert "--nodes" in capsys.readouterr().err


def test_locality_puts_dense_clusters_inside_the_communities(tmp_path: Path, small_raw: dict[str, np.ndarray]) -> None:
    from diskflow.operators.ingest.synth import LOCAL_WIDTH

    cfg = SynthConfig(**{**SMALL, "seed": 3})
    assert "locality" not in cfg.as_dict()          # graphs made before the option keep their identity
    local = read_raw(synth(tmp_path / "raw", seed=3, locality=0.8))
    layout = Layout.of(cfg)

    def near(raw: dict[str, np.ndarray]) -> float:
        """Share of edges inside a community between members at most one mean offset apart."""
        cs, cd = layout.community(raw["src"]), layout.community(raw["dst"])
        js, jd = layout.rank(raw["src"]) // cfg.num_classes, layout.rank(raw["dst"]) // cfg.num_classes
        size = layout.members(cs)
        gap = np.minimum(np.abs(js - jd), size - np.abs(js - jd))
        return float(np.mean((cs == cd) & (gap <= LOCAL_WIDTH)))

    assert near(local) > 2 * near(small_raw)
    label = local["label"][np.argsort(local["node_id"])]
    assert np.mean(label[local["src"]] == label[local["dst"]]) == pytest.approx(SMALL.get("homophily", 0.75), abs=0.05)
    with pytest.raises(ConfigError, match="^locality"):
        SynthConfig(locality=1.5)
