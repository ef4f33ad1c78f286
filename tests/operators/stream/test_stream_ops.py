"""Streamed packing, shipping and training as plain operators (no Dask): a superbatch packed on its own is
a packed dataset whose replay is bit-exact; shipping verifies every file, inline or through an fsspec URL,
and keeps to its quota; the trainer carried across staged superbatches gives the offline run's losses."""
from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from diskflow.operators.formats.packed import PackedDataset
from diskflow.operators.formats.store import Store
from diskflow.operators.prepare.count import count_accesses, dense_counts, merge_counts
from diskflow.operators.prepare.plan import initial_fill, plan_belady
from diskflow.operators.prepare.superbatch import round_layout, sample_superbatch_bytes
from diskflow.operators.stream import ship as stream_ship
from diskflow.operators.stream.pack import (
    BASE_FILES,
    pack_base,
    pack_superbatch,
    sample_n_ids,
    stream_header,
)
from diskflow.operators.stream.ship import (
    ScratchSpace,
    ShipVerifyError,
    disk_bytes,
    drop_source,
    held_files,
    stage_bundle,
)

from diskflow.errors import ConfigError, InputError

B, SB, E, F, SEED = 256, 3, 2, (5, 5), 1


@pytest.fixture(scope="module")
def stream(tiny_store: Path) -> dict:
    """The round's samples, the tiers from the first two superbatches, and every superbatch's chained plan."""
    st = Store(tiny_store)
    refs = round_layout(st.split_ids("train").shape[0], B, SB, E)
    samples = [np.frombuffer(sample_superbatch_bytes(tiny_store, r, B, list(F), SEED)[0], np.uint8) for r in refs]
    freq = dense_counts(merge_counts(*[count_accesses(sample_n_ids(s), st.num_nodes) for s in samples[:2]]),
                        st.num_nodes)
    gpu_ids = np.sort(np.argsort(-freq, kind="stable")[:37])          # an odd-sized GPU tier
    cpu_ids = initial_fill([b for s in samples[:2] for b in sample_n_ids(s)], 211, freq, gpu_ids)
    plans, cache = [], cpu_ids
    for i, s in enumerate(samples):
        look = sample_n_ids(samples[i + 1]) if i + 1 < len(samples) else []
        plan = plan_belady(sample_n_ids(s), look, cpu_ids.shape[0], cache, gpu_ids, freq)
        plans.append(plan)
        cache = plan.final_cache
    header = stream_header(st, {"fanouts": list(F), "batch_size": B, "seed": SEED, "cpu_policy": "belady"},
                           gpu_ids.shape[0], cpu_ids.shape[0], sum(r.num_batches for r in refs), E)
    return {"store": st, "refs": refs, "samples": samples, "plans": plans, "gpu": gpu_ids, "cpu": cpu_ids,
            "header": header}


def _bundle(stream: dict, i: int, url: str | None = None):
    return pack_superbatch(stream["store"].path, stream["refs"][i], stream["samples"][i], stream["plans"][i].batches,
                           stream["header"], final_cache=stream["plans"][i].final_cache, stream_index=i, url=url)


def test_samples_are_the_offline_rounds(tiny_store: Path, tmp_path: Path, stream: dict) -> None:
    from diskflow.operators.formats.samples import read_n_ids
    from diskflow.operators.prepare.superbatch import sample_superbatch

    r = stream["refs"][4]
    sample_superbatch(tiny_store, tmp_path / "s.arrow", r, B, F, SEED)
    assert all(np.array_equal(a, b) for a, b in zip(read_n_ids(tmp_path / "s.arrow"), sample_n_ids(stream["samples"][4])))
    # built in memory, the stream's samples are byte for byte the offline round's file
    assert bytes(stream["samples"][4]) == (tmp_path / "s.arrow").read_bytes()


def test_an_index_built_in_memory_is_the_index_file(tmp_path: Path, stream: dict) -> None:
    """A bundle's index (built in memory) and `write_index_file`'s file of the same records are the same bytes."""
    import pyarrow as pa
    from diskflow.operators.formats.packed import ROUND_DIR, index_name
    from diskflow.operators.formats.packedindex import index_bytes, read_index_file, write_index_file

    bundle = _bundle(stream, 1)
    shipped = bundle.data[f"{ROUND_DIR}/{index_name(bundle.key)}"]
    (tmp_path / "shipped.arrow").write_bytes(shipped.tobytes())
    records = read_index_file(tmp_path / "shipped.arrow")
    assert len(records) == stream["refs"][1].num_batches
    meta = {k.decode(): v.decode() for k, v in pa.ipc.open_file(tmp_path / "shipped.arrow").schema.metadata.items()}
    write_index_file(tmp_path / "written.arrow", records, meta)
    assert (tmp_path / "written.arrow").read_bytes() == shipped.tobytes() == bytes(index_bytes(records, meta))


