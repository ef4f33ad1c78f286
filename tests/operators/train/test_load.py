"""`PackedLoader`: NeighborLoader-shaped batches, bit-exact against the store for every layout, one
read request per packed segment, crc and truncation errors naming file/batch/shard, errors and
early exits that stop every stage thread, epoch selection with CPU-tier fast-forward, and the
memory budget checked before anything starts."""
from __future__ import annotations

import shutil
import sys
import threading
from pathlib import Path

import dask
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from diskflow.flow.prepare import PrepareConfig, prepare
from diskflow.operators.formats.packed import ROUND_DIR, SRC_PACKED, PackedDataset, padded
from diskflow.operators.formats.sizes import format_bytes
from diskflow.operators.formats.store import Store
from diskflow.operators.prepare.sample import NeighborSampler
from diskflow.operators.prepare.tiers import staging_piece_bytes
from diskflow.operators.train.batches import TRAIN_STREAM, InMemoryLoader
from diskflow.operators.train.batchload import make_reader
from diskflow.operators.train.loader import PackedLoader
from diskflow.operators.train.memory import memory_plan
from torch_geometric.nn import GraphSAGE

from diskflow.errors import ConfigError, InputError

BASE = {"fanouts": (5, 5), "batch_size": 192, "superbatch_size": 3, "epochs": 2, "seed": 3}
CPU_ROWS, GPU_ROWS = 600, 250
FIELDS = {"x", "edge_index", "y", "n_id", "batch_size", "num_sampled_nodes", "num_sampled_edges"}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def prepared(store: Path, out: Path, staging: int, **kw: object) -> Path:
    """A packed dataset of tiny_store: the round of BASE, a CPU tier of CPU_ROWS rows."""
    row_bytes = Store(store).row_bytes
    cfg = PrepareConfig(**BASE, cpu_memory=staging + CPU_ROWS * row_bytes, staging_batches=1, **kw)  # type: ignore[arg-type]
    with dask.config.set(scheduler="sync"):
        return prepare(store, out, cfg, quiet=True).path


