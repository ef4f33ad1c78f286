"""Encoded feature rows (`Pipeline(rows=...)`, ``--rows``): the tiers and packed segments hold float16,
bfloat16 or int8 rows, planned over their bytes, decoded as each batch is assembled. Exact stays exact; an
encoded batch lies within its encoding's bound of the store's rows; verify checks encoded packs bit for bit; a
new encoding of the same row size re-packs from the same plans; pipelines that cannot hold encoded rows refuse
them in one line."""
from __future__ import annotations

import json
from pathlib import Path

import dask
import numpy as np
import pytest
from diskflow.flow.ingest import run_ingest
from diskflow.flow.pipeline import Pipeline, load_pipeline
from diskflow.operators.formats.manifest import read_manifest
from diskflow.operators.formats.rowcodec import RowCodec
from diskflow.operators.formats.store import Store
from diskflow.operators.formats.verify import verify
from diskflow.operators.ingest.raw import write_raw_dataset
from diskflow.operators.train.loader import PackedLoader

from diskflow.errors import ConfigError, InputError

PREP = {"quiet": True, "fanouts": (5, 5), "batch_size": 128, "epochs": 2, "cpu_memory": 2_000_000}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60,000 nodes x 32 float32 features with a few large outliers, in 4 shards; a tenth of them train."""
    rng = np.random.default_rng(3)
    root = tmp_path_factory.mktemp("rows")
    n = 60_000
    x = rng.standard_normal((n, 32)).astype(np.float32)
    x[rng.integers(0, n, 20), rng.integers(0, 32, 20)] = 300.0      # outliers
    x[:, 5] = 0.0                                                     # a zero column
    labels = rng.integers(0, 4, n)
    src, dst = rng.integers(0, n, 400_000), rng.integers(0, n, 400_000)
    splits = np.array(["train", "val", "test"])[rng.choice(3, n, p=[0.1, 0.1, 0.8])]
    raw = write_raw_dataset(root / "raw", src=src, dst=dst, features=x, labels=labels, splits=splits)
    with dask.config.set(scheduler="sync"):
        run_ingest(raw, root / "store", shard_rows=15_000)
    return root / "store"


def _prepare(store: Path, out: Path, rows: str, pipeline: str = "belady") -> dict:
    with dask.config.set(scheduler="sync"):
        load_pipeline(pipeline).prepare(store, out, rows=rows, **PREP)
    return read_manifest(out) or {}


@pytest.mark.parametrize("rows", ["float16", "bfloat16", "int8"])
def test_encoded_batches_are_within_the_bound_and_verified(store: Path, tmp_path: Path, rows: str) -> None:
    exact = _prepare(store, tmp_path / "exact", "exact")
    m = _prepare(store, tmp_path / rows, rows)
    codec = RowCodec.from_manifest(m["rows"])
    assert m["row_bytes"] == codec.row_bytes < exact["row_bytes"] and m["dtype"] == "uint8"
    f, fx = m["figures"], exact["figures"]
    # the same budget holds more rows, so fewer reads miss; some still do (packed segments are read)
    assert f["cpu_rows"] > fx["cpu_rows"] and f["misses"] < fx["misses"] and f["packed_bytes"] > 0
    assert f["packed_bytes"] < fx["packed_bytes"] * 0.55
    st = Store(store)
    loader = PackedLoader(tmp_path / rows)
    seen = 0
    for batch in loader:
        want = st.gather(batch.n_id.numpy())
        got = batch.x.numpy()
        assert got.dtype == np.float32 and got.shape == want.shape
        assert (np.abs(got - want) <= codec.value_bound(want)).all()
        assert (got[:, 5] == 0).all()       # a zero column decodes to exact zeros
        loader.release(batch)
        seen += 1
    stats = loader.stats()["tiers"]["rows"]
    loader.close()
    assert seen == loader.num_batches and stats["packed"] > 0 and stats["cpu"] > 0
    assert verify(tmp_path / rows, full=True)["compared_batches"] == seen
    part = max((tmp_path / rows / "round-0").glob("part-*"), key=lambda p: p.stat().st_size)
    with open(part, "r+b") as fh:       # one flipped byte of an encoded segment
        b = fh.read(1)
        fh.seek(0)
        fh.write(bytes([b[0] ^ 0x40]))
    with pytest.raises(InputError):
        verify(tmp_path / rows, full=True)


def test_the_disk_cache_and_the_device_path_hold_encoded_rows(tiny_store: Path, tmp_path: Path) -> None:
    """A disk budget the int8 packing exceeds: the segmented disk cache holds int8 rows too; the CUDA assembly
    path (run on the CPU) decodes the same batches."""
    from diskflow.flow.prepare import PrepareConfig, prepare

    base = {"fanouts": (5, 5), "batch_size": 192, "superbatch_size": 3, "epochs": 2, "seed": 3, "rows": "int8",
            "staging_batches": 1}
    with dask.config.set(scheduler="sync"):
        free = prepare(tiny_store, tmp_path / "free", PrepareConfig(**base, cpu_memory=1 << 30), quiet=True)
        budget = int(free.figures["staging_bytes"]) + 600 * int(free.figures["row_bytes"])
        f = prepare(tiny_store, tmp_path / "d", PrepareConfig(**base, cpu_memory=budget, disk_budget=800_000),
                    quiet=True).figures
    assert f["segment_size"] and f["dcache_bytes"] > 0
    assert verify(tmp_path / "d", full=True)["dcache_bytes_checked"] > 0
    m = read_manifest(tmp_path / "d") or {}
    codec, st = RowCodec.from_manifest(m["rows"]), Store(tiny_store)
    with PackedLoader(tmp_path / "d") as loader:
        loader._device_path = True
        for batch in loader:
            want = st.gather(batch.n_id.numpy())
            assert (np.abs(batch.x.numpy() - want) <= codec.value_bound(want)).all()
            loader.release(batch)
        assert loader.stats()["tiers"]["rows"]["dcache"] > 0


def test_exact_stays_exact_and_a_new_encoding_of_one_size_reuses_the_plans(store: Path, tmp_path: Path) -> None:
    default = _prepare(store, tmp_path / "default", "exact")
    with dask.config.set(scheduler="sync"):
        load_pipeline("belady").prepare(store, tmp_path / "plain", **PREP)
    plain = read_manifest(tmp_path / "plain") or {}
    assert "rows" not in default and default["config_hash"] == plain["config_hash"]
    assert default["figures"]["packed_bytes"] == plain["figures"]["packed_bytes"]
    out = tmp_path / "p"
    _prepare(store, out, "float16")
    work = Path(f"{out}.work")
    plans = sorted(p.name for p in work.glob("plans-*"))
    stamp = {p: p.stat().st_mtime_ns for d in work.glob("plans-*") for p in d.rglob("*") if p.is_file()}
    assert plans and stamp
    m = _prepare(store, out, "bfloat16")        # 2-byte rows again: the same plans, packed anew
    assert m["rows"]["encoding"] == "bfloat16"
    assert sorted(p.name for p in work.glob("plans-*")) == plans
    assert all(p.stat().st_mtime_ns == t for p, t in stamp.items())
    _prepare(store, out, "int8")                # another row size: the tiers hold other rows, planned again
    assert sorted(p.name for p in work.glob("plans-*")) != plans


def test_a_run_with_encoded_rows_trains_and_says_so(store: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from diskflow.cli import main

    opts = ["--dataset", str(store), "--epochs", "1", "--batch-size", "128", "--fanouts", "5,5", "--hidden", "16",
            "--cpu-memory", "4000000", "--no-progress", "--runs-dir", str(tmp_path / "runs"), "--threads", "1"]
    assert main(["run", "belady", *opts, "--rows", "int8"]) == 0
    out = capsys.readouterr().out
    assert "rows: int8, 36 B a row against 128 B exact (3.56x fewer bytes)" in out
    report = json.loads(next((tmp_path / "runs").rglob("report.json")).read_text())
    assert report["dataset"]["rows"]["encoding"] == "int8" and report["final"]["test_acc"] is not None
    assert report["prepare"]["figures"]["rows"]["row_bytes"] == 36


def test_pipelines_that_read_exact_rows_refuse_an_encoding(store: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="^rows: the ginex pipeline reads its misses from the store"):
        _prepare(store, tmp_path / "g", "int8", "ginex")
    assert not (tmp_path / "g").exists()
    (tmp_path / "r").mkdir()
    with pytest.raises(ConfigError, match="^rows: the gnndrive pipeline reads exact rows"):
        load_pipeline("gnndrive").run(store, tmp_path / "r", rows="float16", epochs=1, progress=False)
    with pytest.raises(ConfigError, match="^Pipeline.rows: encoded rows live in the tiers and packed segments"):
        Pipeline("mine", loader="online", rows="int8")
    with pytest.raises(ConfigError, match="^rows: expected one of exact, float16, bfloat16, int8"):
        _prepare(store, tmp_path / "x", "int4")
    with dask.config.set(scheduler="sync"), pytest.raises(ConfigError, match="^rows: the memory split"):
        load_pipeline("belady_outre").prepare(store, tmp_path / "o", rows="int8", **PREP)


def test_a_streamed_run_packs_and_ships_encoded_rows(store: Path, tmp_path: Path) -> None:
    """The stream's tiers and bundles hold float16 rows: its losses are the prepared float16 round's."""
    from diskflow.pipelines import belady, streaming

    opts = {"epochs": 1, "batch_size": 128, "fanouts": (5, 5), "hidden": 16, "progress": False, "threads": 1,
            "seed": 1, "device": "cpu", "superbatch_size": 4, "cpu_memory": 4_000_000, "rows": "float16"}
    with dask.config.set(scheduler="sync"):
        ref = belady.run(store, tmp_path / "b", **opts)
    rep = streaming.run(store, tmp_path / "s", window=2, workers=1, processes=False, **opts)
    assert [r["losses"] for r in rep["epochs"]] == [r["losses"] for r in ref["epochs"]]
    assert rep["dataset"]["rows"]["encoding"] == "float16" and rep["stream"]["tiers"]["cpu_rows"] > 0