@pytest.mark.parametrize("hold", [False, True], ids=["on-disk", "held"])
def test_a_staged_superbatch_replays_bit_exactly(tmp_path: Path, stream: dict, hold: bool) -> None:
    """Every superbatch dir (base linked in) is a packed dataset; replaying the chain gives features[n_id].

    Held: the index and samples stay in memory (not on disk) and the dataset reads them from there.
    """
    st = stream["store"]
    base = stage_bundle(pack_base(st.path, stream["gpu"], stream["cpu"]), tmp_path / "base")
    assert sorted(p.name for p in Path(base["dir"]).iterdir()) == sorted(BASE_FILES)
    assert held_files(pack_base(st.path, stream["gpu"], stream["cpu"])) == [], "the base tiers go to disk"
    feats = st.read_features()
    cpu = None
    for i in range(len(stream["refs"])):
        b = _bundle(stream, i)
        key = stream["refs"][i].key
        hold_rels = held_files(b) if hold else []
        out = stage_bundle(b, tmp_path / key, base=tmp_path / "base", hold=hold_rels)
        d = out["dir"]
        on_disk = {str(p.relative_to(d)) for p in Path(d).rglob("*") if p.is_file()}
        if hold:
            assert sorted(hold_rels) == [f"round-0/index/{key}.arrow", f"round-0/samples/{key}.arrow"]
            assert not on_disk & set(hold_rels) and set(out["held"]) == set(hold_rels)
            assert out["held_bytes"] == sum(b.sizes[rel] for rel in hold_rels) > 0
            assert all(out["held"][rel].tobytes() == b.data[rel].tobytes() for rel in hold_rels)
        else:
            assert set(b.sizes) <= on_disk and out["held"] == {} and out["held_bytes"] == 0
        with PackedDataset(d, held=out["held"]) as ds:
            if cpu is None:
                cpu = np.array(ds.cpu_init)
                assert np.array_equal(ds.gpu_cache, feats[stream["gpu"]])
            (sb,) = ds.superbatches
            assert sb.first_batch == stream["refs"][i].round_first_batch
            for (_, rec), n_id in zip(ds.batches(), sample_n_ids(stream["samples"][i])):
                x = ds.assemble(rec, cpu)
                assert np.array_equal(x, feats[n_id]), f"superbatch {i}, batch {rec.batch}"
                cpu[rec.insert_slot] = x[rec.insert_pos]
        shutil.rmtree(d)


def test_staged_segments_go_to_writeback_at_once(tmp_path: Path, stream: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the packed segments (read with direct I/O) are handed to the kernel's writeback when staged."""
    import os

    advised: list[str] = []
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, off, n, advice: advised.append(os.readlink(f"/proc/self/fd/{fd}")))
    b = _bundle(stream, 1)
    parts = sorted(rel for rel, n in b.sizes.items() if rel.endswith(".bin") and n)
    assert parts
    staged = Path(stage_bundle(b, tmp_path / "e0-s00001")["dir"])
    assert sorted(Path(p).name for p in advised) == sorted(Path(rel).name for rel in parts)
    assert all((staged / rel).stat().st_size == b.sizes[rel] for rel in b.sizes)


def test_shipping_verifies_every_file(tmp_path: Path, stream: dict) -> None:
    b = _bundle(stream, 1)
    part = next(rel for rel, n in b.sizes.items() if rel.endswith(".bin") and n)
    b.data[part] = b.data[part].copy()
    b.data[part][4097] ^= 1                                    # a flipped bit in transit
    with pytest.raises(ShipVerifyError, match=r"superbatch e0-s00001: checksum mismatch on arrival"):
        stage_bundle(b, tmp_path / "e0-s00001")
    assert not (tmp_path / "e0-s00001").exists() and list(tmp_path.iterdir()) == [], "nothing half-written is left"
    b = _bundle(stream, 1)
    b.sizes[part] += 1
    with pytest.raises(ShipVerifyError, match="the producer wrote"):
        stage_bundle(b, tmp_path / "e0-s00001")
    b = _bundle(stream, 1)
    index = next(rel for rel in held_files(b) if "/index/" in rel)
    b.data[index] = b.data[index].copy()
    b.data[index][100] ^= 1                                    # a held file is verified the same way
    with pytest.raises(ShipVerifyError, match=rf"{index}: superbatch e0-s00001: checksum mismatch on arrival"):
        stage_bundle(b, tmp_path / "e0-s00001", hold=held_files(b))
    assert list(tmp_path.iterdir()) == [], "nothing half-written is left"