@pytest.fixture(scope="module")
def staging(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> int:
    """One staging buffer, sized for the round's largest batch (from a throwaway run)."""
    with dask.config.set(scheduler="sync"):
        r = prepare(tiny_store, tmp_path_factory.mktemp("staging") / "p",
                    PrepareConfig(**BASE, cpu_memory=1 << 30, staging_batches=1), quiet=True)  # type: ignore[arg-type]
    return int(r.figures["staging_bytes"])


@pytest.fixture(scope="module")
def layouts(tiny_store: Path, staging: int, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("layouts")
    rb = Store(tiny_store).row_bytes
    kws: dict[str, dict] = {
        "belady": {},
        "diskgnn": {"pipeline": "diskgnn", "cpu_policy": "static"},
        "ginex": {"pipeline": "ginex", "packing": False},
        "dcache": {"disk_budget": 3 << 20},
        "gpu-tier": {"device": "cuda", "gpu_memory": GPU_ROWS * rb},
    }
    return {name: prepared(tiny_store, root / name, staging, **kw) for name, kw in kws.items()}


@pytest.fixture(scope="module")
def store(tiny_store: Path) -> Store:
    return Store(tiny_store)


def stage_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("diskflow-")]


def test_fixture_layouts_cover_every_source(layouts: dict[str, Path]) -> None:
    """The layouts below really read from every tier (else the exactness test proves little)."""
    seen = {}
    for name, path in layouts.items():
        with PackedLoader(path) as loader:
            for _ in loader:
                pass
            seen[name] = loader.stats()["tiers"]["rows"]
    assert seen["belady"]["packed"] > 0 and seen["belady"]["cpu"] > 0
    assert seen["ginex"]["store"] > 0 and seen["ginex"]["packed"] == 0
    assert seen["dcache"]["dcache"] > 0
    assert seen["gpu-tier"]["gpu"] > 0


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "sequential"])
@pytest.mark.parametrize("name", ["belady", "diskgnn", "ginex", "dcache", "gpu-tier"])
def test_every_batch_is_the_store_gather_of_its_n_id(name: str, pipelined: bool, layouts: dict[str, Path],
                                                     store: Store) -> None:
    labels = np.asarray(store.labels)
    n = 0
    with PackedLoader(layouts[name], pipelined=pipelined) as loader:
        assert len(loader) == loader.num_batches
        for batch in loader:
            assert set(batch.keys()) == FIELDS
            assert batch.n_id.dtype == batch.edge_index.dtype == torch.int64      # as PyG's (int32 on disk)
            n_id = batch.n_id.numpy()
            assert batch.x.numpy().tobytes() == store.gather(n_id).tobytes(), f"{name}: batch {n}"
            assert torch.equal(batch.y, torch.from_numpy(labels[n_id]))
            assert batch.x.shape == (n_id.shape[0], store.feature_dim) and batch.x.dtype == torch.float32
            n += 1
    assert n == PackedDataset(layouts[name]).num_batches
    assert stage_threads() == []


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "sequential"])
def test_batches_kept_by_the_caller_are_never_overwritten(pipelined: bool, layouts: dict[str, Path],
                                                           store: Store) -> None:
    """Feature matrices are pooled, but one a caller still holds is never handed out again."""
    with PackedLoader(layouts["belady"], pipelined=pipelined) as loader:
        kept = [(b.n_id.numpy().copy(), b.x) for b in loader]      # every batch alive at once
        again = [b.x.clone() for b in loader]                       # a second pass may reuse dropped ones
    for j, (n_id, x) in enumerate(kept):
        assert x.numpy().tobytes() == store.gather(n_id).tobytes(), f"batch {j} changed after it was yielded"
        assert torch.equal(again[j], x), j
    assert len({x.data_ptr() for _, x in kept}) == len(kept)


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "sequential"])
def test_a_held_batch_is_safe_without_reference_counts(pipelined: bool, layouts: dict[str, Path], store: Store,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Reuse follows explicit releases, not reference counts: on an interpreter whose `sys.getrefcount`
    says nothing (PyPy has no reference counts) the batches a caller holds still keep their rows."""
    monkeypatch.setattr(sys, "getrefcount", lambda obj: 1)
    with PackedLoader(layouts["belady"], pipelined=pipelined) as loader:
        kept = [(b.n_id.numpy().copy(), b.x) for b in loader]
    for j, (n_id, x) in enumerate(kept):
        assert x.numpy().tobytes() == store.gather(n_id).tobytes(), f"batch {j} changed after it was yielded"


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "sequential"])
def test_released_matrices_are_reused_and_only_they(pipelined: bool, layouts: dict[str, Path], store: Store) -> None:
    """A loop that releases each batch after its step runs on the pool's few matrices; a batch it keeps
    unreleased is never written again; a second release (or one of a foreign tensor) frees nothing."""
    with PackedLoader(layouts["belady"], pipelined=pipelined) as loader:
        pool = loader.memory["assembled_batches"]
        held = None
        ptrs = set()
        for j, batch in enumerate(loader):
            assert batch.x.numpy().tobytes() == store.gather(batch.n_id.numpy()).tobytes(), j
            ptrs.add(batch.x.data_ptr())
            if j == 1:
                held = (batch.n_id.numpy().copy(), batch.x)     # kept, never released
                continue
            loader.release(batch)
            loader.release(batch)                               # twice: must not free a later batch's lease
            loader.release(torch.zeros(3, 4))
        assert loader.num_batches > pool + 2 and len(ptrs) <= pool + 1
        for batch in loader:                                    # a second pass, every batch released
            loader.release(batch)
    assert held is not None
    n_id, x = held
    assert x.numpy().tobytes() == store.gather(n_id).tobytes(), "a batch never released was written again"


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "sequential"])
@pytest.mark.parametrize("samples", ["none", "shifted"])
def test_samples_out_of_step_with_the_index_are_input_errors(pipelined: bool, samples: str,
                                                             layouts: dict[str, Path]) -> None:
    """Features and graphs are joined batch by batch: a samples stream that runs out or is out of order stops
    the loader with an InputError in both modes (an explicit check, not an assert that ``python -O`` removes)."""
    with PackedLoader(layouts["belady"], pipelined=pipelined) as loader:
        stored = loader._samples
        loader._samples = (lambda lo, hi: iter(())) if samples == "none" else \
            (lambda lo, hi: ((g + 1, s) for g, s in stored(lo, hi)))                  # type: ignore[method-assign]
        match = "different numbers of batches" if samples == "none" else "batch order broken: features of 0, graph of 1"
        with pytest.raises(InputError, match=match):
            list(loader)
    assert stage_threads() == []


@pytest.mark.parametrize("name", ["belady", "ginex", "dcache", "gpu-tier"])
def test_the_device_assembly_path_is_exact_too(name: str, layouts: dict[str, Path], store: Store) -> None:
    """The CUDA path's arithmetic (pinned block of staged + CPU rows, one gather after the GPU rows), run on
    the CPU: same rows, same CPU-tier inserts (the whole round is checked, so inserts must be right)."""
    with PackedLoader(layouts[name]) as loader:
        loader._device_path = True
        for batch in loader:
            assert batch.x.numpy().tobytes() == store.gather(batch.n_id.numpy()).tobytes()


def test_batches_are_the_in_memory_loaders_batches(layouts: dict[str, Path], store: Store) -> None:
    """Same n_id, edges, per-hop counts and seeds as InMemoryLoader at the round's seed, epoch by epoch."""
    x = torch.from_numpy(store.read_features())
    y = torch.from_numpy(np.asarray(store.labels, dtype=np.int64))
    sampler = NeighborSampler(np.array(store.indptr), np.array(store.indices), list(BASE["fanouts"]), num_threads=1)
    ref = InMemoryLoader(x, y, sampler, store.split_ids("train"), BASE["batch_size"], True, BASE["seed"], TRAIN_STREAM)
    with PackedLoader(layouts["belady"]) as loader:
        assert loader.epochs() == [0, 1]
        for epoch in loader.epochs():
            loader.set_epoch(epoch)
            ref.set_epoch(epoch)
            pairs = list(zip(loader, ref, strict=True))
            assert len(pairs) == len(ref)
            for a, b in pairs:
                for key in ("x", "y", "n_id", "edge_index"):
                    assert torch.equal(a[key], b[key]), key
                assert (a.batch_size, a.num_sampled_nodes, a.num_sampled_edges) == \
                       (b.batch_size, b.num_sampled_nodes, b.num_sampled_edges)


def test_a_stock_pyg_training_loop_runs_unchanged(layouts: dict[str, Path]) -> None:
    """The README's loop: nothing but x, edge_index, y and batch_size."""
    torch.manual_seed(0)
    model = GraphSAGE(47, 16, 2, 5)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = PackedLoader(layouts["belady"])
    losses = []
    for batch in loader:
        opt.zero_grad()
        out = model(batch.x, batch.edge_index)[:batch.batch_size]
        loss = F.cross_entropy(out, batch.y[:batch.batch_size])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    loader.close()
    half = len(losses) // 2
    assert len(losses) == 26 and np.mean(losses[half:]) < np.mean(losses[:half]) - 0.05, losses


def test_one_read_request_per_nonempty_segment(layouts: dict[str, Path]) -> None:
    ds = PackedDataset(layouts["belady"])
    segments = sum(int((r.seg_rows > 0).sum()) for _, r in ds.batches())
    padded_bytes = sum(int(padded(r.seg_rows[r.seg_rows > 0] * ds.row_bytes).sum()) for _, r in ds.batches())
    packed_rows = sum(int((r.src == SRC_PACKED).sum()) for _, r in ds.batches())
    with PackedLoader(layouts["belady"]) as loader:
        for _ in loader:
            pass
        io = loader.stats()["io"]
    assert segments > 26
    assert io["requests"] == segments
    assert io["bytes_read"] == padded_bytes == ds.manifest["files"]["parts"][0]["bytes"] + sum(
        p["bytes"] for p in ds.manifest["files"]["parts"][1:])
    assert io["useful_bytes"] == packed_rows * ds.row_bytes


def test_ginex_reads_each_store_row_with_its_own_request(layouts: dict[str, Path]) -> None:
    with PackedLoader(layouts["ginex"]) as loader:
        for _ in loader:
            pass
        st = loader.stats()
    rows = st["tiers"]["rows"]["store"]
    # one request per row (rows in a shard's last, partial page are read page-merged)
    assert 0.9 * rows <= st["io"]["requests"] <= rows
    assert st["io"]["bytes_read"] >= 0.9 * rows * 4096


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x20
    path.write_bytes(bytes(data))


def _late_segment(path: Path) -> tuple[int, int, int]:
    """(batch, shard, byte offset) of a packed segment in the second epoch."""
    with PackedDataset(path) as ds:
        for _, r in ds.batches():
            if r.batch >= 15 and (r.seg_rows > 0).any():
                p = int(np.flatnonzero(r.seg_rows)[-1])
                return r.batch, p, int(r.seg_offset[p])
    raise AssertionError("no segment")


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "sequential"])
def test_flipped_byte_names_file_batch_and_shard(layouts: dict[str, Path], tmp_path: Path, pipelined: bool) -> None:
    copy = tmp_path / "packed"
    shutil.copytree(layouts["belady"], copy)
    batch, p, off = _late_segment(copy)
    part = copy / ROUND_DIR / f"part-{p:05d}.bin"
    _flip(part, off + 5)
    with PackedLoader(copy, pipelined=pipelined) as loader, \
            pytest.raises(InputError, match=f"checksum mismatch in batch {batch}, shard {p}") as e:
        for _ in loader:
            pass
    assert e.value.path == str(part)
    assert stage_threads() == []
    with PackedLoader(copy, pipelined=pipelined, check_crc=False) as loader:   # unchecked: the flip gets through
        assert sum(1 for _ in loader) == loader.num_batches


