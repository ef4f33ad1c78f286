"""`prepare` end to end on the sync scheduler: exact replay per pipeline flavour, read-once packing,
disk budgets, Belady vs static, per-stage caching and idempotence, and bad configs.

Every packed dataset is checked twice: by `verify(full=True)`, and independently by replaying it
with `PackedDataset.replay()` against `Store.read_features()[n_id]`, where the `n_id` are
re-sampled here with the sampling operator (so a packed dataset built from the wrong samples
fails too).
"""
from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import replace
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
from diskflow.flow.prepare import WORK_MARKER, PrepareConfig, PrepareResult, prepare
from diskflow.flow.prepare import cache as prepare_cache
from diskflow.operators.formats.packed import (
    SRC_CPU,
    SRC_DCACHE,
    SRC_GPU,
    SRC_PACKED,
    SRC_STORE,
    PackedDataset,
)
from diskflow.operators.formats.samples import read_n_ids
from diskflow.operators.formats.store import Store
from diskflow.operators.formats.threadbuffers import kept_thread_buffer_bytes
from diskflow.operators.formats.verify import verify
from diskflow.operators.prepare import pack as pack_mod
from diskflow.operators.prepare import writers as writers_mod
from diskflow.operators.prepare.plan import release_planner_scratch
from diskflow.operators.prepare.sampler_pool import idle_samplers
from diskflow.operators.prepare.superbatch import round_layout, sample_superbatch
from task_keys import TaskKeys

from diskflow.errors import ConfigError, InputError

BASE = {"fanouts": (5, 5), "batch_size": 192, "superbatch_size": 3, "epochs": 2, "seed": 3}
CPU_ROWS = 600          # CPU-tier rows on top of the staging reserve: far fewer than the rows a round touches
GPU_ROWS = 250


@pytest.fixture(autouse=True)
def _sync_scheduler():
    with dask.config.set(scheduler="sync"):
        yield


@pytest.fixture(scope="module")
def store(tiny_store: Path) -> Store:
    return Store(tiny_store)


