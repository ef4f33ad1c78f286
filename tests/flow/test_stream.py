"""The streamed run on an embedded cluster (in-process workers, so a test can reach into them): the same losses
and weights as prepare-then-train, placement by resource, a window that bounds scratch and look-ahead, a
superbatch re-shipped once, a lost GPU worker stopping the run with a position that --resume continues, and
clear errors for a scheduler that cannot be reached, a missing GPU worker and a quota that is too small."""
from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

distributed = pytest.importorskip("distributed")    # before any import that needs it, so the module skips


import dask
from dask.utils import key_split
from diskflow.cli import report as report_cmd
from diskflow.cli.stream_options import RUN_OPTIONS, add_run_arguments, resume_dir
from diskflow.flow import stream as stream_mod
from diskflow.flow.roles import stream_client
from diskflow.flow.rundir import new_run_dir
from diskflow.flow.stream import StreamStopped
from diskflow.flow.stream import tasks as stream_tasks
from diskflow.operators.prepare.history import EMBEDDING_BYTES
from diskflow.operators.stream import ship as stream_ship
from diskflow.operators.train.checkpoint import latest_checkpoint, load_checkpoint
from diskflow.pipelines import belady, streaming

from diskflow.errors import ConfigError, DiskflowError, InputError

# device "cpu" for both sides: on a machine with CUDA the embedded GPU worker would otherwise train there, and
# the per-batch losses are compared bit for bit with the offline run's, which trains on the CPU
SETTINGS: dict[str, Any] = {"model": "sage", "hidden": 16, "fanouts": (5, 5), "batch_size": 256, "epochs": 2,
                            "lr": 0.01, "dropout": 0.2, "seed": 1, "threads": 1, "superbatch_size": 3, "device": "cpu"}
EMBEDDED: dict[str, Any] = {"workers": 1, "processes": False, "progress": False}
PREP = ("sample", "plan", "pack")


pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.plots]    # the timeline is drawn


def _losses(report: dict[str, Any]) -> list[float]:
    return [x for r in report["epochs"] for x in r["losses"]]


def _model(run_dir: str | Path) -> dict[str, torch.Tensor]:
    ck = latest_checkpoint(Path(run_dir) / "checkpoints")
    assert ck is not None
    return load_checkpoint(ck).state["model"]