def test_bundles_travel_through_an_fsspec_url(tmp_path: Path, stream: dict) -> None:
    url = f"file://{tmp_path}/shared/e0-s00002"
    b = _bundle(stream, 2, url=url)
    assert b.data is None and (tmp_path / "shared/e0-s00002/round-0/index/e0-s00002.arrow").is_file()
    inline = _bundle(stream, 2)
    out = stage_bundle(b, tmp_path / "scratch/e0-s00002")
    for rel in inline.sizes:
        assert (Path(out["dir"]) / rel).read_bytes() == inline.data[rel].tobytes()
    held = stage_bundle(b, tmp_path / "scratch2/e0-s00002", hold=held_files(b))
    assert held_files(b) and all(held["held"][rel].tobytes() == inline.data[rel].tobytes() for rel in held_files(b))
    drop_source(b)
    assert not (tmp_path / "shared/e0-s00002").exists()
    (tmp_path / "shared/e0-s00003").mkdir(parents=True)
    b = _bundle(stream, 3, url=f"file://{tmp_path}/shared/e0-s00003")
    shutil.rmtree(tmp_path / "shared/e0-s00003/round-0/index")
    with pytest.raises(ShipVerifyError, match="file missing at the source"):
        stage_bundle(b, tmp_path / "scratch/e0-s00003")
    with pytest.raises(ShipVerifyError, match="file missing at the source"):
        stage_bundle(b, tmp_path / "scratch/e0-s00003", hold=held_files(b))


def test_scratch_quota_is_a_hard_limit(tmp_path: Path) -> None:
    space = ScratchSpace(tmp_path / "scratch", quota=10_000)
    space.reserve("run/base", 6_000)
    space.reserve("run/e0-s00000", 3_000)
    with pytest.raises(ConfigError, match=r"^quota: staging run/e0-s00001 .* above its quota"):
        space.reserve("run/e0-s00001", 2_000)
    space.release("run/e0-s00000")
    space.reserve("run/e0-s00001", 2_000)
    assert space.usage()["peak"] == 9_000 and space.usage()["peak_staged"] == 2 and space.used == 8_000
    with pytest.raises(ConfigError, match="^quota"):
        ScratchSpace(tmp_path / "s2", quota=0)
    (tmp_path / "a").mkdir()
    (tmp_path / "a/f").write_bytes(b"x" * 100)
    (tmp_path / "a/g").hardlink_to(tmp_path / "a/f")
    assert disk_bytes(tmp_path / "a") == 100, "hard links count once"


def test_held_memory_has_a_budget(tmp_path: Path) -> None:
    """Index and samples are held in memory only while they fit; discard and release give the bytes back."""
    space = ScratchSpace(tmp_path / "scratch", hold_memory=10_000)
    assert space.try_hold("run/e0-s00000", 6_000) and space.try_hold("run/e0-s00001", 4_000)
    assert not space.try_hold("run/e0-s00002", 1), "over the budget: the caller stages them on disk"
    space.discard("run/e0-s00000", tmp_path / "scratch/run/never-written")
    assert space.memory == 4_000 and space.try_hold("run/e0-s00002", 5_000)
    space.release("run/e0-s00001")
    u = space.usage()
    assert (u["memory"], u["peak_memory"], u["hold_memory"]) == (5_000, 10_000, 10_000)
    assert not ScratchSpace(tmp_path / "s2").try_hold("x", 1), "no budget: nothing is held"
    assert ScratchSpace(tmp_path / "s3").try_hold("x", 0)
    with pytest.raises(ConfigError, match="^hold_memory"):
        ScratchSpace(tmp_path / "s4", hold_memory=-1)