def test_truncated_part_file_names_file_batch_and_shard(layouts: dict[str, Path], tmp_path: Path) -> None:
    copy = tmp_path / "packed"
    shutil.copytree(layouts["belady"], copy)
    ds = PackedDataset(copy)
    last = max((r for _, r in ds.batches()), key=lambda r: r.batch)
    p = int(np.flatnonzero(last.seg_rows)[-1])
    ds.close()
    part = copy / ROUND_DIR / f"part-{p:05d}.bin"
    with open(part, "r+b") as f:
        f.truncate(part.stat().st_size - 4096)
    with PackedLoader(copy) as loader, pytest.raises(InputError, match=rf"truncated.*batch {last.batch}, shard {p}") as e:
        for _ in loader:
            pass
    assert e.value.path == str(part)


class _FailingReader:
    """The real reader, failing on its n-th read."""

    def __init__(self, fail_at: int) -> None:
        self.inner = make_reader()
        self.calls = 0
        self.fail_at = fail_at

    def read(self, *args: object) -> None:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("injected read failure")
        self.inner.read(*args)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_an_error_in_a_stage_reaches_the_consumer_promptly_and_stops_every_thread(layouts: dict[str, Path]) -> None:
    """Promptly: the consumer gets the error in place of the failed read's batch, and no read follows the failed
    one (the load stage makes every read)."""
    reader = _FailingReader(fail_at=5)
    loader = PackedLoader(layouts["belady"], reader=reader)
    got = 0
    with pytest.raises(RuntimeError, match="injected read failure"):
        for _ in loader:
            got += 1
    assert got < 5 and reader.calls == 5 and stage_threads() == [], (got, reader.calls, stage_threads())
    loader.close()


