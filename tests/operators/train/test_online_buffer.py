"""The online loader's feature buffer (GNNDrive's and LSM-GNN's): every batch bit-exact against the store
under buffers barely larger than a batch, batches in order however extraction finishes, the eviction
orders of both policies, fixed memory, and errors that name the option or the file and offset."""
from __future__ import annotations

import shutil
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from diskflow.native.constants import ALIGN, SECTOR
from diskflow.operators.formats.store import Store
from diskflow.operators.prepare.sample import NeighborSampler
from diskflow.operators.train.batches import InMemoryLoader
from diskflow.operators.train.cachepolicy import InDegree, policy_for
from diskflow.operators.train.online import OnlineLoader, buffer_slots
from diskflow.operators.train.rowcache import RowCache
from diskflow.operators.train.rowreader import RowReader

from diskflow.errors import ConfigError, InputError

FANOUTS, BATCH, SEED = [4, 3], 96, 11
WAIT_S = 60.0       # a guard against a hang: what a held read waits for comes within milliseconds
pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.filterwarnings("ignore:.*reading it through the page cache:RuntimeWarning")]


def _loader(st: Store, slots: int, policy: str, *, window: int = 0, extractors: int = 3,
            staging_bytes: int = 1 << 14, unit_bytes: int = SECTOR) -> OnlineLoader:
    static = InDegree(st.indptr) if policy == "hybrid" else None
    buf = _buffer(st.num_nodes, slots, st.feature_dim, st.feature_dtype, policy, static=static,
                  threshold=max(1, window // 8))
    sampler = NeighborSampler(st.indptr, st.indices, FANOUTS, num_threads=1)
    labels = torch.from_numpy(np.asarray(st.labels, np.int64))
    return OnlineLoader(st, buf, labels, sampler, st.split_ids("train"), BATCH, SEED, extractors=extractors,
                        window=window, staging_bytes=staging_bytes, unit_bytes=unit_bytes)


def _buffer(num_nodes: int, slots: int, dim: int, dtype: Any, policy: str, static: Any = None,
            threshold: int = 1) -> RowCache:
    """The online loader's feature buffer: a planned row cache."""
    return RowCache(num_nodes, slots, dim, dtype, policy_for(policy, static=static, threshold=threshold),
                    planned=True)


def _reference(st: Store, epoch: int) -> list[Any]:
    sampler = NeighborSampler(st.indptr, st.indices, FANOUTS, num_threads=1)
    feats = torch.from_numpy(st.read_features())
    labels = torch.from_numpy(np.asarray(st.labels, np.int64))
    ref = InMemoryLoader(feats, labels, sampler, st.split_ids("train"), BATCH, True, SEED)
    ref.set_epoch(epoch)
    return list(ref)


def _hold_first_read(monkeypatch: pytest.MonkeyPatch, batch: int, until: Callable[[], bool], what: str) -> None:
    """The first chunk of `batch` that an extractor reads waits until `until()` holds (at most `WAIT_S`, then
    an `AssertionError` saying `what` never happened); every other read goes on at once."""
    read = RowReader.read
    first = threading.Lock()

    def held(self: RowReader, ids: np.ndarray, slots: np.ndarray, buffer: RowCache, i: int) -> None:
        if i == batch and first.acquire(blocking=False):
            deadline = time.monotonic() + WAIT_S
            while not until():
                assert time.monotonic() < deadline, f"{what} within {WAIT_S:.0f} s"
                time.sleep(0.001)
        read(self, ids, slots, buffer, i)

    monkeypatch.setattr(RowReader, "read", held)


def _largest_batch(st: Store) -> int:
    return max(int(b.n_id.shape[0]) for e in range(2) for b in _reference(st, e))


@pytest.mark.parametrize("policy,window,unit", [("lru", 0, SECTOR), ("lru", 0, ALIGN), ("hybrid", 6, SECTOR)])
def test_every_batch_is_bit_exact_under_a_buffer_barely_larger_than_a_batch(tiny_store: Path, policy: str,
                                                                            window: int, unit: int) -> None:
    st = Store(tiny_store)
    slots = _largest_batch(st) + 40          # one batch in flight at a time, rows evicted on every batch
    loader = _loader(st, slots, policy, window=window, unit_bytes=unit)
    assert loader.readers[0].unit in ((SECTOR, ALIGN) if unit == SECTOR else (ALIGN,))
    for epoch in range(2):
        loader.set_epoch(epoch)
        ours = list(loader)
        ref = _reference(st, epoch)
        assert len(ours) == len(ref) == len(loader)
        for a, b in zip(ours, ref, strict=True):
            assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
            assert torch.equal(a.x, torch.from_numpy(st.gather(a.n_id.numpy())))    # bit-exact, no stale row
            assert torch.equal(a.y, b.y)
        c = loader.counts
        assert c["rows"] == sum(int(b.n_id.shape[0]) for b in ref) == c["hits"] + c["misses"]
        assert c["evictions"] > 0 and c["hits"] > 0 and c["rows_read"] == c["misses"]
        assert c["bytes_read"] >= c["misses"] * st.row_bytes
    assert loader.buffer.pinned == 0       # every batch's slots released
    loader.close()


def test_batches_keep_their_order_when_extraction_finishes_out_of_order(tiny_store: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    st = Store(tiny_store)
    loader = _loader(st, st.num_nodes, "lru", extractors=3)
    # batch 0 is read after batch 1 (the other extractors read batch 1 meanwhile)
    _hold_first_read(monkeypatch, 0, lambda: 1 in loader.order_seen, "batch 1 was not read")
    ours = list(loader)
    assert loader.order_seen.index(1) < loader.order_seen.index(0), loader.order_seen   # out of order
    ref = _reference(st, 0)
    assert [b.n_id.tolist() for b in ours] == [b.n_id.tolist() for b in ref]
    for a in ours:
        assert torch.equal(a.x, torch.from_numpy(st.gather(a.n_id.numpy())))
    loader.close()


def test_memory_stays_fixed_and_a_tiny_buffer_throttles_extraction(tiny_store: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    st = Store(tiny_store)
    slots = _largest_batch(st) + 8
    loader = _loader(st, slots, "lru", extractors=4)
    # batch 0 in flight until planning waits: the next batches' rows do not fit beside its own
    _hold_first_read(monkeypatch, 0, lambda: loader.buffer.counts["waits"] > 0, "planning never waited for slots")
    before = loader.memory()
    peak = {"pinned": 0}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak["pinned"] = max(peak["pinned"], loader.buffer.pinned)
            time.sleep(0.001)

    t = threading.Thread(target=watch)
    t.start()
    try:
        batches = list(loader)
    finally:
        stop.set()
        t.join()
    assert loader.memory() == before and loader.buffer.rows.shape == (slots, st.feature_dim)
    assert before["total_bytes"] == before["buffer_bytes"] + before["table_bytes"] + before["staging_bytes"]
    assert before["buffer_bytes"] == slots * st.row_bytes
    assert peak["pinned"] <= slots
    assert loader.counts["waits"] > 0      # four extractors, room for one batch: planning waited for releases
    assert all(torch.equal(b.x, torch.from_numpy(st.gather(b.n_id.numpy()))) for b in batches)
    loader.close()


def test_a_batch_larger_than_the_buffer_and_a_budget_without_room_name_cpu_memory(tiny_store: Path) -> None:
    st = Store(tiny_store)
    loader = _loader(st, 50, "lru")
    with pytest.raises(ConfigError, match=r"^cpu_memory: batch 0 has .* distinct rows, the feature buffer holds 50"):
        list(loader)
    loader.close()
    with pytest.raises(ConfigError, match="^cpu_memory: .* does not hold the feature buffer's tables"):
        buffer_slots(1 << 16, st.num_nodes, st.row_bytes, extractors=4)
    assert buffer_slots(64 << 20, 1000, 512, 1) > 0


def test_an_io_error_names_the_shard_file_and_the_offset(tiny_store: Path, tmp_path: Path) -> None:
    copy = tmp_path / "store"
    shutil.copytree(tiny_store, copy)
    victim = Store(copy).shards[-1]
    with open(victim.path, "r+b") as f:            # the last shard loses all but its first page
        f.truncate(victim.offset + 4096)
    # the store's checksums catch it first, naming the file and the bytes it holds
    loader = _loader(Store(copy), Store(copy).num_nodes, "lru")
    with pytest.raises(InputError, match=rf"^{victim.path}: truncated: {victim.offset + 4096:,} bytes, "):
        list(loader)
    loader.close()
    # unchecked, the read itself fails naming the file and the offset
    st = Store(copy, check_crc=False)
    loader = _loader(st, st.num_nodes, "lru")
    with pytest.raises(InputError) as err:
        list(loader)
    text = str(err.value)
    assert str(victim.path) in text and "byte offset" in text and "short read at offset" in text
    loader.close()


def test_lru_takes_back_the_least_recently_used_released_slot() -> None:
    buf = _buffer(20, 4, 2, np.float32, "lru")
    a = buf.plan(0, np.array([1, 2]))
    buf.release(a.aliases)
    b = buf.plan(1, np.array([3, 4]))
    buf.release(b.aliases)
    c = buf.plan(2, np.array([1, 5]))     # 1 hits; 5 takes the slot of 2 (used at batch 0, before 3 and 4)
    assert c.aliases[0] == a.aliases[0] and c.aliases[1] == a.aliases[1]
    assert buf.counts["hits"] == 1 and buf.slot_of[2] == -1
    # pinned slots are never victims: with 1 and 5 in flight, 6 and 7 take 3's and 4's
    d = buf.plan(3, np.array([6, 7]))
    assert sorted(d.slots.tolist()) == sorted(b.aliases.tolist())


def test_hybrid_evicts_no_reuse_first_then_far_reuse_then_lowest_static_score() -> None:
    degree = np.array([0, 50, 40, 30, 20, 10, 5, 5, 5, 5], np.int64)
    buf = _buffer(10, 5, 2, np.float32, "hybrid", static=degree, threshold=1)
    first = buf.plan(0, np.array([1, 2, 3, 4, 5]))
    buf.release(first.aliases)
    slot = {n: int(buf.slot_of[n]) for n in (1, 2, 3, 4, 5)}
    # window: node 1 next batch (near), node 2 three batches ahead (far); 3, 4, 5 not in the window
    window = [np.array([1, 9]), np.array([8]), np.array([2])]
    p = buf.plan(1, np.array([6, 7]), window)
    # the two victims: among no-reuse nodes 3 (30), 4 (20), 5 (10), the lowest scores: 5 and 4
    assert sorted(p.slots.tolist()) == sorted([slot[5], slot[4]])
    buf.release(p.aliases)
    left = {n: int(buf.slot_of[n]) for n in (1, 2, 3, 6, 7)}
    q = buf.plan(2, np.array([8, 9, 0]), [np.array([1]), np.array([2])])
    # 1 is used next batch (within the threshold), 2 two ahead (beyond it), 3, 6 and 7 not at all:
    # the three victims are the no-reuse ones, whatever their scores (3's is the highest of all five)
    assert sorted(q.slots.tolist()) == sorted([left[3], left[6], left[7]])
    assert buf.slot_of[1] == left[1] and buf.slot_of[2] == left[2]
    buf.release(q.aliases)
    zero = int(buf.slot_of[0])
    r = buf.plan(3, np.array([3]), [np.array([1])])
    # no use left for 2 (score 40), 8, 9 (5) and 0 (0): the lowest score goes; 1 (next batch) stays
    assert r.slots.tolist() == [zero] and buf.slot_of[0] == -1 and buf.slot_of[1] == left[1]


def test_buffer_refuses_an_unknown_policy_and_an_empty_buffer() -> None:
    with pytest.raises(ConfigError, match="policy"):
        _buffer(10, 4, 2, np.float32, "fifo")
    with pytest.raises(ConfigError, match="^cpu_memory"):
        _buffer(10, 0, 2, np.float32, "lru")
    with pytest.raises(ConfigError, match="static score"):
        _buffer(10, 4, 2, np.float32, "hybrid")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _buffer(10, 4, 2, np.float16, "lru")