@pytest.fixture(scope="module")
def staging(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> int:
    """The staging reserve of this round (3 batches of the largest sampled batch), from a throwaway run."""
    r = prepare(tiny_store, tmp_path_factory.mktemp("staging") / "out", PrepareConfig(**BASE, cpu_memory=1 << 30),
                quiet=True)
    return int(r.figures["staging_bytes"])


@pytest.fixture(scope="module")
def cpu_budget(staging: int, store: Store) -> int:
    return staging + CPU_ROWS * store.row_bytes


@pytest.fixture(scope="module")
def features(store: Store) -> np.ndarray:
    x = store.read_features()
    assert np.unique(x, axis=0).shape[0] == x.shape[0], "the check below needs distinct rows"
    return x


@pytest.fixture(scope="module")
def reference_n_ids(tiny_store: Path, store: Store, tmp_path_factory: pytest.TempPathFactory) -> list[np.ndarray]:
    """Every batch's n_id of the round, sampled here with the sampling operator, in round order."""
    d = tmp_path_factory.mktemp("ref-samples")
    out: list[np.ndarray] = []
    for ref in round_layout(store.split_ids("train").shape[0], BASE["batch_size"], BASE["superbatch_size"],
                            BASE["epochs"]):
        sample_superbatch(tiny_store, d / ref.filename, ref, BASE["batch_size"], BASE["fanouts"], BASE["seed"], 1)
        out.extend(read_n_ids(d / ref.filename))
    return out


@pytest.fixture(scope="module")
def flavours(tiny_store: Path, cpu_budget: int, store: Store, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, tuple[PrepareResult, PrepareConfig]]:
    """One prepared dataset per pipeline flavour, shared by the tests that only read them."""
    root = tmp_path_factory.mktemp("flavours")
    cfgs = {
        "belady": PrepareConfig(**BASE, cpu_memory=cpu_budget),
        "diskgnn": PrepareConfig(**BASE, pipeline="diskgnn", cpu_policy="static", cpu_memory=cpu_budget),
        "ginex": PrepareConfig(**BASE, pipeline="ginex", packing=False, cpu_memory=cpu_budget),
        "belady-segmented": PrepareConfig(**BASE, cpu_memory=cpu_budget, disk_budget=3 << 20),
        "belady-gpu": PrepareConfig(**BASE, cpu_memory=cpu_budget, device="cuda",
                                    gpu_memory=GPU_ROWS * store.row_bytes),
    }
    return {name: (prepare(tiny_store, root / name, cfg, quiet=True), cfg) for name, cfg in cfgs.items()}


# ----------------------------------------------------------------------------- helpers

def _files(path: Path) -> dict[str, Path]:
    return {str(p.relative_to(path)): p for p in sorted(path.rglob("*")) if p.is_file()}


def _stat(path: Path) -> dict[str, tuple[int, int]]:
    return {k: (p.stat().st_ino, p.stat().st_mtime_ns) for k, p in _files(path).items()}


def _assert_same_tree(a: Path, b: Path) -> None:
    fa, fb = _files(a), _files(b)
    assert sorted(fa) == sorted(fb)
    for k in fa:
        assert fa[k].read_bytes() == fb[k].read_bytes(), f"{k} differs"


def _on_disk(out: Path) -> int:
    """Bytes of the packed data really on disk: part files and disk-cache row files."""
    rnd = out / "round-0"
    return sum(p.stat().st_size for p in [*rnd.glob("part-*.bin"), *rnd.glob("dcache-*.bin")])


def _check_exact(out: Path, features: np.ndarray, n_ids: list[np.ndarray]) -> Counter:
    """verify(full=True), then an independent replay of every batch; returns the count of each source."""
    v = verify(out, full=True)
    assert v["batches"] == v["compared_batches"] == len(n_ids)
    assert v["compared_rows"] == sum(n.shape[0] for n in n_ids)
    sources: Counter = Counter()
    with PackedDataset(out) as ds:
        stored = [s.n_id for sb in ds.superbatches for s in ds.samples(sb.key)]
        assert len(stored) == len(n_ids)
        for a, b in zip(stored, n_ids):
            np.testing.assert_array_equal(a, b)   # the packed dataset carries the round's own samples
        replayed = 0
        for (batch, feats), n_id in zip(ds.replay(), n_ids):
            assert batch == replayed
            assert feats.tobytes() == features[n_id].tobytes(), f"batch {batch} is not features[n_id]"
            replayed += 1
        assert replayed == len(n_ids)
        for _, r in ds.batches():
            sources.update(dict(zip(*np.unique(r.src, return_counts=True))))
    return sources


# ----------------------------------------------------------------------------- 1. exact replay

@pytest.mark.parametrize("name", ["belady", "diskgnn", "ginex", "belady-segmented", "belady-gpu"])
def test_replay_is_bit_exact_for_every_batch(name: str, flavours: dict, features: np.ndarray,
                                             reference_n_ids: list[np.ndarray]) -> None:
    r, cfg = flavours[name]
    assert not r.skipped
    f = r.figures
    src = _check_exact(r.path, features, reference_n_ids)
    # the figures are the index's own counts
    assert src[SRC_GPU] == f["gpu_hits"] and src[SRC_CPU] == f["cpu_hits"]
    assert src[SRC_PACKED] + src[SRC_DCACHE] + src[SRC_STORE] == f["misses"]
    assert sum(src.values()) == f["accesses"]
    assert f["cpu_hits"] > 0 and f["misses"] > 0
    if name == "ginex":
        assert src[SRC_STORE] == f["misses"] and f["disk_used_bytes"] == 0
    else:
        assert src[SRC_STORE] == 0 and src[SRC_PACKED] == f["packed_rows"]
    if name == "belady-segmented":
        assert f["dcache_rows"] > 0 and src[SRC_DCACHE] == f["dcache_rows"]
        assert f["segment_size"] is not None and f["segment_size"] >= 1
        assert f["disk_used_bytes"] <= cfg.disk_budget
        assert len(list((r.path / "round-0").glob("dcache-*.bin"))) >= 1
    else:
        assert src[SRC_DCACHE] == 0 and "segment_size" not in f
    if name == "belady-gpu":
        assert f["gpu_rows"] == GPU_ROWS and f["gpu_hits"] > 0
    else:
        assert f["gpu_rows"] == 0 and f["gpu_hits"] == 0
    if name == "diskgnn":
        assert f["inserts"] == 0          # a static CPU tier never changes
    else:
        assert f["inserts"] > 0


def test_replay_catches_a_flipped_byte(flavours: dict, features: np.ndarray, reference_n_ids: list[np.ndarray],
                                       tmp_path: Path) -> None:
    """The exactness check above can fail: a flipped byte in a part file is caught by both checks."""
    import shutil

    from diskflow.errors import InputError

    out = tmp_path / "copy"
    shutil.copytree(flavours["belady"][0].path, out)
    part = out / "round-0" / "part-00002.bin"
    data = bytearray(part.read_bytes())
    data[8] ^= 0x40
    part.write_bytes(bytes(data))
    with pytest.raises(InputError, match="part-00002.bin.*checksum mismatch"):
        verify(out, full=True)
    with PackedDataset(out) as ds, pytest.raises(AssertionError, match="is not features"):
        for (batch, feats), n_id in zip(ds.replay(check_crc=False), reference_n_ids):
            assert feats.tobytes() == features[n_id].tobytes(), f"batch {batch} is not features[n_id]"


# ----------------------------------------------------------------------------- 2. read-once packing

def test_packing_reads_each_raw_byte_once_and_writes_each_packed_byte_once(
        tiny_store: Path, store: Store, cpu_budget: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: Counter = Counter()
    written = [0]
    real_read, real_write = pack_mod._shard_rows, writers_mod._write_all

    def read_shard(shard, *a, **kw):      # a pack task's one take of its shard (read, or mapped when read ahead)
        reads[shard.index] += 1
        return real_read(shard, *a, **kw)

    def write_all(fd, view, path, offset=None):
        if Path(path).name.startswith("part-"):     # a part file's write, not a tier rows file's
            written[0] += view.nbytes
        return real_write(fd, view, path, offset)

    def no_feature_reads(*a, **kw):
        raise AssertionError("prepare read feature rows outside the pack tasks")

    monkeypatch.setattr(pack_mod, "_shard_rows", read_shard)
    monkeypatch.setattr(writers_mod, "_write_all", write_all)
    for name in ("gather", "read_features", "shard_array"):
        monkeypatch.setattr(Store, name, no_feature_reads)
    for cfg in (PrepareConfig(**BASE, cpu_memory=cpu_budget),
                PrepareConfig(**BASE, cpu_memory=cpu_budget, disk_budget=3 << 20)):
        reads.clear()
        written[0] = 0
        out = tmp_path / f"out-{cfg.disk_budget}"
        f = prepare(tiny_store, out, cfg, quiet=True).figures
        assert dict(reads) == {p: 1 for p in range(len(store.shards))}, "every shard read exactly once"
        assert f["raw_bytes_read"] == store.feature_bytes == store.num_nodes * store.row_bytes
        assert f["packed_bytes_written"] == f["packed_rows"] * store.row_bytes
        assert f["packed_rows"] + f["dcache_rows"] == f["misses"]
        parts = sorted((out / "round-0").glob("part-*.bin"))
        assert written[0] == sum(p.stat().st_size for p in parts) == f["packed_bytes"], \
            "the part files are written once, with nothing rewritten"
        with PackedDataset(out) as ds:
            seg_rows = np.stack([r.seg_rows for _, r in ds.batches()])
            last_batches = ds.superbatches[-1].batches
        assert int(seg_rows.sum()) == f["packed_rows"]
        pages = -(-(seg_rows * store.row_bytes) // 4096) * 4096
        assert [p.stat().st_size for p in parts] == pages.sum(axis=0).tolist()
        # the read-ahead (1 GiB by default) holds the tiny store: without a disk-cache layout to wait for,
        # every superbatch but the last is written while the chain plans, and the pack phase appends the rest
        if cfg.disk_budget is None:
            assert f["early_rows"] == int(seg_rows[:-last_batches].sum()) > 0
        else:
            assert f["early_rows"] == 0
        assert not (Path(str(out) + ".work") / "early").exists()


# ----------------------------------------------------------------------------- 3. disk budgets

def test_disk_budget_is_never_exceeded(tiny_store: Path, cpu_budget: int, features: np.ndarray,
                                       reference_n_ids: list[np.ndarray], tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="^disk_budget") as e:
        prepare(tiny_store, out, PrepareConfig(**BASE, cpu_memory=cpu_budget, disk_budget=1 << 20), quiet=True)
    assert not (out / "manifest.json").exists() and not out.exists()
    assert not list(tmp_path.glob(".out.tmp-*")), "no staging directory left behind"
    m = re.search(r"smallest workable budget is (\d+) bytes", str(e.value))
    assert m, str(e.value)
    smallest = int(m.group(1))
    m = re.search(r"packing every miss needs (\d+) bytes", str(e.value))
    assert m, str(e.value)
    unconstrained = int(m.group(1))
    assert 1 << 20 < smallest < unconstrained

    with pytest.raises(ConfigError, match="^disk_budget"):
        prepare(tiny_store, out, PrepareConfig(**BASE, cpu_memory=cpu_budget, disk_budget=smallest - 1), quiet=True)
    used = []
    step = (unconstrained - smallest) // 3
    for budget in (smallest, smallest + step, smallest + 2 * step, unconstrained, None):
        r = prepare(tiny_store, out, PrepareConfig(**BASE, cpu_memory=cpu_budget, disk_budget=budget), quiet=True)
        f = r.figures
        assert f["disk_used_bytes"] == _on_disk(out) == f["packed_bytes"] + f["dcache_bytes"]
        if budget is not None:
            assert f["disk_used_bytes"] <= budget
        assert (f["dcache_rows"] > 0) == (budget is not None and budget < unconstrained)
        verify(out, full=True)
        used.append(f["disk_used_bytes"])
    assert used[0] < used[-1], "a tight budget really shrinks the packed data"
    _check_exact(out, features, reference_n_ids)   # the last one (no budget) replays too

    # the search starts from a padding bound, but packing alone is kept whenever its exact bytes fit
    packed = used[-1]
    assert packed < unconstrained
    f = prepare(tiny_store, out, PrepareConfig(**BASE, cpu_memory=cpu_budget, disk_budget=packed), quiet=True).figures
    assert f["dcache_rows"] == 0 and "segment_size" not in f and f["disk_used_bytes"] == packed
    f = prepare(tiny_store, out, PrepareConfig(**BASE, cpu_memory=cpu_budget, disk_budget=packed - 1),
                quiet=True).figures
    assert f["dcache_rows"] > 0 and f["disk_used_bytes"] == _on_disk(out) <= packed - 1
    verify(out, full=True)


def test_round_without_misses_fits_any_disk_budget(tiny_store: Path, store: Store, staging: int, features: np.ndarray,
                                                   reference_n_ids: list[np.ndarray], tmp_path: Path) -> None:
    """A GPU tier holding every row leaves nothing to pack, so even a one-page disk budget works.

    The tier holds every row the round reads, no more: the rest of the budget stays unused."""
    cfg = PrepareConfig(**BASE, device="cuda", gpu_memory=store.feature_bytes, cpu_memory=staging, disk_budget=4096)
    r = prepare(tiny_store, tmp_path / "out", cfg, quiet=True)
    f = r.figures
    read = np.unique(np.concatenate(reference_n_ids)).size
    assert read < store.num_nodes and f["gpu_rows"] == read
    assert f["gpu_hits"] == f["accesses"] and f["misses"] == 0
    assert f["disk_used_bytes"] == _on_disk(r.path) == 0 and f["dcache_rows"] == 0
    src = _check_exact(r.path, features, reference_n_ids)
    assert set(src) == {SRC_GPU}


def test_impossible_budget_leaves_a_previous_output_untouched(tiny_store: Path, cpu_budget: int, tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepare(tiny_store, out, PrepareConfig(**BASE, cpu_memory=cpu_budget), quiet=True)
    before = {k: p.read_bytes() for k, p in _files(out).items()}
    with pytest.raises(ConfigError, match="^disk_budget"):
        prepare(tiny_store, out, PrepareConfig(**BASE, cpu_memory=cpu_budget, disk_budget=1 << 20), quiet=True)
    assert {k: p.read_bytes() for k, p in _files(out).items()} == before
    assert not list(tmp_path.glob(".out.tmp-*"))
    verify(out, full=True)


def test_a_failed_pack_phase_leaves_no_part_files_begun_while_planning(
        tiny_store: Path, cpu_budget: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import diskflow.flow.prepare.phases as prep_mod

    def dying(*a, **kw):
        raise RuntimeError("pack task lost")

    monkeypatch.setattr(prep_mod, "pack_shard", dying)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="pack task lost"):
        prepare(tiny_store, out, PrepareConfig(**BASE, cpu_memory=cpu_budget), quiet=True)
    work = Path(str(out) + ".work")
    assert work.is_dir() and sorted(work.glob("plans-*"))          # the finished stages stay cached ...
    assert not (work / "early").exists() and not (work / "route").exists()   # ... begun part files do not
    assert not out.exists() and not list(tmp_path.glob(".out.tmp-*"))
    monkeypatch.undo()
    f = prepare(tiny_store, out, PrepareConfig(**BASE, cpu_memory=cpu_budget), quiet=True).figures
    assert f["early_rows"] == 0                       # the plans came from the cache: nothing routed while planning
    verify(out, full=True)


# ----------------------------------------------------------------------------- 4. Belady vs static

def test_belady_misses_no_more_than_static_at_equal_cpu_budget(flavours: dict) -> None:
    (b, _), (s, _) = flavours["belady"], flavours["diskgnn"]
    fb, fs = b.figures, s.figures
    for a, c in zip(_files(b.path / "round-0" / "samples").values(), _files(s.path / "round-0" / "samples").values()):
        assert a.read_bytes() == c.read_bytes(), "both plans must be over the same samples"
    assert fb["accesses"] == fs["accesses"] and fb["cpu_rows"] == fs["cpu_rows"] == CPU_ROWS
    assert fb["misses"] <= fs["misses"]
    assert fb["misses"] + fb["cpu_hits"] == fs["misses"] + fs["cpu_hits"] == fb["accesses"]
    assert fb["packed_bytes_written"] <= fs["packed_bytes_written"]


# ----------------------------------------------------------------------------- 5. caching and idempotence

def test_rerun_skips_and_changed_budgets_redo_only_what_depends_on_them(
        tiny_store: Path, cpu_budget: int, store: Store, tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "out.work"
    a = PrepareConfig(**BASE, cpu_memory=cpu_budget)
    with TaskKeys() as k:
        r = prepare(tiny_store, out, a, quiet=True)
    assert not r.skipped
    assert {"sample", "count", "count-merge", "tiers-gpu", "tiers", "tiers-trace", "plan", "route", "pack", "index"} <= k.groups()

    def stage(name: str) -> Path:
        (d,) = work.glob(f"{name}-*")
        return d

    # same config: nothing runs, nothing is touched
    before = {**_stat(out), **{f"work/{x}": v for x, v in _stat(work).items()}}
    with TaskKeys() as k:
        r = prepare(tiny_store, out, a, quiet=True)
    assert r.skipped and k.keys == []
    assert r.figures == read_figures(out)
    assert {**_stat(out), **{f"work/{x}": v for x, v in _stat(work).items()}} == before

    # a new disk budget: layout + pack again, no sampling or planning
    samples, plans = _stat(stage("samples")), _stat(stage("plans"))
    b = replace(a, disk_budget=3 << 20)
    with TaskKeys() as k:
        r = prepare(tiny_store, out, b, quiet=True)
    assert not r.skipped and r.figures["dcache_rows"] > 0
    assert k.groups() == {"search", "route", "pack", "index"}
    assert _stat(stage("samples")) == samples and _stat(stage("plans")) == plans
    _assert_same_tree(out, prepare(tiny_store, tmp_path / "fresh-b", b, quiet=True).path)

    # a new CPU budget: re-plan (and re-pack), but no re-sampling
    c = replace(b, cpu_memory=cpu_budget + 200 * store.row_bytes)
    with TaskKeys() as k:
        r = prepare(tiny_store, out, c, quiet=True)
    assert not r.skipped and r.figures["cpu_rows"] == CPU_ROWS + 200
    assert not {"sample", "count", "count-merge"} & k.groups() and {"tiers", "plan", "pack"} <= k.groups()
    assert _stat(stage("samples")) == samples and _stat(stage("plans")) != plans
    _assert_same_tree(out, prepare(tiny_store, tmp_path / "fresh-c", c, quiet=True).path)

    # back to the first config: a byte-identical result again
    prepare(tiny_store, out, a, quiet=True)
    _assert_same_tree(out, prepare(tiny_store, tmp_path / "fresh-a", a, quiet=True).path)
    assert sorted(p.name.split("-")[0] for p in work.iterdir() if p.name != WORK_MARKER) == ["plans", "samples"], \
        "no stale intermediates"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh-a", "fresh-a.work", "fresh-b", "fresh-b.work",
                                                         "fresh-c", "fresh-c.work", "out", "out.work"]


def test_cache_files_are_written_under_names_the_orphan_cleaner_knows_and_fsynced(
        tiny_store: Path, cpu_budget: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file prepare renames into its cache (``OUT.work``) was written under a temporary name that the
    orphan cleaner removes after a crash; all but the run's scratch (the cache marker, the routes) were
    fsynced before the rename."""
    synced: set[str] = set()
    renamed: list[tuple[Path, Path]] = []
    fsync, rename = os.fsync, os.replace

    def recording_fsync(fd: int) -> None:
        synced.add(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    def recording_replace(src: Any, dst: Any) -> None:
        renamed.append((Path(src), Path(dst)))
        rename(src, dst)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    prepare(tiny_store, tmp_path / "out", PrepareConfig(**BASE, cpu_memory=cpu_budget, disk_budget=3 << 20), quiet=True)
    work = (tmp_path / "out.work").resolve()
    cached = [(src, dst) for src, dst in renamed if work in dst.resolve().parents]
    assert {"tiers.npz", "layout.pkl"} <= {dst.name for _, dst in cached}
    for src, dst in cached:
        assert fnmatch(src.name, ".*.tmp-*"), f"{dst.name} was written as {src.name}, a name the orphan cleaner misses"
        if dst.name != WORK_MARKER and dst.parent.name != "route":
            assert str(src.parent.resolve() / src.name) in synced, f"{dst.name} was renamed into place unsynced"


def test_a_cache_manifest_gone_after_writing_is_an_input_error(tiny_store: Path, cpu_budget: int, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage's manifest that cannot be read back right after it was written stops prepare with an InputError
    naming it (an explicit check, not an assert that ``python -O`` removes)."""
    monkeypatch.setattr(prepare_cache, "read_manifest", lambda directory: None)
    with pytest.raises(InputError, match="missing right after it was written") as e:
        prepare(tiny_store, tmp_path / "out", PrepareConfig(**BASE, cpu_memory=cpu_budget), quiet=True)
    assert Path(e.value.path).name == "manifest.json" and Path(e.value.path).parent.name.startswith("samples-")


def read_figures(out: Path) -> dict[str, Any]:
    import json

    return json.loads((out / "manifest.json").read_text())["figures"]


def test_force_rebuilds_identically(flavours: dict, tiny_store: Path, tmp_path: Path) -> None:
    import shutil

    src, cfg = flavours["belady-segmented"]
    out = tmp_path / "out"
    shutil.copytree(src.path, out)
    with TaskKeys() as k:
        r = prepare(tiny_store, out, cfg, force=True, quiet=True)
    assert not r.skipped and {"sample", "pack"} <= k.groups()
    _assert_same_tree(out, src.path)
    assert idle_samplers() == 0          # the samplers its tasks passed on to each other are let go
    assert kept_thread_buffer_bytes() == 0, "and the buffers its pack tasks kept for their threads"
    assert release_planner_scratch() == 0, "and the planner's scratch"


# ----------------------------------------------------------------------------- 6. bad configs

@pytest.mark.parametrize("change, option", [
    ({"superbatch_size": 0}, "superbatch_size"),
    ({"fanouts": ()}, "fanouts"),
    ({"batch_size": 0}, "batch_size"),
    ({"epochs": 0}, "epochs"),
    ({"disk_budget": 0}, "disk_budget"),
    ({"packing": False, "disk_budget": 1 << 20}, "disk_budget"),   # Ginex packs nothing
    ({"cpu_policy": "lru"}, "cpu_policy"),
    ({"gpu_memory": 1 << 20}, "gpu_memory"),            # a GPU tier on a CPU-only run
    ({"device": "tpu"}, "device"),
    ({"staging_batches": 0}, "staging_batches"),
    ({"readahead": -1}, "readahead"),
], ids=lambda x: x if isinstance(x, str) else "-".join(map(str, x)))
def test_bad_config_fails_before_any_work(change: dict, option: str, tiny_store: Path, cpu_budget: int,
                                          tmp_path: Path) -> None:
    out = tmp_path / "out"
    with TaskKeys() as k, pytest.raises(ConfigError) as e:
        prepare(tiny_store, out, replace(PrepareConfig(**BASE, cpu_memory=cpu_budget), **change), quiet=True)
    assert str(e.value).startswith(f"{option}: "), str(e.value)
    assert k.keys == [], "a config that cannot work is rejected before sampling"
    assert list(tmp_path.iterdir()) == []


def test_cpu_budget_below_the_staging_reserve(tiny_store: Path, staging: int, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"^cpu_memory: .*staging") as e:
        prepare(tiny_store, out, PrepareConfig(**BASE, cpu_memory=staging - 1), quiet=True)
    assert f"{staging / 2**20:.2f} MiB" in str(e.value), "the message names the reserve to give"
    assert not out.exists()
    # the plan stage is not left looking finished; the finished sampling stays reusable
    work = tmp_path / "out.work"
    assert not [d for d in work.glob("plans-*") if (d / "manifest.json").exists()]
    with TaskKeys() as k:
        prepare(tiny_store, out, PrepareConfig(**BASE, cpu_memory=staging), quiet=True)
    assert "sample" not in k.groups()
    verify(out, full=True)


def test_prepare_cli_runs_and_refuses_a_bad_readahead(tiny_store: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from diskflow.cli import main

    args = ["prepare", "belady", "--dataset", str(tiny_store), "--fanouts", "4,3", "--batch-size", "64",
            "--superbatch-size", "4", "--workers", "1", "--cpu-memory", "16MiB"]
    assert main([*args, "--out", str(tmp_path / "bad"), "--readahead", "lots"]) == 2
    assert "--readahead" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    assert main([*args, "--out", str(tmp_path / "bad"), "--staging-piece", "4KiB"]) == 2
    err = capsys.readouterr().err
    assert "--staging-piece: must be at least 64.00 KiB" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()
    assert main([*args, "--out", str(tmp_path / "packed"), "--readahead", "25%", "--staging-piece", "64KiB"]) == 0
    assert "prepared belady" in capsys.readouterr().out
    assert json.loads((tmp_path / "packed" / "manifest.json").read_text())["config"]["staging_piece"] == 64 << 10
    assert verify(tmp_path / "packed", full=True)["compared_batches"] > 0
