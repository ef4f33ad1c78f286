"""`prepare` with partition batches (OUTRE): the partition is one cached Dask task whose time and memory
are reported; the round's samples follow the partition order; the packed dataset replays bit-exact
and carries its partition, with which the in-memory pipeline trains on the same batches (same losses)."""
from __future__ import annotations

from pathlib import Path

import dask
import numpy as np
import pytest
from diskflow.flow.prepare import PrepareConfig, prepare
from diskflow.flow.rundir import new_run_dir
from diskflow.operators.formats.packed import PackedDataset
from diskflow.operators.formats.samples import read_n_ids
from diskflow.operators.formats.store import Store
from diskflow.operators.formats.verify import verify
from diskflow.operators.prepare.seeds import BatchOrder, load_parts, seed_batches
from diskflow.operators.prepare.superbatch import round_layout, sample_superbatch

from diskflow.errors import ConfigError, InputError

BASE = {"fanouts": (5, 5), "batch_size": 160, "superbatch_size": 3, "epochs": 2, "seed": 11}


pytestmark = pytest.mark.usefixtures("sync_dask")


@pytest.fixture(scope="module")
def prepared(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("partition")
    with dask.config.set(scheduler="sync"):
        cfg = PrepareConfig(**BASE, cpu_memory=4 << 20, batches="partition", partitions=12, parts_per_group=2)
        return prepare(tiny_store, root / "packed", cfg, quiet=True), cfg, root


def test_partition_is_reported_and_carried(prepared, tiny_store: Path) -> None:
    r, _cfg, _ = prepared
    part = r.figures["partition"]
    assert r.figures["batch_order"] == "partition" and "partition" in r.phases
    assert part["parts"] == 12 and part["method"] == "kaminpar" and part["cached"] is False
    assert part["group_by"] == "label"
    assert part["seconds"] > 0 and part["peak_bytes"] > 0 and 0 < part["edge_cut"] < part["edges"]
    parts = load_parts(r.path / "partition.npy")
    store = Store(tiny_store)
    assert parts.shape == (store.num_nodes,) and set(np.unique(parts).tolist()) == set(range(12))


def test_samples_follow_the_partition_order_and_replay_exactly(prepared, tiny_store: Path, tmp_path: Path) -> None:
    r, cfg, _ = prepared
    store = Store(tiny_store)
    order = BatchOrder("partition", str(r.path / "partition.npy"), group=2, grouping="label",
                       labels=str(store.path / store.manifest["labels"]))      # prepare's default grouping
    features = store.read_features()
    want: list[np.ndarray] = []
    for ref in round_layout(store.split_ids("train").shape[0], cfg.batch_size, cfg.superbatch_size, cfg.epochs):
        sample_superbatch(tiny_store, tmp_path / ref.filename, ref, cfg.batch_size, cfg.fanouts, cfg.seed, 1, order)
        want.extend(read_n_ids(tmp_path / ref.filename))
    v = verify(r.path, full=True)
    assert v["compared_batches"] == len(want)
    with PackedDataset(r.path) as ds:
        stored = [s for sb in ds.superbatches for s in ds.samples(sb.key)]
        for s, n_id in zip(stored, want):
            np.testing.assert_array_equal(s.n_id, n_id)
        for (_, feats), n_id in zip(ds.replay(), want):
            assert feats.tobytes() == features[n_id].tobytes()
    # each epoch's seeds: every training node once, in partition order (not the shuffled one)
    train = store.split_ids("train")
    for epoch in range(cfg.epochs):
        seeds = [s.n_id[:s.batch_size] for s in stored[epoch * len(stored) // 2:(epoch + 1) * len(stored) // 2]]
        np.testing.assert_array_equal(np.sort(np.concatenate(seeds)), train)
        expect = seed_batches(train, cfg.batch_size, epoch, cfg.seed, order=order)
        assert all(np.array_equal(a, b) for a, b in zip(seeds, expect))
        assert not np.array_equal(np.concatenate(seeds), np.concatenate(seed_batches(train, cfg.batch_size, epoch,
                                                                                      cfg.seed)))


def test_partition_stage_is_cached_and_keys_the_samples(prepared, tiny_store: Path) -> None:
    r, cfg, root = prepared
    again = prepare(tiny_store, root / "packed", cfg, quiet=True)
    assert again.skipped
    # another plan (CPU budget) over the same partition: the partition and samples come from the cache
    other = prepare(tiny_store, root / "packed", PrepareConfig(**{**cfg.__dict__, "cpu_memory": 5 << 20}), quiet=True)
    assert other.figures["partition"]["cached"] is True and "sample" in other.phases
    assert other.phases["partition"] < r.phases["partition"]
    # a partition redone with other parts under the same config (several threads may do that): the
    # samples follow the parts' content, not the config
    work = Path(str(r.path) + ".work")
    before = sorted(d.name for d in work.glob("samples-*"))
    parts_file = next(work.glob("partition-*")) / "parts.npy"
    parts = np.load(parts_file)
    np.save(parts_file, ((parts + 1) % (int(parts.max()) + 1)).astype(np.int32))
    redone = prepare(tiny_store, root / "packed", PrepareConfig(**{**cfg.__dict__, "cpu_memory": 6 << 20}), quiet=True)
    assert sorted(d.name for d in work.glob("samples-*")) != before and not redone.skipped
    np.save(parts_file, parts)
    restored = prepare(tiny_store, root / "packed", cfg, quiet=True)       # the fixture's dataset again
    assert restored.figures["misses"] == r.figures["misses"] and sorted(d.name for d in work.glob("samples-*")) == before
    # more parts: another partition, other batches
    more = prepare(tiny_store, root / "more", PrepareConfig(**{**cfg.__dict__, "partitions": 20}), quiet=True)
    assert more.figures["partition"]["parts"] == 20
    with PackedDataset(r.path) as a, PackedDataset(more.path) as b:
        sa = next(iter(a.samples(a.superbatches[0].key))).n_id
        sb = next(iter(b.samples(b.superbatches[0].key))).n_id
        assert not np.array_equal(sa, sb)


def test_inmemory_trains_on_the_packed_partition_batches(prepared, tiny_store: Path, tmp_path: Path,
                                                         one_torch_thread) -> None:
    from diskflow.operators.train.trainer import train_packed
    from diskflow.pipelines import inmemory

    r, cfg, _ = prepared
    model = {"model": "sage", "hidden": 8, "seed": cfg.seed, "eval_every": 2}
    packed = train_packed(r.path, new_run_dir(tmp_path, "packed"), threads=1, **model)
    common = {"fanouts": cfg.fanouts, "batch_size": cfg.batch_size, "epochs": cfg.epochs, "progress": False,
              "threads": 1, **model}
    mem = inmemory.run(tiny_store, new_run_dir(tmp_path, "mem"), batches="partition",
                       partition=r.path / "partition.npy", parts_per_group=2, **common)
    assert [e["losses"] for e in mem["epochs"]] == [e["losses"] for e in packed["epochs"]]
    assert mem["config"]["batches"] == "partition"
    shuffled = inmemory.run(tiny_store, new_run_dir(tmp_path, "shuf"), **common)
    assert [e["losses"] for e in shuffled["epochs"]] != [e["losses"] for e in packed["epochs"]]
    # partitioning here (no file given) writes the run's own partition
    own = inmemory.run(tiny_store, new_run_dir(tmp_path, "own"), batches="partition", partitions=12,
                       parts_per_group=2, **common)
    assert (Path(own["run_dir"]) / "partition.npy").is_file() and own["partition"]["parts"] == 12
    assert [e["losses"] for e in own["epochs"]] == [e["losses"] for e in packed["epochs"]]   # the same parts
    # OUTRE's random grouping: other batches, in both pipelines alike
    rnd = prepare(tiny_store, tmp_path / "random", PrepareConfig(**{**cfg.__dict__, "group_by": "random"}), quiet=True)
    packed_rnd = train_packed(rnd.path, new_run_dir(tmp_path, "packed-rnd"), threads=1, **model)
    mem_rnd = inmemory.run(tiny_store, new_run_dir(tmp_path, "mem-rnd"), batches="partition", group_by="random",
                           partition=r.path / "partition.npy", parts_per_group=2, **common)
    assert [e["losses"] for e in mem_rnd["epochs"]] == [e["losses"] for e in packed_rnd["epochs"]]
    assert [e["losses"] for e in mem_rnd["epochs"]] != [e["losses"] for e in packed["epochs"]]


def test_bad_partition_options(tiny_store: Path, tmp_path: Path) -> None:
    from diskflow.flow.pipeline import Pipeline
    from diskflow.pipelines import inmemory

    with pytest.raises(ConfigError, match="^batches"):
        PrepareConfig(**BASE, batches="metis").validate()
    with pytest.raises(ConfigError, match="^partitions"):
        PrepareConfig(**BASE, batches="partition", partitions=1).validate()
    with pytest.raises(ConfigError, match="^partitioner"):
        PrepareConfig(**BASE, batches="partition", partitioner="fennel").validate()
    with pytest.raises(ConfigError, match="^group_by"):
        PrepareConfig(**BASE, batches="partition", group_by="degree").validate()
    with pytest.raises(ConfigError, match="^group_by"):
        PrepareConfig(**BASE, group_by="random").validate()            # shuffled batches have no groups
    with pytest.raises(ConfigError, match="^group_by"):
        inmemory.run(tiny_store, new_run_dir(tmp_path, "g"), group_by="random", epochs=1, progress=False)
    assert Pipeline("s", loader="stream", batches="partition").batches == "partition"   # streamed too
    with pytest.raises(ConfigError, match="^partition: applies to partition batches"):
        inmemory.run(tiny_store, new_run_dir(tmp_path, "x"), partition=tmp_path / "p.npy", epochs=1, progress=False)
    with pytest.raises(InputError, match="p.npy"):
        inmemory.run(tiny_store, new_run_dir(tmp_path, "x2"), batches="partition", partition=tmp_path / "p.npy",
                     epochs=1, progress=False)
    (tmp_path / "junk.npy").write_bytes(b"not an array")
    with pytest.raises(InputError, match="not a partition file"):
        inmemory.run(tiny_store, new_run_dir(tmp_path, "x3"), batches="partition", partition=tmp_path / "junk.npy",
                     epochs=1, progress=False)
    np.save(tmp_path / "short.npy", np.zeros(10, dtype=np.int32))
    with pytest.raises(ConfigError, match="the store has"):
        inmemory.run(tiny_store, new_run_dir(tmp_path, "y"), batches="partition", partition=tmp_path / "short.npy",
                     epochs=1, progress=False)


def test_a_partition_lent_to_another_cache_is_reused(prepared, tiny_store: Path, tmp_path: Path) -> None:
    """`link_partitions` hard-links the finished partition stages of one prepare cache into another (made a
    prepare cache); a prepare there finds its partition done. Unfinished stages are never lent."""
    import os

    from diskflow.flow.prepare import WORK_MARKER, link_partitions

    r, cfg, _ = prepared
    src, dst = Path(str(r.path) + ".work"), tmp_path / "other.work"
    unfinished = src / "partition-0000000000000000"
    unfinished.mkdir()
    try:
        linked = link_partitions(src, dst)
        finished = sorted(d.name for d in src.glob("partition-*") if (d / "manifest.json").is_file())
        assert linked == finished and finished and unfinished.name not in linked
        assert (dst / WORK_MARKER).is_file()
        for name in linked:
            assert os.stat(src / name / "parts.npy").st_ino == os.stat(dst / name / "parts.npy").st_ino
        assert link_partitions(src, dst) == []                 # already there: nothing linked twice
    finally:
        unfinished.rmdir()
    other = prepare(tiny_store, tmp_path / "other", cfg, quiet=True)
    assert not other.skipped and other.figures["partition"]["cached"] is True
    assert other.figures["misses"] == r.figures["misses"]
