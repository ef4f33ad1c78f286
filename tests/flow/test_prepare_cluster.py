"""`prepare` on a process LocalCluster: the same bytes as the sync scheduler, and a worker killed
in the middle of packing never leaves a published dataset that is incomplete or corrupt."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import dask
import pytest

distributed = pytest.importorskip("distributed")    # before any import that needs it, so the module skips
from diskflow.flow.prepare import PrepareConfig, PrepareResult, prepare
from diskflow.operators.formats.store import Store
from diskflow.operators.formats.threadbuffers import kept_thread_buffer_bytes
from diskflow.operators.formats.verify import verify
from diskflow.operators.prepare.plan import release_planner_scratch
from diskflow.operators.prepare.sampler_pool import idle_samplers

BASE = {"fanouts": (5, 5), "batch_size": 192, "superbatch_size": 3, "epochs": 2, "seed": 5,
        "disk_budget": 3 << 20, "device": "cuda"}   # segmented disk cache + GPU tier: every target file is shared


def _files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def config(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> PrepareConfig:
    rb = Store(tiny_store).row_bytes
    with dask.config.set(scheduler="sync"):
        r = prepare(tiny_store, tmp_path_factory.mktemp("staging") / "out",
                    PrepareConfig(**{**BASE, "disk_budget": None}, cpu_memory=1 << 30, gpu_memory=rb), quiet=True)
    return PrepareConfig(**BASE, cpu_memory=int(r.figures["staging_bytes"]) + 500 * rb, gpu_memory=200 * rb)


@pytest.fixture(scope="module")
def reference(tiny_store: Path, config: PrepareConfig, tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[PrepareResult, dict[str, bytes]]:
    """The packed dataset made with the synchronous scheduler (before any Client exists)."""
    with pytest.raises(ValueError):
        distributed.default_client()
    with dask.config.set(scheduler="sync"):
        r = prepare(tiny_store, tmp_path_factory.mktemp("sync") / "out", config, quiet=True)
    assert r.figures["dcache_rows"] > 0 and r.figures["gpu_hits"] > 0
    return r, _files(r.path)


@pytest.fixture(scope="module")
def client(reference: Any) -> Any:
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as c, \
            distributed.Client(c) as cl:
        yield cl


def test_cluster_run_gives_the_same_bytes_as_the_sync_scheduler(tiny_store: Path, config: PrepareConfig,
                                                                 reference: Any, client: Any, tmp_path: Path) -> None:
    ref, ref_files = reference
    with distributed.get_task_stream(client) as stream:
        r = prepare(tiny_store, tmp_path / "out", config, quiet=True)
    assert not r.skipped
    pack_workers = {t["worker"] for t in stream.data if str(t["key"]).startswith("pack-r0-p")}
    assert len({str(t["key"]) for t in stream.data if str(t["key"]).startswith("pack-r0-p")}) == 5
    assert len({t["worker"] for t in stream.data}) == 2 and pack_workers
    got = _files(r.path)
    assert sorted(got) == sorted(ref_files)
    assert [k for k in got if got[k] != ref_files[k]] == [], "index, part, tier and manifest bytes all equal"
    assert r.figures == ref.figures
    verify(r.path, full=True)
    assert set(client.run(idle_samplers).values()) == {0}, "the workers' sampler pools were emptied"
    assert set(client.run(kept_thread_buffer_bytes).values()) == {0}, "and their threads' buffers let go"
    assert set(client.run(release_planner_scratch).values()) == {0}, "and the planner's scratch"


WAIT_S = 120.0      # a guard against a hang, far beyond what the tiny store's prepare takes


def _set_allowed_failures(dask_scheduler: Any, n: int) -> int:
    old, dask_scheduler.allowed_failures = dask_scheduler.allowed_failures, n
    return old


@pytest.mark.parametrize("allowed_failures", [3, 0], ids=["task-retried", "run-fails"])
def test_worker_killed_while_packing(allowed_failures: int, tiny_store: Path, config: PrepareConfig, reference: Any,
                                     client: Any, tmp_path: Path) -> None:
    """SIGKILL the worker that is half-way through writing a part file.

    The first part-file write of the run stops half-way (it writes half its bytes, leaves a marker
    naming the process, and waits to be killed), so the kill lands mid-write. With the scheduler's
    default retries the run finishes with the reference bytes; with none it fails with a clear
    error, leaves no manifest, and a re-run gives the reference bytes.
    """
    _, ref_files = reference
    marks = tmp_path / "marks"
    marks.mkdir()
    out = tmp_path / "out"
    client.wait_for_workers(2, timeout=WAIT_S)
    pids = set(client.run(os.getpid).values())

    def halt_first_part_write(marker_dir: str) -> None:   # runs in each worker process
        from diskflow.operators.prepare import writers

        real = getattr(writers, "_real_write_all", writers._write_all)
        writers._real_write_all = real

        def write_all(fd, view, path, offset=None):
            if not Path(path).name.startswith("part-"):      # a tier rows file's write, not a part file's
                return real(fd, view, path, offset)
            try:        # the first part-file write of the run, on whichever worker it comes
                os.close(os.open(f"{marker_dir}.claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return real(fd, view, path, offset)
            flat = view.reshape(-1)
            half = flat.shape[0] // 2
            real(fd, flat[:half], path, offset)
            os.fsync(fd)
            Path(marker_dir, str(os.getpid())).touch()
            deadline = time.monotonic() + WAIT_S
            while not Path(f"{marker_dir}.spared").exists() and time.monotonic() < deadline:
                time.sleep(0.05)        # until killed (the test spares the process only if it never kills it)
            return real(fd, flat[half:], path, None if offset is None else offset + flat[:half].nbytes)

        writers._write_all = write_all

    client.run(halt_first_part_write, str(marks))
    old = client.run_on_scheduler(_set_allowed_failures, n=allowed_failures)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = prepare(tiny_store, out, config, quiet=True)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            outcome["error"] = e

    try:
        t0 = time.monotonic()
        th = threading.Thread(target=run, daemon=True)
        th.start()
        while not any(marks.iterdir()):
            assert th.is_alive(), f"prepare ended before packing was interrupted: {outcome}"
            assert time.monotonic() - t0 < WAIT_S, f"no pack task started writing within {WAIT_S:.0f} s"
            time.sleep(0.02)
        victim = int(next(marks.iterdir()).name)
        assert victim in pids, "only a worker of this test's cluster is killed"
        assert list(tmp_path.glob(".out.tmp-*/round-0/.part-*.tmp-*")), "the kill lands mid-write"
        os.kill(victim, signal.SIGKILL)
        th.join(timeout=WAIT_S)
        assert not th.is_alive(), f"prepare did not end within {WAIT_S:.0f} s of a worker's death"
    finally:
        Path(f"{marks}.spared").touch()     # a worker still waiting (the test failed before its kill) goes on
        client.run_on_scheduler(_set_allowed_failures, n=old)

    if allowed_failures:
        assert "result" in outcome, f"the pack task is retried on another worker: {outcome}"
        assert not outcome["result"].skipped
    else:
        e = outcome.get("error")
        assert isinstance(e, distributed.KilledWorker) and "pack-r0-p" in str(e), repr(e)
        assert not out.exists(), "a failed run publishes nothing"
        with distributed.get_task_stream(client) as stream:
            assert not prepare(tiny_store, out, config, quiet=True).skipped
        assert not {str(t["key"]) for t in stream.data if str(t["key"]).startswith(("sample-", "plan-"))}, \
            "the re-run reuses the finished samples and plans"
    got = _files(out)
    assert sorted(got) == sorted(ref_files), "no stray files (half-written parts) in the published dataset"
    assert [k for k in got if got[k] != ref_files[k]] == []
    verify(out, full=True)
    assert not list(tmp_path.glob(".out.tmp-*")), "no staging directory left behind"