def test_a_consumer_that_stops_early_stops_the_stages_and_the_next_pass_is_exact(layouts: dict[str, Path],
                                                                                 store: Store) -> None:
    with PackedLoader(layouts["belady"], queue_depth=1) as loader:
        for i, _ in enumerate(loader):
            if i == 3:
                break
        assert stage_threads() == []
        assert loader.tier_position >= 4             # 4 batches consumed (assembly may have run ahead)
        for batch in loader:                          # batch 0 again: restarts from the round's CPU tier
            assert batch.x.numpy().tobytes() == store.gather(batch.n_id.numpy()).tobytes()


def test_set_epoch_with_a_start_fast_forwards_the_cpu_tier(layouts: dict[str, Path]) -> None:
    with PackedLoader(layouts["belady"]) as loader:
        full = [b.x.clone() for b in loader]
        first, end = loader.epoch_range(1)
        assert (first, end) == (13, 26)
        loader.set_epoch(1, start=4)                  # the tier is at 26: replays 0..16 without yielding
        assert len(loader) == 9
        part = [b.x for b in loader]
        assert loader.tier_position == 26
        loader.set_epoch(0)
        again = [b.x for b in loader]
    assert len(part) == 9 and all(torch.equal(a, b) for a, b in zip(part, full[17:]))
    assert all(torch.equal(a, b) for a, b in zip(again, full[:13]))
    with PackedLoader(layouts["belady"]) as loader, pytest.raises(ConfigError, match="epoch"):
        loader.set_epoch(2)