def _same_model(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def reference(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The single-machine run: belady prepares the whole round, then trains it (same seed)."""
    with dask.config.set(scheduler="sync"):
        rep = belady.run(tiny_store, new_run_dir(tmp_path_factory.mktemp("runs"), "ref"), progress=False, **SETTINGS)
    return {"losses": _losses(rep), "model": _model(rep["run_dir"]), "val": [r["val_acc"] for r in rep["epochs"]]}


def _held(dask_scheduler: Any) -> int:
    """Runs on the scheduler: results of sample/plan/pack tasks held in workers' memory."""
    return sum(1 for ts in dask_scheduler.tasks.values()
               if ts.state == "memory" and key_split(ts.key) in ("sample", "plan", "pack"))


@pytest.fixture(scope="module")
def streamed(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    run_dir = new_run_dir(tmp_path_factory.mktemp("runs"), "stream")
    held: list[int] = []
    rep = streaming.run(tiny_store, run_dir, window=2, quota="3MiB", **EMBEDDED, **SETTINGS,
                        on_superbatch=lambda out: held.append(distributed.get_client().run_on_scheduler(_held)))
    rep["held"] = held
    return rep


def test_streaming_equals_prepare_then_train(streamed: dict[str, Any], reference: dict[str, Any]) -> None:
    assert _losses(streamed) == reference["losses"], "every batch's loss, bit for bit"
    assert _same_model(_model(streamed["run_dir"]), reference["model"]), "the final weights"
    assert [r["val_acc"] for r in streamed["epochs"]] == reference["val"]
    assert streamed["stream"]["trained"] == streamed["stream"]["superbatches"] == 8


def test_partition_batches_stream_as_they_prepare(tiny_store: Path, tmp_path: Path) -> None:
    part = {"batches": "partition", "partitions": 8, "parts_per_group": 2}
    with dask.config.set(scheduler="sync"):
        ref = belady.run(tiny_store, new_run_dir(tmp_path, "ref"), progress=False, **SETTINGS, **part)
    rep = streaming.run(tiny_store, new_run_dir(tmp_path, "stream"), window=2, **EMBEDDED, **SETTINGS, **part)
    assert _losses(rep) == _losses(ref), "the same partition, batches and weighed losses"
    assert rep["partition"]["parts"] == 8 and rep["partition"]["group_by"] == "label"
    assert (Path(rep["run_dir"]) / "partition.npy").is_file()
    assert rep["config"]["train"]["label_prior"] == pytest.approx(ref["config"]["label_prior"])
    with pytest.raises(ConfigError, match="^parts_per_group"):
        streaming.run(tiny_store, tmp_path / "bad", window=2, parts_per_group=3, **EMBEDDED, **SETTINGS)


def test_a_history_cache_streams_as_it_prepares(tiny_store: Path, tmp_path: Path) -> None:
    hist = {"history_memory": 64 * SETTINGS["hidden"] * EMBEDDING_BYTES, "history_staleness": 5,     # 64 embeddings
            "history_ramp": 0.5, "history_cooldown": 0.2}
    with dask.config.set(scheduler="sync"):
        ref = belady.run(tiny_store, new_run_dir(tmp_path, "ref"), progress=False, **SETTINGS, **hist)
    rep = streaming.run(tiny_store, new_run_dir(tmp_path, "stream"), window=2, **EMBEDDED, **SETTINGS, **hist)
    assert ref["history"]["pruned"] > 0
    assert _losses(rep) == _losses(ref), "the same pruned samples, the same table"
    assert rep["config"]["history_rows"] == ref["history"]["rows"] == rep["config"]["train"]["history_rows"]
    assert (rep["config"]["history_ramp"], rep["config"]["history_cooldown"]) == (0.5, 0.2) == \
        (ref["history"]["ramp"], ref["history"]["cooldown"])
    with pytest.raises(ConfigError, match="^history_memory"):
        streaming.run(tiny_store, tmp_path / "auto", window=2, history_memory="auto", **EMBEDDED, **SETTINGS)


def test_placement_by_resource(streamed: dict[str, Any]) -> None:
    s = streamed["stream"]
    gpu = s["gpu_worker"]
    for e in streamed["timeline"]:
        assert e["phases"]["ship"]["worker"] == e["phases"]["train"]["worker"] == gpu
        assert all(e["phases"][p]["worker"] != gpu and e["phases"][p]["worker"] in s["cpu_workers"] for p in PREP)


def test_window_bounds_scratch_and_lookahead(streamed: dict[str, Any]) -> None:
    s, tl, w = streamed["stream"], streamed["timeline"], streamed["stream"]["window"]
    scratch = s["scratch"]
    assert 0 < scratch["peak_disk"] <= scratch["quota"] == 3 << 20
    assert scratch["peak_staged"] <= w + 1, "at most W superbatches (and the base tiers) staged at once"
    assert scratch["used"] == 0 and not scratch["staged"], "consumed superbatches were deleted"
    assert all(e["held_bytes"] > 0 for e in tl), "index and samples were held in memory (the default budget)"
    assert 0 < scratch["peak_memory"] <= scratch["hold_memory"] and scratch["memory"] == 0
    assert scratch["peak_memory"] <= (w + 1) * max(e["held_bytes"] for e in tl)
    assert not [p for p in (Path(streamed["run_dir"]) / "scratch").iterdir()], "the run's scratch is gone"
    for k in range(len(tl) - w):
        assert tl[k + w]["phases"]["plan"]["start"] >= tl[k]["phases"]["train"]["end"], \
            f"superbatch {k + w} was prepared before superbatch {k} had trained"
    for a, b in itertools.pairwise(tl):
        assert b["phases"]["train"]["start"] >= a["phases"]["train"]["end"], "training is in stream order"
        assert a["prepared"] <= a["shipped"] <= a["phases"]["train"]["start"]
    assert 0 <= s["gpu_idle_fraction"] < 1 and s["stream_s"] > s["train_busy_s"] > 0
    assert len(streamed["held"]) == 8 and max(streamed["held"]) <= 3 * w + 3 < 3 * 8, \
        f"preprocessing results are released as they are consumed: {streamed['held']}"


def test_the_first_superbatch_gets_the_cpu_workers_first(streamed: dict[str, Any]) -> None:
    """Only the head (tier samples, counts, tiers, base) and superbatch 0 are prepared before plan 0 is done."""
    tl = streamed["timeline"]
    plan0 = tl[0]["phases"]["plan"]["end"]
    assert all(e["phases"]["sample"]["start"] >= plan0 for e in tl[2:]), \
        [(e["key"], e["phases"]["sample"]["start"], plan0) for e in tl[2:] if e["phases"]["sample"]["start"] < plan0]
    assert tl[1]["phases"]["sample"]["start"] < plan0, "superbatch 1's sample is the first plan's lookahead"


def test_one_cpu_worker_packs_before_it_samples_ahead(streamed: dict[str, Any]) -> None:
    """With one CPU worker, sampling never runs ahead of a pack the GPU worker is waiting for: sample k+2 (plan
    k+1's lookahead) starts after pack k, and plan k+1 before sample k+3."""
    tl = streamed["timeline"]
    assert len(streamed["stream"]["cpu_workers"]) == 1
    for k in range(len(tl) - 2):
        assert tl[k + 2]["phases"]["sample"]["start"] >= tl[k]["phases"]["pack"]["start"], tl[k + 2]["key"]
    for k in range(len(tl) - 3):
        assert tl[k + 3]["phases"]["sample"]["start"] >= tl[k + 1]["phases"]["plan"]["start"], tl[k + 3]["key"]


def test_stream_breakdown_adds_up(streamed: dict[str, Any]) -> None:
    """`diskflow bench stream` splits the stream into fill + training + gaps, from the report alone."""
    from diskflow.bench.stream import stream_breakdown

    parts, s, tl = stream_breakdown(streamed), streamed["stream"], streamed["timeline"]
    assert parts["fill_s"] + parts["train_busy_s"] + parts["gaps_s"] == pytest.approx(s["stream_s"], abs=1e-9)
    assert parts["fill_s"] == tl[0]["phases"]["train"]["start"] > 0
    assert parts["train_busy_s"] == pytest.approx(s["train_busy_s"])
    assert 0 <= parts["starved_s"] <= parts["gaps_s"] and parts["max_gap_s"] <= parts["gaps_s"]
    assert 0 < parts["tail_s"] <= s["stream_s"] and parts["train_task_extra_s"] > 0


def test_bench_reports_where_the_features_came_from(streamed: dict[str, Any]) -> None:
    """`diskflow bench stream` says how much of the round the CPU tier held and how much was packed and shipped."""
    from diskflow.bench.stream import _feature_tiers

    nodes = streamed["dataset"]["nodes"]
    f, tl = _feature_tiers(streamed, nodes), streamed["timeline"]
    assert f["cpu_rows"] == streamed["stream"]["tiers"]["cpu_rows"] and f["cpu_share"] == f["cpu_rows"] / nodes
    assert f["packed_rows"] == sum(e["figures"]["packed_rows"] for e in tl) > 0
    assert f["accesses"] == sum(e["figures"][k] for e in tl for k in ("packed_rows", "cpu_hits", "gpu_hits")) \
        > f["packed_rows"]
    assert f["packed_bytes"] == sum(e["figures"]["packed_bytes"] for e in tl) >= f["packed_rows"]
    assert 0 < f["packed_share"] < 1
    assert all(e["bytes"] > e["figures"]["packed_bytes"] for e in tl)     # the index and the samples travel too
    assert f["held_bytes"] == sum(e["held_bytes"] for e in tl) / len(tl) > 0, "and were held in memory"


def test_superbatches_through_a_shared_stage(tiny_store: Path, tmp_path: Path, reference: dict[str, Any]) -> None:
    """--stage URL: bundles go through a shared (fsspec) directory instead of Dask, and are removed there.

    With no memory to hold index and samples (``hold_memory=0``) they are staged on the scratch disk too.
    """
    rep = streaming.run(f"file://{tiny_store}", tmp_path / "run", window=2, stage=f"file://{tmp_path}/shared",
                        hold_memory="0", **EMBEDDED, **SETTINGS)
    assert _losses(rep) == reference["losses"]
    assert all(e["held_bytes"] == 0 for e in rep["timeline"]) and rep["stream"]["scratch"]["peak_memory"] == 0
    assert (tmp_path / "shared").is_dir() and not [p for p in (tmp_path / "shared").rglob("*") if p.is_file()]


def test_report_draws_the_timeline(streamed: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = Path(streamed["run_dir"])
    assert (run_dir / "timeline.png").stat().st_size > 0 and (run_dir / "report.json").is_file()
    (run_dir / "timeline.png").unlink()
    assert report_cmd._run(argparse.Namespace(run=str(run_dir), out=None, page=None)) == 0
    out = capsys.readouterr().out
    assert "superbatches trained   8 of 8 (window 2)" in out and "of quota 3.00 MiB" in out
    assert "held in memory         index and samples, peak " in out and "of 256.00 MiB" in out
    assert (run_dir / "timeline.png").stat().st_size > 0
    assert "diskflow-lanes" in (run_dir / "dashboard.html").read_text(), "the diskflow page's figures"
    with pytest.raises(InputError, match="no report"):
        report_cmd._run(argparse.Namespace(run=str(run_dir / "scratch"), out=None, page=None))


def test_a_superbatch_failing_verification_is_shipped_again(tiny_store: Path, tmp_path: Path, reference: dict[str, Any],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The first arrival of e0-s00001 is corrupted: it is packed and shipped once more and the run is unchanged;
    corrupted every time, the run stops naming it."""
    content = stream_ship._content        # the index is held in memory on arrival (not written)
    hits: list[str] = []

    def flaky(bundle: Any, rel: str) -> np.ndarray:
        data = content(bundle, rel)
        if bundle.key == "e0-s00001" and rel.endswith("index/e0-s00001.arrow") and (always or not hits):
            hits.append(rel)                   # the bytes arrive with one flipped
            data = data.copy()
            data[3] ^= 0xFF
        return data

    monkeypatch.setattr(stream_ship, "_content", flaky)
    always = False
    rep = streaming.run(tiny_store, tmp_path / "once", window=2, **EMBEDDED, **SETTINGS)
    assert hits and rep["stream"]["reshipped"] == ["e0-s00001"]
    assert _losses(rep) == reference["losses"]
    always = True
    with pytest.raises(StreamStopped, match=r"superbatch e0-s00001 failed verification on arrival twice"):
        streaming.run(tiny_store, tmp_path / "always", window=2, **EMBEDDED, **SETTINGS)
    assert not list((tmp_path / "always" / "scratch").iterdir()), "the stopped run's scratch was cleaned up"


def test_gpu_worker_lost_then_resume(tiny_store: Path, tmp_path: Path, reference: dict[str, Any]) -> None:
    """The GPU worker leaves after 3 superbatches: the run stops saying where; --resume finishes it exactly."""
    run_dir = tmp_path / "run"
    trained: list[str] = []

    def lose_gpu(out: dict[str, Any]) -> None:
        trained.append(out["key"])
        if len(trained) == 3:
            client = distributed.get_client()
            gpu = [a for a, w in client.scheduler_info()["workers"].items() if w["resources"].get("GPU")]
            client.retire_workers(gpu, close_workers=True)

    with pytest.raises(StreamStopped, match=r"the GPU worker \S+ left the cluster; [3-4] of 8 superbatches are trained "
                                            r"and the last checkpoint is .*e0000-b00000[69].*resume=True in the run directory"):
        streaming.run(tiny_store, run_dir, window=2, on_superbatch=lose_gpu, **EMBEDDED, **SETTINGS)
    rep = streaming.run(tiny_store, run_dir, window=2, resume=True, **EMBEDDED, **SETTINGS)
    assert rep["resumed_from"] and rep["stream"]["start_index"] in (3, 4)
    assert rep["stream"]["trained"] == 8 - rep["stream"]["start_index"]
    assert _losses(rep) == reference["losses"]
    assert _same_model(_model(run_dir), reference["model"])
    with pytest.raises(ConfigError, match="^resume: the checkpoint .* was made by another run"):
        streaming.run(tiny_store, run_dir, window=2, resume=True, **EMBEDDED, **{**SETTINGS, "lr": 0.02})


def test_quota_too_small_stops_the_run(tiny_store: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^quota: staging .* above its quota of 100.00 KiB"):
        streaming.run(tiny_store, tmp_path / "run", window=2, quota="100KiB", **EMBEDDED, **SETTINGS)
    with pytest.raises(ConfigError, match="^store: 's3://bucket/store': CPU workers memory-map the store"):
        streaming.run("s3://bucket/store", tmp_path / "run", **EMBEDDED, **SETTINGS)


def test_unreachable_scheduler_is_a_clear_error() -> None:
    """The error names the address and the timeout, and Dask gave up after that timeout (its own words, quoted)."""
    with pytest.raises(DiskflowError, match=r"cannot reach the Dask scheduler at tcp://127.0.0.1:9 within 2s "
                                            r"\(Timed out trying to connect to tcp://127.0.0.1:9 after 2 s\)"), \
            stream_client("tcp://127.0.0.1:9", connect_timeout="2s"):
        pass


def test_no_gpu_worker_is_a_clear_error(tiny_store: Path, tmp_path: Path) -> None:
    from diskflow.flow.stream import StreamConfig, StreamRun
    from diskflow.operators.stream.train import StreamTrainConfig

    cfg = StreamConfig(train=StreamTrainConfig(), fanouts=(5, 5), batch_size=256, superbatch_size=3, gpu_wait_s=0.5)
    with distributed.LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client, \
            pytest.raises(StreamStopped, match=r"no worker with the GPU resource joined within 0 s \(1 workers"):
        StreamRun(client, tiny_store, tmp_path, cfg, progress=False).run()


def test_run_command_options() -> None:
    """The flags `diskflow run` adds for split runs parse into the pipeline's keyword arguments."""
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    args = p.parse_args(["--scheduler", "tcp://h:8786", "--window", "3", "--quota", "1GiB", "--gpu-wait", "5"])
    opts = {k: RUN_OPTIONS[k][1](v) for k, v in vars(args).items() if v is not None}
    assert opts == {"scheduler": "tcp://h:8786", "window": 3, "quota": "1GiB", "gpu_wait": 5.0}
    import inspect

    from diskflow.flow.runtimes import stream as stream_runtime

    assert set(RUN_OPTIONS) <= set(inspect.signature(stream_runtime.run).parameters)
    assert set(RUN_OPTIONS) <= set(streaming.PIPELINE.parameters())
    with pytest.raises(ConfigError, match="--window: expected an integer >= 1"):
        RUN_OPTIONS["window"][1]("0")
    assert resume_dir(argparse.Namespace(resume=None)) is None
    with pytest.raises(InputError, match="no checkpoints to resume from"):
        resume_dir(argparse.Namespace(resume="/nonexistent"))
    from diskflow.operators.stream.train import StreamTrainConfig

    base = stream_mod.StreamConfig(train=StreamTrainConfig())
    assert base.fingerprint("s") == stream_mod.StreamConfig(train=StreamTrainConfig(), window=5).fingerprint("s")
    assert base.fingerprint("s") != stream_mod.StreamConfig(train=StreamTrainConfig(), seed=2).fingerprint("s")
    assert base.fingerprint("s") != stream_mod.StreamConfig(train=StreamTrainConfig(hidden=8)).fingerprint("s")


def test_worker_command_checks_its_gpu_options() -> None:
    """`diskflow worker`: the training worker's options need --gpu, and sizes must parse (before Dask starts)."""
    from diskflow.cli import worker as worker_cmd

    p = argparse.ArgumentParser()
    worker_cmd.register(p.add_subparsers())
    with pytest.raises(ConfigError, match="--scratch/--quota/--hold-memory/--device: apply to the training worker"):
        worker_cmd._run(p.parse_args(["worker", "tcp://h:8786", "--hold-memory", "1GiB"]))
    with pytest.raises(ConfigError, match=r"--hold-memory: not a byte size: 'lots'"):
        worker_cmd._run(p.parse_args(["worker", "tcp://h:8786", "--gpu", "--hold-memory", "lots"]))


def test_workers_reuse_freed_memory(streamed: dict[str, Any], tmp_path: Path) -> None:
    """The plugin undoes Dask's MALLOC_TRIM_THRESHOLD_ on every worker, GPU or CPU, unless its config says not to."""
    from types import SimpleNamespace

    from diskflow.flow.plugin import DiskflowPlugin

    assert streamed["stream"]["gpu_info"]["allocator"].startswith("reuse freed memory")

    def worker(gpu: float) -> Any:
        return SimpleNamespace(address="inproc://x", local_directory=str(tmp_path),
                               state=SimpleNamespace(total_resources={"GPU": gpu}))

    for setting, gpu, expected in ((False, 1, "the worker's default"), ("off", 1, "the worker's default"),
                                   (False, 0, "the worker's default"), (True, 0, "reuse freed memory"),
                                   (None, 1, "reuse freed memory"), (None, 0, "reuse freed memory")):
        plugin = DiskflowPlugin()
        with dask.config.set({"diskflow.keep-freed-memory": setting}):
            plugin.setup(worker(gpu))
        assert plugin.allocator.startswith(expected), (setting, gpu, plugin.allocator)


def test_gpu_tasks_on_a_worker_without_the_gpu_resource_are_config_errors(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker without the GPU resource has no scratch space: a GPU task that reaches it is refused with a
    ConfigError naming the resource (an explicit check, not an assert that ``python -O`` removes)."""
    from types import SimpleNamespace

    from diskflow.flow.plugin import DiskflowPlugin, Job

    plugin = DiskflowPlugin()
    plugin.setup(SimpleNamespace(address="inproc://cpu", local_directory=str(tmp_path),
                                 state=SimpleNamespace(total_resources={})))
    with pytest.raises(ConfigError, match="resources: worker inproc://cpu has no GPU resource"):
        plugin.gpu_space()
    plugin.jobs["r"] = Job("r", tmp_path / "r", 0)        # a run's state this worker should never hold
    monkeypatch.setattr(stream_tasks, "_plugin", lambda: plugin)
    with pytest.raises(ConfigError, match="has no GPU resource"):
        stream_tasks.train_task("r", {"dir": str(tmp_path)}, {"index": 0, "key": "e0-s00000"}, None, "cpu", "f", None,
                              False)


def test_a_worker_started_by_hand_reads_its_settings_from_the_environment(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`DASK_DISKFLOW__SCRATCH_QUOTA=... dask worker --resources GPU=1` (Dask keeps such keys with underscores)."""
    from types import SimpleNamespace

    from diskflow.flow.plugin import DiskflowPlugin

    env = {"DASK_DISKFLOW__SCRATCH": str(tmp_path / "scratch"), "DASK_DISKFLOW__SCRATCH_QUOTA": "3MiB",
           "DASK_DISKFLOW__DEVICE": "cpu", "DASK_DISKFLOW__KEEP_FREED_MEMORY": "false",
           "DASK_DISKFLOW__HOLD_MEMORY": "1MiB"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    dask.config.refresh()
    try:
        plugin = DiskflowPlugin()
        plugin.setup(SimpleNamespace(address="inproc://x", local_directory=str(tmp_path),
                                     state=SimpleNamespace(total_resources={"GPU": 1})))
        assert (plugin.quota, plugin.device, plugin.scratch) == (3 << 20, "cpu", tmp_path / "scratch")
        assert plugin.space is not None and plugin.space.hold_memory == 1 << 20
        assert plugin.allocator.startswith("the worker's default")
    finally:
        for k in env:
            monkeypatch.delenv(k)
        dask.config.refresh()