def test_consumed_superbatches_are_deleted_in_the_background(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """discard returns at once; the bytes count until they are gone, and the next reserve waits for them."""
    space = ScratchSpace(tmp_path / "scratch", quota=10_000)
    d = tmp_path / "scratch/run/e0-s00000"
    (d / "round-0").mkdir(parents=True)
    (d / "round-0/part-00000.bin").write_bytes(b"x" * 4_000)
    space.reserve("run/e0-s00000", 4_000)
    gate, real = threading.Event(), shutil.rmtree
    monkeypatch.setattr(stream_ship.shutil, "rmtree", lambda path, **kw: (gate.wait(10), real(path, **kw)))
    space.discard("run/e0-s00000", d)
    assert not d.exists() and space.usage()["deleting"] == 1, "renamed aside at once, deleted later"
    assert space.used == 4_000 and disk_bytes(tmp_path / "scratch") == 4_000, "still on disk, still counted"
    reserved: list[ConfigError | None] = []

    def reserve() -> None:
        try:
            space.reserve("run/e0-s00001", 7_000)      # 11,000 bytes with the pending one: over the quota
            reserved.append(None)
        except ConfigError as e:
            reserved.append(e)

    t = threading.Thread(target=reserve)
    t.start()
    t.join(0.3)
    assert not reserved, "reserve waits for the pending deletion instead of failing or overshooting"
    gate.set()
    t.join(10)
    assert reserved == [None] and space.used == 7_000 and space.usage()["staged"] == ["run/e0-s00001"]
    assert space.drain(5) and disk_bytes(tmp_path / "scratch") == 0 and space.usage()["deleting"] == 0
    space.discard("run/e0-s00001", tmp_path / "scratch/run/never-written")
    assert space.used == 0, "nothing to delete: released at once"


def test_the_trainer_follows_the_stream_and_refuses_a_gap(tmp_path: Path, stream: dict) -> None:
    """Two superbatches through one trainer (loader.follow); a skipped superbatch is refused by name."""
    torch = pytest.importorskip("torch")
    from diskflow.operators.stream.train import StreamTrainConfig, StreamTrainer

    torch.set_num_threads(1)
    st = stream["store"]
    stage_bundle(pack_base(st.path, stream["gpu"], stream["cpu"]), tmp_path / "base")
    cfg = StreamTrainConfig(hidden=8, fanouts=F, batch_size=B, epochs=E, seed=SEED, threads=1)
    tr = StreamTrainer(cfg, "cpu", "fp")
    try:
        for i in (0, 1):        # the first with its index and samples on disk, the second with them held
            r = stream["refs"][i]
            b = _bundle(stream, i)
            staged = stage_bundle(b, tmp_path / r.key, base=tmp_path / "base", hold=held_files(b) if i else ())
            d = staged["dir"]
            out = tr.train(d, {"key": r.key, "index": i, "epoch": r.epoch, "first_batch": r.round_first_batch,
                               "epoch_batch": r.first_batch, "batches": r.num_batches, "epoch_end": False},
                           staged["held"])
            assert len(out["losses"]) == r.num_batches and all(np.isfinite(out["losses"]))
            tr.release()
            shutil.rmtree(d)
        r = stream["refs"][3]
        d = stage_bundle(_bundle(stream, 3), tmp_path / r.key, base=tmp_path / "base")["dir"]
        entry = {"key": r.key, "index": 3, "epoch": r.epoch, "first_batch": r.round_first_batch,
                 "epoch_batch": r.first_batch, "batches": r.num_batches, "epoch_end": True}
        with pytest.raises(InputError, match="stream position 3, the trainer expects 2"):
            tr.train(d, entry)
        tr.next_index = 3       # force it: the loader itself refuses a superbatch that does not continue its tier
        with pytest.raises(InputError, match=r"starts at batch 9, but the CPU tier stands before batch 6"):
            tr.train(d, entry)
        tr.next_index = 2
        state, arrays = tr.checkpoint()
        assert state["stream_index"] == 2 and (state["epoch"], state["batch"]) == (0, 6)
        assert np.array_equal(arrays["cpu_ids.npy"], stream["plans"][1].final_cache), "the tier the plan left"
        saved = {k: v.clone() for k, v in state["model"].items()}
        r = stream["refs"][2]
        d = stage_bundle(_bundle(stream, 2), tmp_path / r.key, base=tmp_path / "base")["dir"]
        tr.train(d, {"key": r.key, "index": 2, "epoch": r.epoch, "first_batch": r.round_first_batch,
                     "epoch_batch": r.first_batch, "batches": r.num_batches, "epoch_end": True})
        assert all(torch.equal(state["model"][k], saved[k]) for k in saved), "the checkpoint is a snapshot"
        assert not all(torch.equal(tr.model_state()[k], saved[k]) for k in saved), "while training went on"
        assert len(state["records"]) == 0 and len(tr.records) == 1
    finally:
        tr.close()
