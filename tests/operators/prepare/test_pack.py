"""Routing, batched packing and plan replay: read-once, bit-exact, and the naive baseline agrees."""
from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import pytest
from diskflow.bench.naivepack import pack_naive
from diskflow.native.constants import ALIGN
from diskflow.operators.formats.packed import (
    ROUND_DIR,
    SRC_CPU,
    SRC_DCACHE,
    SRC_GPU,
    SRC_PACKED,
    PackedDataset,
    part_name,
)
from diskflow.operators.formats.plan import SRC_MISS, BatchPlan
from diskflow.operators.formats.store import Store
from diskflow.operators.prepare.diskcache import build_layout
from diskflow.operators.prepare.pack import RowTarget, pack_shard
from diskflow.operators.prepare.route import RouteFile, route_superbatch, segment_offsets
from mounts import skip_where_in_memory
from packed_rounds import (
    Round,
    build_packed,
    sample_round,
    tight_layout,
)

from diskflow.errors import InputError


@pytest.fixture(scope="module")
def rnd(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Round:
    return sample_round(tiny_store, tmp_path_factory.mktemp("round"))


@pytest.fixture(scope="module", params=["packed-only", "disk-cache"])
def packed(request: pytest.FixtureRequest, rnd: Round, tmp_path_factory: pytest.TempPathFactory):
    store = Store(rnd.store)
    if request.param == "packed-only":
        layout = build_layout(rnd.misses(), store.row_bytes, 1 << 40, len(store.shards) * (ALIGN - 1))
        assert layout.segment_size is None
    else:
        layout = tight_layout(rnd, store.row_bytes, len(store.shards))
        assert layout.segment_size is not None and sum(len(c) for c in layout.cache_nodes) > 0
    out = tmp_path_factory.mktemp(request.param)
    return out, layout, build_packed(rnd, out, layout)


# ---------------------------------------------------------------------------- unit tests

def test_segment_offsets_are_aligned_and_contiguous() -> None:
    rows = np.array([[3, 0], [0, 50], [22, 1], [0, 0]], dtype=np.int64)
    off, size = segment_offsets(rows, row_bytes=188)
    assert np.array_equal(off[:, 0], [0, 4096, 4096, 12288])      # 3 rows -> 1 page; 22 rows (4136 B) -> 2 pages
    assert np.array_equal(off[:, 1], [0, 0, 12288, 16384])        # 50 rows = 9400 B -> 3 pages
    assert np.array_equal(size, [12288, 16384])
    assert (off % ALIGN == 0).all()


def test_route_translates_misses_to_shard_major_packed_rows(tmp_path: Path) -> None:
    # shard_rows 10: node 25 in shard 2, 3 in shard 0, 17 in shard 1, 4 in shard 0, 40 in shard 4.
    n_id = np.array([7, 25, 3, 17, 9, 4, 40], dtype=np.int64)
    src = np.array([SRC_GPU, SRC_MISS, SRC_MISS, SRC_MISS, SRC_CPU, SRC_MISS, SRC_MISS], dtype=np.uint8)
    idx = np.array([0, 0, 1, 2, 5, 3, 4], dtype=np.int64)
    plan = BatchPlan(src, idx, np.array([1], np.int64), np.array([2], np.int64))
    all_miss = BatchPlan(np.full(2, SRC_MISS, np.uint8), np.arange(2, dtype=np.int64), np.zeros(0, np.int64),
                         np.zeros(0, np.int64))
    out = route_superbatch("e0-s00003", [n_id, np.array([41, 1])], [plan, all_miss], None, 12, 10, 5,
                           tmp_path / "r.npz")
    assert out["seg_rows"].tolist() == [[2, 1, 1, 0, 1], [1, 0, 0, 0, 1]]
    route = RouteFile(out["path"])
    assert (route.key, route.epoch, route.first_batch) == ("e0-s00003", 0, 12)
    assert [route.shard_ids(p).tolist() for p in range(5)] == [[3, 4, 1], [17], [25], [], [40, 41]]
    r0, r1 = route.records(np.zeros((2, 5), np.int64), np.zeros((2, 5), np.int64))
    packed_order = np.array([3, 4, 17, 25, 40])                    # shard-major, miss order within a shard
    assert np.array_equal(r0.src, [SRC_GPU, SRC_PACKED, SRC_PACKED, SRC_PACKED, SRC_CPU, SRC_PACKED, SRC_PACKED])
    assert np.array_equal(packed_order[r0.idx[r0.src == SRC_PACKED]], n_id[src == SRC_MISS])
    assert r0.idx[0] == 0 and r0.idx[4] == 5
    assert (r0.insert_pos.tolist(), r0.insert_slot.tolist()) == ([1], [2])
    assert np.array_equal(np.array([1, 41])[r1.idx], [41, 1]) and r1.batch == 13 and r1.dcache == -1
    route.close()


def test_route_rejects_a_plan_that_does_not_cover_the_sample(tmp_path: Path) -> None:
    plan = BatchPlan(np.zeros(3, np.uint8), np.zeros(3, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    with pytest.raises(ValueError, match="batch 0"):
        route_superbatch("e0-s00000", [np.arange(4)], [plan], None, 0, 10, 1, tmp_path / "r.npz")
    assert not (tmp_path / "r.npz").exists()


# ---------------------------------------------------------------------------- a real round

def test_pack_reads_each_shard_once_and_writes_each_packed_byte_once(packed, rnd: Round) -> None:
    out, layout, res = packed
    store = Store(rnd.store)
    rows_per_shard = res["seg_rows"].sum(axis=0)
    for p, r in enumerate(res["pack"]):
        assert r["bytes_read"] == store.shards[p].rows * store.row_bytes          # the shard, once
        assert r["bytes_written"] == rows_per_shard[p] * store.row_bytes          # its packed rows, once
        assert r["file_bytes"] == res["files"]["parts"][p]["bytes"] == os.path.getsize(out / ROUND_DIR / part_name(p))
    # every GPU, live CPU and disk-cache row is written by exactly one shard's task
    live = rnd.gpu_ids.shape[0] + int((rnd.cpu_ids >= 0).sum()) + sum(len(c) for c in (layout.cache_nodes or []))
    assert sum(r["target_bytes_written"] for r in res["pack"]) == live * store.row_bytes
    assert int(res["seg_rows"].sum()) == sum(int((layout.in_cache[i] == 0).sum()) for i in range(len(layout.in_cache)))
    assert not list(out.rglob(".*.tmp-*"))


def test_replay_is_bit_exact_on_every_batch(packed, rnd: Round) -> None:
    out, layout, _ = packed
    store = Store(rnd.store)
    ds = PackedDataset(out)
    n_ids = [n for ns in rnd.n_ids for n in ns]
    seen = np.zeros(4, dtype=np.int64)
    count = 0
    for (b, feats), (_, r) in zip(ds.replay(), ds.batches()):
        assert b == count
        assert feats.tobytes() == store.gather(n_ids[b]).tobytes()
        seen += np.bincount(r.src, minlength=4)
        count += 1
    assert count == ds.num_batches == len(n_ids)
    assert seen[SRC_GPU] > 0 and seen[SRC_CPU] > 0 and seen[SRC_PACKED] > 0       # every tier is exercised
    assert (seen[SRC_DCACHE] > 0) == (layout.segment_size is not None)
    # the CPU tier really changes over the round (inserts) and is read after being changed
    assert sum(p.insert_pos.shape[0] for ps in rnd.plans for p in ps) > 0
    ds.close()


def test_naive_packing_writes_identical_part_files(packed, rnd: Round, tmp_path: Path) -> None:
    out, layout, res = packed
    store = Store(rnd.store)
    sbs = [(r.key, r.round_first_batch, n, p) for r, n, p in zip(rnd.refs, rnd.n_ids, rnd.plans)]
    routes = [route_superbatch(k, n, p, layout, f, store.shard_rows, len(store.shards), tmp_path / f"{k}.npz")
              for k, f, n, p in sbs]
    offsets, _ = segment_offsets(np.concatenate([r["seg_rows"] for r in routes]), store.row_bytes)
    naive = pack_naive(rnd.store, [r["path"] for r in routes], offsets, tmp_path / "naive")
    for p in range(len(store.shards)):
        a = (out / ROUND_DIR / part_name(p)).read_bytes()
        b = (tmp_path / "naive" / part_name(p)).read_bytes()
        assert a == b, f"part {p} differs"
        assert np.array_equal(naive["crc"][:, p], res["pack"][p]["crc"])
    assert naive["rows"] == int(res["seg_rows"].sum())


def test_killed_pack_task_leaves_no_part_file(rnd: Round, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(rnd.store)
    sb = [(r.key, r.round_first_batch, n, p) for r, n, p in zip(rnd.refs, rnd.n_ids, rnd.plans)]
    routes = [route_superbatch(k, n, p, None, f, store.shard_rows, len(store.shards), tmp_path / f"{k}.npz")
              for k, f, n, p in sb]
    offsets, _ = segment_offsets(np.concatenate([r["seg_rows"] for r in routes]), store.row_bytes)
    import diskflow.operators.prepare.writers as writers_mod

    calls = {"n": 0}
    real = writers_mod._write_all

    def dying(fd, view, path, offset=None):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("worker killed")
        real(fd, view, path, offset)

    monkeypatch.setattr(writers_mod, "_write_all", dying)
    with pytest.raises(KeyboardInterrupt):
        pack_shard(rnd.store, 1, [r["path"] for r in routes], offsets, tmp_path / "part-00001.bin", write_buffer=8192)
    # the failed second write stops the task at its next wait: at most the writes in flight after it were begun
    assert 2 <= calls["n"] <= 1 + writers_mod.WRITES_IN_FLIGHT
    assert not (tmp_path / "part-00001.bin").exists() and not list(tmp_path.glob(".part-*"))


def test_pack_errors_name_the_file(rnd: Round, tmp_path: Path) -> None:
    store = Store(rnd.store)
    k, f, n, p = rnd.refs[0].key, 0, rnd.n_ids[0], rnd.plans[0]
    route = route_superbatch(k, n, p, None, f, store.shard_rows, len(store.shards), tmp_path / "r.npz")
    offsets, _ = segment_offsets(route["seg_rows"], store.row_bytes)
    with pytest.raises(InputError, match="missing.npz"):
        pack_shard(rnd.store, 0, [tmp_path / "missing.npz"], offsets, tmp_path / "part.bin")
    Path(route["path"]).write_bytes(Path(route["path"]).read_bytes()[:100])
    with pytest.raises(InputError, match="r.npz"):
        pack_shard(rnd.store, 0, [route["path"]], offsets, tmp_path / "part.bin")
    target = RowTarget(tmp_path / "absent.bin", np.array([0, 1]), 0)
    route = route_superbatch(k, n, p, None, f, store.shard_rows, len(store.shards), tmp_path / "r2.npz")
    with pytest.raises(InputError, match="absent.bin"):
        pack_shard(rnd.store, 0, [route["path"]], offsets, tmp_path / "part.bin", tier_targets=[target])
    assert not list(tmp_path.glob(".*.tmp-*"))


def test_all_miss_round_without_tiers_replays_exactly(rnd: Round, tmp_path: Path) -> None:
    # hand-made all-miss plans, no GPU or CPU tier, packed only: every row comes from a part file
    plans = [[BatchPlan(np.full(n.shape[0], SRC_MISS, np.uint8), np.arange(n.shape[0], dtype=np.int64),
                        np.zeros(0, np.int64), np.zeros(0, np.int64)) for n in ns] for ns in rnd.n_ids]
    bare = Round(rnd.store, rnd.samples, rnd.refs, rnd.n_ids, plans, np.zeros(0, np.int64), np.zeros(0, np.int64))
    res = build_packed(bare, tmp_path / "p", None)
    store = Store(rnd.store)
    n_ids = [n for ns in rnd.n_ids for n in ns]
    assert int(res["seg_rows"].sum()) == sum(n.shape[0] for n in n_ids)
    with PackedDataset(tmp_path / "p") as ds:
        assert ds.gpu_cache.shape == (0, store.feature_dim) and ds.cpu_init.shape == (0, store.feature_dim)
        for b, feats in ds.replay():
            assert feats.tobytes() == store.gather(n_ids[b]).tobytes()


def test_warm_shards_reads_whole_shards_within_the_budget(tiny_store: Path) -> None:
    import threading

    from diskflow.operators.formats.store import Store
    from diskflow.operators.prepare.pack import warm_shards

    store = Store(tiny_store)
    shard = store.shards[0].rows * store.row_bytes
    assert warm_shards(tiny_store, 0) == 0
    assert warm_shards(tiny_store, shard - 1) == 0                 # never a partial shard
    assert warm_shards(tiny_store, 2 * shard + 5) == 2 * shard
    everything = sum(s.rows for s in store.shards) * store.row_bytes
    assert warm_shards(tiny_store, 1 << 40) == everything
    stop = threading.Event()
    stop.set()
    assert warm_shards(tiny_store, 1 << 40, stop) == 0


def _cached_pages(path: Path) -> np.ndarray:
    """Which pages of `path` the page cache holds (mincore through a shared read-only map)."""
    import ctypes
    import mmap

    size = path.stat().st_size
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        vec = (ctypes.c_ubyte * (-(-size // mmap.PAGESIZE)))()
        assert libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) == 0
        libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))
    finally:
        os.close(fd)
    return np.frombuffer(bytes(vec), np.uint8) & 1


@pytest.mark.parametrize("head", [0, 100, 4096 + 24])
def test_shard_read_mixes_page_cache_and_direct_reads(tmp_path: Path, head: int) -> None:
    """A shard at any byte offset, its first half cached and the rest not: the bytes come back exact, the
    cached half from the cache, the rest with O_DIRECT (which leaves the page cache untouched)."""
    skip_where_in_memory(tmp_path, "page-cache residency")
    from diskflow.operators.formats.store import FeatureShard
    from diskflow.operators.prepare.pack import _read_shard

    rows, dim = 3000, 24                              # 288,000 bytes of float32: not a whole number of pages
    feats = np.random.default_rng(head).standard_normal((rows, dim)).astype(np.float32)
    path = tmp_path / "shard.bin"
    path.write_bytes(b"\x07" * head + feats.tobytes() + b"\x09" * 333)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead past what is read
        half = head + feats.nbytes // 2
        os.pread(fd, half, 0)                            # the first half into the page cache
    finally:
        os.close(fd)
    before = _cached_pages(path)
    shard = FeatureShard(0, path, 0, rows, head, feats.nbytes)
    got, nbytes = _read_shard(shard, np.dtype(np.float32), dim, chunk=40_000)
    assert nbytes == feats.nbytes
    np.testing.assert_array_equal(got, feats)
    after = _cached_pages(path)
    assert before[:half // ALIGN].all() and not before[-(-half // ALIGN):].any()
    # the uncached half came by O_DIRECT: only the chunk straddling the boundary (mostly cached) was read
    # buffered, and no read-ahead ran past it
    assert after.sum() <= before.sum() + -(-40_000 // ALIGN) + 1


def test_shard_read_on_a_filesystem_without_o_direct_and_truncated(tmp_path: Path) -> None:
    """tmpfs refuses O_DIRECT: buffered reads then; a shard past the file's end is an InputError naming it."""
    from diskflow.operators.formats.store import FeatureShard
    from diskflow.operators.prepare.pack import _read_shard

    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    feats = np.arange(5000 * 8, dtype=np.float32).reshape(5000, 8)
    path = shm / f"diskflow-test-shard-{os.getpid()}.bin"
    try:
        path.write_bytes(b"\x01" * 10 + feats.tobytes())
        got, _ = _read_shard(FeatureShard(0, path, 0, 5000, 10, feats.nbytes), np.dtype(np.float32), 8, chunk=7000)
        np.testing.assert_array_equal(got, feats)
    finally:
        path.unlink(missing_ok=True)
    disk = tmp_path / "short.bin"
    disk.write_bytes(feats.tobytes()[:-100])
    with pytest.raises(InputError, match="truncated feature shard") as e:
        _read_shard(FeatureShard(0, disk, 0, 5000, 0, feats.nbytes), np.dtype(np.float32), 8, chunk=1 << 20)
    assert str(disk) in str(e.value)


def test_index_written_at_routing_and_patched_after_packing_is_the_whole_file(packed, rnd: Round,
                                                                              tmp_path: Path) -> None:
    """A superbatch's index written when it is routed (segment offsets and checksums zero) and patched once
    packing knows them is byte for byte the index written whole afterwards; the routing file of such a
    route holds only what the pack tasks read."""
    from diskflow.operators.formats.packedindex import patch_segments, read_index_file
    from diskflow.operators.prepare.route import write_index

    _, layout, res = packed
    store = Store(rnd.store)
    P = len(store.shards)
    crc = np.stack([np.asarray(res["pack"][p]["crc"]) for p in range(P)], axis=1)
    seg = []
    for r, n, p in zip(rnd.refs, rnd.n_ids, rnd.plans):
        whole = route_superbatch(r.key, n, p, layout, r.round_first_batch, store.shard_rows, P, tmp_path / f"{r.key}.npz")
        early = route_superbatch(r.key, n, p, layout, r.round_first_batch, store.shard_rows, P,
                                 tmp_path / f"{r.key}-early.npz", index_path=tmp_path / f"{r.key}.index.arrow")
        assert np.array_equal(whole["seg_rows"], early["seg_rows"])
        seg.append((whole, early))
    offsets, _ = segment_offsets(np.concatenate([w["seg_rows"] for w, _ in seg]), store.row_bytes)
    offsets = offsets + 4096 * np.arange(offsets.shape[1])          # values that differ per shard and batch
    for whole, early in seg:
        rows = slice(whole["first_batch"], whole["first_batch"] + whole["batches"])
        write_index(whole["key"], whole["path"], offsets[rows], crc[rows], tmp_path / "whole.arrow")
        assert early["index_at"].shape == (whole["batches"], 2)
        patch_segments(early["index_path"], early["index_at"], offsets[rows], crc[rows])
        assert Path(early["index_path"]).read_bytes() == (tmp_path / "whole.arrow").read_bytes()
        recs = read_index_file(early["index_path"])
        assert np.array_equal(np.stack([r.seg_crc for r in recs]), crc[rows].astype(np.uint32))
        route = RouteFile(early["path"])
        assert route.shard_ids(0).shape[0] == int(early["seg_rows"][:, 0].sum())
        with pytest.raises(InputError, match="lacks a readable 'offsets'"):
            route.records(offsets[rows], crc[rows])
        route.close()
    with pytest.raises(ValueError, match="records"):
        patch_segments(seg[0][1]["index_path"], seg[0][1]["index_at"][:1], offsets[:2], crc[:2])


def test_shard_read_error_names_the_file_and_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from diskflow.operators.formats.store import FeatureShard
    from diskflow.operators.prepare import pack as pack_mod

    feats = np.zeros((5000, 8), np.float32)
    path = tmp_path / "shard.bin"
    path.write_bytes(feats.tobytes())
    real = os.preadv
    calls = []

    def failing(fd: int, buffers: list, offset: int, *flags: int) -> int:
        calls.append(offset)
        if len(calls) > 1:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, buffers, offset, *flags)

    monkeypatch.setattr(pack_mod.os, "preadv", failing)
    with pytest.raises(InputError, match=r"read failed at byte 65536 \(Input/output error\)") as e:
        pack_mod._read_shard(FeatureShard(0, path, 0, 5000, 0, feats.nbytes), np.dtype(np.float32), 8, chunk=65536)
    assert str(path) in str(e.value)


def test_tier_targets_written_whole_in_node_order_or_scattered(rnd: Round, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shard's pack task writes its rows of each target file: ascending ids (the tiers' layout, empty
    slots last) as one contiguous range per shard (whole pages past the page cache, the ends buffered), any other order scattered through a map; either way
    row k holds features[ids[k]] and an empty slot stays zero."""
    import diskflow.operators.prepare.pack as pack_mod
    from diskflow.operators.formats.packed import create_row_file

    store = Store(rnd.store)
    N, rb, P = store.num_nodes, store.row_bytes, len(store.shards)
    assert P >= 3
    rng = np.random.default_rng(5)
    picked = np.sort(rng.choice(N, size=N // 3, replace=False))
    ascending = np.concatenate([picked, np.full(7, -1)])
    scattered = np.concatenate([rng.permutation(picked)[:40], [-1], picked[:1]])
    targets = []
    for name, ids in (("asc", ascending), ("scat", scattered)):
        create_row_file(tmp_path / f"{name}.bin", ids.shape[0] + 1, rb)
        targets.append(pack_mod.RowTarget(tmp_path / f"{name}.bin", ids, rb))     # rows after one row's offset
    pwrites = []
    real = os.pwrite

    def pwrite(fd: int, data: bytes, off: int) -> int:      # the ascending target's writes (part files' too are pwrites)
        if os.readlink(f"/proc/self/fd/{fd}").endswith("asc.bin"):
            pwrites.append((off, len(data)))
        return real(fd, data, off)

    monkeypatch.setattr(pack_mod.os, "pwrite", pwrite)
    k, f, n, p = rnd.refs[0].key, 0, rnd.n_ids[0], rnd.plans[0]
    route = route_superbatch(k, n, p, None, f, store.shard_rows, P, tmp_path / "r.npz")
    offsets, _ = segment_offsets(route["seg_rows"], rb)
    for s in range(P):
        pack_shard(rnd.store, s, [route["path"]], offsets, tmp_path / f"part-{s}.bin", tier_targets=targets)
    shards_hit = set((picked // store.shard_rows).tolist())
    # the ascending file only: per shard its whole pages in one write (O_DIRECT) and the partial pages at
    # either end (buffered), each byte of the filled slots once
    assert len(shards_hit) <= len(pwrites) <= 3 * len(shards_hit)
    spans = sorted(pwrites)
    assert all(a + n <= b for (a, n), (b, _) in itertools.pairwise(spans))
    assert spans[0][0] == rb and sum(n for _, n in spans) == picked.shape[0] * rb
    for name, ids in (("asc", ascending), ("scat", scattered)):
        data = np.fromfile(tmp_path / f"{name}.bin", np.uint8)
        rows = data[rb:rb + ids.shape[0] * rb].reshape(-1, rb)
        assert not data[:rb].any() and not data[rb + ids.shape[0] * rb:].any()     # nothing outside the rows
        for slot, node in enumerate(ids):
            want = bytes(rb) if node < 0 else store.gather(np.array([node])).tobytes()
            assert rows[slot].tobytes() == want, (name, slot, node)


def _plain_routes(rnd: Round, out: Path) -> tuple[list[dict], np.ndarray]:
    store = Store(rnd.store)
    routes = [route_superbatch(r.key, n, p, None, r.round_first_batch, store.shard_rows, len(store.shards),
                               out / f"{r.key}.npz") for r, n, p in zip(rnd.refs, rnd.n_ids, rnd.plans)]
    return routes, segment_offsets(np.concatenate([r["seg_rows"] for r in routes]), store.row_bytes)[0]


def test_part_files_begun_while_planning_end_identical(rnd: Round, tmp_path: Path) -> None:
    from diskflow.operators.prepare.pack import pack_early

    store = Store(rnd.store)
    routes, offsets = _plain_routes(rnd, tmp_path)
    paths = [r["path"] for r in routes]
    assert len(routes) >= 3
    warm = [0, 2]
    states = None
    for k, route in enumerate(routes[:-1]):
        # shard 2 drops out after the first superbatch (as if evicted): it carries on from there
        states = pack_early(rnd.store, warm if k == 0 else [0], route, tmp_path / "early", states, min_cached=0.0,
                            final=k == len(routes) - 2)
    assert sorted(states) == warm
    assert states[0].batches == routes[-1]["first_batch"] and states[2].batches == routes[1]["first_batch"]
    for p in range(len(store.shards)):
        plain = pack_shard(rnd.store, p, paths, offsets, tmp_path / "plain" / part_name(p))
        resumed = pack_shard(rnd.store, p, paths, offsets, tmp_path / "resumed" / part_name(p), early=states.get(p))
        assert (tmp_path / "plain" / part_name(p)).read_bytes() == (tmp_path / "resumed" / part_name(p)).read_bytes()
        assert np.array_equal(plain["crc"], resumed["crc"])
        assert (plain["rows"], plain["file_bytes"]) == (resumed["rows"], resumed["file_bytes"])
    assert not list((tmp_path / "early").iterdir())          # moved into place
    assert not list(tmp_path.rglob(".*.tmp-*"))


def test_early_packing_skips_shards_out_of_the_page_cache(rnd: Round, tmp_path: Path) -> None:
    from diskflow.operators.prepare.pack import EarlyPart, pack_early

    routes, offsets = _plain_routes(rnd, tmp_path)
    # min_cached above 1: no shard counts as resident, so nothing is begun and nothing read
    assert pack_early(rnd.store, [0, 1], routes[0], tmp_path / "early", None, min_cached=1.01) == {}
    # a shard whose part file fell behind this route is left as it stands
    states = pack_early(rnd.store, [1], routes[0], tmp_path / "early", None, min_cached=0.0)
    assert pack_early(rnd.store, [1], routes[2], tmp_path / "early", states, min_cached=0.0) == states
    # a record that disagrees with its file is refused, naming the file
    lie = EarlyPart(states[1].path, states[1].batches, states[1].position + 2 * ALIGN, states[1].rows, states[1].crc)
    with pytest.raises(InputError, match=part_name(1)):
        pack_shard(rnd.store, 1, [r["path"] for r in routes], offsets, tmp_path / "out" / part_name(1), early=lie)


def test_early_packing_keeps_its_shard_maps_for_the_run_only(rnd: Round, tmp_path: Path) -> None:
    """The maps `pack_early` keeps between its tasks are let go by the run's last early task, by the shard's
    pack task, by a failed task and by a later run's first task: mapped pages could not be evicted."""
    from diskflow.operators.prepare import pack
    from diskflow.operators.prepare.pack import EarlyPart, pack_early, release_early_maps

    routes, offsets = _plain_routes(rnd, tmp_path)
    paths = [r["path"] for r in routes]
    one, two = str(tmp_path / "early"), str(tmp_path / "early2")
    release_early_maps()
    states = pack_early(rnd.store, [0, 2], routes[0], one, None, min_cached=0.0)
    kept = dict(pack._EARLY_MAPS)
    assert sorted(kept) == [(one, 0), (one, 2)]
    states = pack_early(rnd.store, [0, 2], routes[1], one, states, min_cached=0.0)
    assert all(pack._EARLY_MAPS[k][1] is kept[k][1] for k in kept)    # mapped once for the run
    path = Store(rnd.store).shards[2].path
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))           # a changed file is mapped afresh
    try:
        pack_early(rnd.store, [2], routes[0], one, None, min_cached=0.0)
    finally:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert pack._EARLY_MAPS[(one, 2)][1] is not kept[(one, 2)][1] and pack._EARLY_MAPS[(one, 0)] is kept[(one, 0)]
    pack_shard(rnd.store, 0, paths, offsets, tmp_path / "out" / part_name(0), early=states[0])
    assert sorted(pack._EARLY_MAPS) == [(one, 2)]                     # the shard's pack task let its map go
    pack_early(rnd.store, [1], routes[0], two, None, min_cached=0.0)  # another run: the first run's maps go
    assert sorted(pack._EARLY_MAPS) == [(two, 1)]
    pack_early(rnd.store, [1], routes[0], tmp_path / "early3", None, min_cached=0.0, final=True)
    assert pack._EARLY_MAPS == {}
    pack_early(rnd.store, [2], routes[0], one + "x", None, min_cached=0.0)
    bad = dict(routes[1], first_batch=routes[1]["first_batch"] + 1)  # a route task that lies: the task fails
    with pytest.raises(InputError):
        pack_early(rnd.store, [2], bad, one + "x", {2: EarlyPart("x", 0, 0, 0, np.zeros(0, np.int64))},
                   min_cached=0.0)
    assert pack._EARLY_MAPS == {}