def test_the_memory_budget_is_checked_before_anything_starts(layouts: dict[str, Path]) -> None:
    ds = PackedDataset(layouts["belady"])
    plan = memory_plan(ds, torch.device("cpu"), 2, False)
    rb, m = ds.row_bytes, int(ds.manifest["round"]["max_batch_rows"])
    piece = staging_piece_bytes(m, rb, ds.num_shards)
    assert plan["staging_buffers"] == 4 and plan["staging_bytes"] == 4 * piece and plan["cpu_tier_bytes"] == CPU_ROWS * rb
    assert plan["assembled_batches"] == 5 and plan["assembled_bytes"] == 5 * m * rb and plan["assembled_on"] == "host"
    need = plan["host_bytes"]
    assert need == plan["cpu_tier_bytes"] + plan["staging_bytes"] + plan["io_buffer_bytes"]
    with pytest.raises(ConfigError, match=rf"^cpu_memory: .*need at least {need:,} bytes"):
        PackedLoader(layouts["belady"], cpu_memory=need - 1)
    PackedLoader(layouts["belady"], cpu_memory=need).close()
    seq = memory_plan(ds, torch.device("cpu"), 2, True)
    assert seq["host_bytes"] < need
    PackedLoader(layouts["belady"], cpu_memory=seq["host_bytes"], pipelined=False).close()
    # the GPU tier is host memory on a CPU run, device memory (checked against --gpu-memory) on CUDA
    gpu_plan = memory_plan(PackedDataset(layouts["gpu-tier"]), torch.device("cpu"), 2, False)
    assert gpu_plan["gpu_tier_bytes"] == GPU_ROWS * rb and gpu_plan["host_bytes"] == gpu_plan["cpu_tier_bytes"] + \
        gpu_plan["staging_bytes"] + gpu_plan["io_buffer_bytes"] + gpu_plan["gpu_tier_bytes"]


def test_a_budget_too_small_names_a_queue_depth_or_sequential_stages_that_fit(layouts: dict[str, Path]) -> None:
    """One staging buffer short: the largest smaller queue depth that fits; no queue depth fits, but one buffer
    does: the sequential stages; each accepted with that budget."""
    ds = PackedDataset(layouts["belady"])
    plan = memory_plan(ds, torch.device("cpu"), 3, False)
    need, piece = plan["host_bytes"], plan["staging_piece_bytes"]
    with pytest.raises(ConfigError) as e:
        PackedLoader(layouts["belady"], cpu_memory=need - 1, queue_depth=3)
    assert "\n" not in str(e.value) and str(e.value).endswith(f"; queue_depth=2 would fit {format_bytes(need - 1)}")
    PackedLoader(layouts["belady"], cpu_memory=need - 1, queue_depth=2).close()
    short = need - 4 * piece        # room for one staging buffer: the sequential stages' one
    with pytest.raises(ConfigError, match=r"; sequential=True \(the stages one after another\) would fit") as e:
        PackedLoader(layouts["belady"], cpu_memory=short, queue_depth=3)
    assert e.value.render(lambda o: {"sequential": "--sequential"}.get(o, o)).endswith(
        f"; --sequential (the stages one after another) would fit {format_bytes(short)}")
    PackedLoader(layouts["belady"], cpu_memory=short, pipelined=False).close()
    with pytest.raises(ConfigError, match=r"neither a smaller queue depth nor sequential stages would fit"):
        PackedLoader(layouts["belady"], cpu_memory=short - piece, queue_depth=3)


