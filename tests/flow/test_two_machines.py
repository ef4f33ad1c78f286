"""Two machines on loopback: `diskflow scheduler`, two CPU workers (`diskflow worker`, and a plain `dask worker`
started as by hand) and one `diskflow worker --gpu` as separate processes, each worker with its own local
directory (nothing shared but the store).
Two epochs stream end to end while one CPU worker is killed: training ran only on the GPU worker and
preprocessing never did, the model equals the single-machine run's, and scratch stayed within its quota."""
from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

distributed = pytest.importorskip("distributed")    # before any import that needs it, so the module skips


import dask
from dask.utils import key_split
from diskflow.flow.rundir import new_run_dir
from diskflow.operators.train.checkpoint import latest_checkpoint, load_checkpoint
from diskflow.pipelines import belady, streaming
from processes import start, stop_cluster

pytestmark = pytest.mark.plots      # the timeline is drawn
SETTINGS: dict[str, Any] = {"model": "sage", "hidden": 16, "fanouts": (5, 5), "batch_size": 256, "epochs": 2,
                            "lr": 0.01, "dropout": 0.2, "seed": 3, "threads": 1, "superbatch_size": 3}
QUOTA = 2 << 20
PREP = ("sample", "count", "count-merge", "tiers-gpu", "tiers", "tiers-trace", "header", "trace", "plan", "pack",
        "pack-base")
GPU_TASKS = ("ship", "ship-base", "train")


def _wait_for(path: Path, procs: list[subprocess.Popen], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            raise RuntimeError(f"{path.name} did not appear")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def machines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("machines")
    sf = root / "scheduler.json"
    procs: dict[str, subprocess.Popen] = {}
    try:
        procs["scheduler"] = start(["scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address",
                                     "127.0.0.1:0", "--scheduler-file", str(sf)], root / "scheduler.log")
        _wait_for(sf, list(procs.values()))
        common = ["--scheduler-file", str(sf), "--host", "127.0.0.1", "--no-nanny"]
        procs["cpu-1"] = start(["worker", *common, "--name", "cpu-1", "--local-directory", str(root / "cpu-1")],
                                root / "cpu-1.log")
        procs["cpu-2"] = start(["worker", *common, "--nthreads", "1", "--name", "cpu-2", "--local-directory",
                                 str(root / "cpu-2")], root / "cpu-2.log", dask_cli=True)   # plain `dask worker`
        procs["gpu"] = start(["worker", *common, "--name", "gpu", "--local-directory", str(root / "gpu"), "--gpu",
                               "--scratch", str(root / "gpu" / "scratch"), "--quota", str(QUOTA), "--device", "cpu"],
                              root / "gpu.log")
        with distributed.Client(scheduler_file=str(sf), timeout="30s") as client:
            client.wait_for_workers(3, timeout=90)
            client.get_task_stream()      # the scheduler records every task from now on
            names = {w["name"]: a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}
            yield {"root": root, "address": client.scheduler.address, "client": client, "procs": procs,
                   "workers": names, "dashboard": client.dashboard_link}
    finally:
        stop_cluster(procs)


def test_two_epochs_on_separate_processes(machines: dict[str, Any], tiny_store: Path, tmp_path: Path) -> None:
    client, workers, procs = machines["client"], machines["workers"], machines["procs"]
    gpu = workers["gpu"]
    killed: list[str] = []

    def kill_a_cpu_worker(out: dict[str, Any]) -> None:
        """After the third superbatch, SIGKILL the CPU worker that packed it (it holds the plan chain)."""
        if out["index"] == 2:
            victim = next(n for n, a in workers.items() if a == out["timing"]["pack"]["worker"])
            procs[victim].kill()
            killed.append(victim)

    t0 = time.time()
    run_dir = new_run_dir(tmp_path, "split")
    report = streaming.run(tiny_store, run_dir, scheduler=machines["address"], window=2, progress=False,
                           on_superbatch=kill_a_cpu_worker, **SETTINGS)
    assert killed and procs[killed[0]].wait(timeout=10) == -signal.SIGKILL
    assert report["stream"]["trained"] == report["stream"]["superbatches"] == 8

    # placement, from the scheduler's own record of every task
    where: dict[str, set[str]] = {}
    stream = client.get_task_stream(start=t0)
    for t in stream:     # grouped as the dashboard groups them
        where.setdefault(key_split(t["key"]), set()).add(t["worker"])
    assert where["train"] == {gpu} and where["ship"] == {gpu}, "ship and train ran on the GPU worker only"
    for group in PREP:
        assert where.get(group) and gpu not in where[group], f"{group}-* never ran on the GPU worker"
    assert {workers["cpu-1"], workers["cpu-2"]} >= set().union(*(where[g] for g in PREP))
    assert set(where) <= {*PREP, *GPU_TASKS, "probe", "finish"}, sorted(where)

    # the model equals the single-machine run's
    torch.set_num_threads(1)
    with dask.config.set(scheduler="sync"):
        ref = belady.run(tiny_store, new_run_dir(tmp_path, "single"), progress=False, **SETTINGS)
    assert [x for r in report["epochs"] for x in r["losses"]] == [x for r in ref["epochs"] for x in r["losses"]]
    a = load_checkpoint(latest_checkpoint(run_dir / "checkpoints")).state["model"]
    b = load_checkpoint(latest_checkpoint(Path(ref["run_dir"]) / "checkpoints")).state["model"]
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)

    # scratch: within its quota all along (bytes really on disk, measured after every arrival), emptied at the end
    scratch = report["stream"]["scratch"]
    assert scratch["quota"] == QUOTA and 0 < scratch["peak_disk"] <= QUOTA and scratch["peak"] <= QUOTA
    assert scratch["peak_staged"] <= 3
    gpu_scratch = machines["root"] / "gpu" / "scratch"
    assert not list(gpu_scratch.iterdir()), "consumed superbatches and the run's directory were deleted"
    assert not (machines["root"] / "cpu-1" / "scratch").exists(), "CPU workers stage nothing"

    # the dashboard is up and the report's timeline renders
    with urllib.request.urlopen(machines["dashboard"], timeout=10) as r:
        assert r.status == 200
    assert (run_dir / "timeline.png").stat().st_size > 0
    assert json.loads((run_dir / "report.json").read_text())["stream"]["gpu_worker"] == gpu