@pytest.mark.parametrize("layout", ["belady", "ginex", "dcache", "gpu-tier"])
@pytest.mark.parametrize("device_path", [False, True], ids=["host", "device-path"])
def test_batches_larger_than_a_staging_buffer_load_in_pieces(layouts: dict[str, Path], tiny_store: Path,
                                                             layout: str, device_path: bool) -> None:
    """Staging buffers of a few rows: every batch is read in many pieces (segments cut at rows), still exact,
    at queue depth 1 and sequentially."""
    feats = Store(tiny_store).read_features()
    with PackedLoader(layouts[layout]) as ref:
        expect = [b.x.clone() for b in ref]
    for kw in ({"queue_depth": 1}, {"pipelined": False}):
        with PackedLoader(layouts[layout], **kw) as loader:
            loader._device_path = device_path
            rb = loader.row_bytes
            loader.memory["staging_piece_bytes"] = 3 * 4096 + 5 * rb    # a few rows, cut anywhere in a page
            got = []
            for b in loader:
                assert torch.equal(b.x, torch.from_numpy(feats[b.n_id.numpy()]))
                got.append(b.x.clone())
            assert len(got) == len(expect) and all(torch.equal(a, c) for a, c in zip(got, expect, strict=True))
            assert all(buf.nbytes == 3 * 4096 + 5 * rb for buf in loader._buffers)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_bad_queue_depth_is_a_config_error(layouts: dict[str, Path], bad: object) -> None:
    with pytest.raises(ConfigError, match="^queue_depth"):
        PackedLoader(layouts["belady"], queue_depth=bad)  # type: ignore[arg-type]


def test_missing_labels_or_dataset_are_input_errors(layouts: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a finished packed dataset"):
        PackedLoader(tmp_path)
    copy = tmp_path / "packed"
    shutil.copytree(layouts["belady"], copy)
    (copy / "labels.npy").unlink()
    with pytest.raises(InputError, match="labels"):
        PackedLoader(copy)


def test_an_index_address_outside_its_tier_is_an_input_error_naming_the_tier(layouts: dict[str, Path]) -> None:
    """The load stage's check of a batch's index (`PackedDataset._check_bounds`): each source's addresses
    against its size; the error names the index, the batch, the tier and its size."""
    import dataclasses

    from diskflow.operators.formats.packed import SRC_CPU, SRC_DCACHE, SRC_STORE

    with PackedDataset(layouts["belady"]) as ds:
        rec = ds.index(ds.superbatches[0].key)[0]
        g, c, k = int(ds.gpu_ids.shape[0]), int(ds.cpu_ids.shape[0]), rec.packed_rows
        ds._check_bounds(rec, g, c, k, None)        # as written: in range

        def bad(code: int, value: int, **kw: np.ndarray) -> str:
            src, idx = rec.src.copy(), rec.idx.astype(np.int64)
            at = int(np.flatnonzero(src == SRC_PACKED)[0])
            src[at], idx[at] = code, value
            with pytest.raises(InputError) as e:
                ds._check_bounds(dataclasses.replace(rec, src=src, idx=idx, **kw), g, c, k, None)
            assert str(e.value).startswith(str(ds.round_dir / "index"))
            return str(e.value)

        assert f"batch {rec.batch}: CPU tier address out of range (max {c}, size {c})" in bad(SRC_CPU, c)
        assert f"batch {rec.batch}: CPU tier address out of range" in bad(SRC_CPU, -1)
        assert f"packed rows address out of range (max {k + 5}, size {k})" in bad(SRC_PACKED, k + 5)
        assert "disk cache address out of range (max 0, size 0)" in bad(SRC_DCACHE, 0)
        assert f"store row out of range (max {ds.num_nodes}, {ds.num_nodes} nodes)" in bad(SRC_STORE, ds.num_nodes)
        assert "unknown source code 9" in bad(9, 0)
        assert "CPU insert out of range" in bad(SRC_PACKED, 0, insert_pos=np.array([0], np.int64),
                                                insert_slot=np.array([c], np.int64))
