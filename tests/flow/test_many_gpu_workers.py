"""Many GPU workers on loopback over TLS: `diskflow scheduler`, one CPU worker and two `diskflow worker --gpu
--device cpu` as separate processes, every connection on ``tls://`` with certificates made for the test.

A one-epoch stream with ``--gpus 2`` trains every superbatch's batches split between the two GPU workers
(train tasks ran on both, each on its own share), their weights are equal after every superbatch, and the
final model equals a one-worker run of the same batches with their gradients averaged two by two
(``batches_per_step=2``; tolerance 1e-5 relative, 1e-6 absolute for the float sums' order, though on the
CPU they come out bit for bit). A run interrupted after its third superbatch (mid-epoch, before one where
the second worker has no batch) resumes to the same model. With ``--cache shared`` the two workers keep one
CPU tier of their pooled budgets in shared memory, planned over the merged stream: the same model as
``per-worker`` at the same budget, fewer packed bytes read, the tier's file removed at the end, and an
interrupted run resumes to the same model (one epoch each).
"""
from __future__ import annotations

import json
import shutil
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

from dask.utils import key_split
from diskflow.flow.dashboard import links, state
from diskflow.flow.rundir import new_run_dir
from diskflow.operators.train.checkpoint import latest_checkpoint, load_checkpoint
from diskflow.pipelines import streaming
from processes import start, stop_cluster

# 10 batches an epoch, superbatches of 3, 3, 3 and 1: in the last one the second worker has no batch (it still
# takes part in the step, with a zero gradient); one epoch: crossing epochs is tests/flow/test_stream.py's
pytestmark = pytest.mark.plots      # the timeline is drawn
SETTINGS: dict[str, Any] = {"model": "sage", "hidden": 16, "fanouts": (5, 5), "batch_size": 256, "epochs": 1,
                            "lr": 0.01, "dropout": 0.3, "seed": 5, "threads": 1, "superbatch_size": 3}


def _certificates(root: Path) -> dict[str, str]:
    """A CA and one certificate for 127.0.0.1 signed by it (openssl), as the TLS options take them."""
    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=root)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=diskflow-test-ca")
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=127.0.0.1")
    (root / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    ssl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
        "node.pem", "-days", "2", "-extfile", "san.ext")
    return {"tls_ca_file": str(root / "ca.pem"), "tls_cert": str(root / "node.pem"), "tls_key": str(root / "node.key")}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl makes the test's certificates")
    root = tmp_path_factory.mktemp("tls-cluster")
    tls = _certificates(root)
    flags = ["--tls-ca-file", tls["tls_ca_file"], "--tls-cert", tls["tls_cert"], "--tls-key", tls["tls_key"]]
    sf = root / "scheduler.json"
    procs: dict[str, subprocess.Popen] = {}
    try:
        procs["scheduler"] = start(["scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
                                     "--scheduler-file", str(sf), *flags], root / "scheduler.log")
        deadline = time.monotonic() + 60
        while not sf.exists():
            assert procs["scheduler"].poll() is None and time.monotonic() < deadline, \
                (root / "scheduler.log").read_text()[-2000:]
            time.sleep(0.1)
        common = ["--scheduler-file", str(sf), "--host", "127.0.0.1", "--no-nanny", *flags]
        procs["cpu"] = start(["worker", *common, "--name", "cpu", "--local-directory", str(root / "cpu")],
                              root / "cpu.log")
        for g in ("gpu-0", "gpu-1"):
            procs[g] = start(["worker", *common, "--name", g, "--local-directory", str(root / g), "--gpu",
                               "--scratch", str(root / g / "scratch"), "--device", "cpu"], root / f"{g}.log")
        security = distributed.Security(tls_ca_file=tls["tls_ca_file"], tls_client_cert=tls["tls_cert"],
                                        tls_client_key=tls["tls_key"], require_encryption=True)
        with distributed.Client(scheduler_file=str(sf), timeout="30s", security=security) as client:
            client.wait_for_workers(3, timeout=90)
            client.get_task_stream()      # the scheduler records every task from now on
            names = {w["name"]: a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}
            yield {"root": root, "address": client.scheduler.address, "client": client, "workers": names, "tls": tls,
                   "procs": procs}
    finally:
        stop_cluster(procs, grace_s=5)


class Cut(Exception):
    """Raised by `cut_after`'s callback: the run stops there, as if interrupted."""


def cut_after(index: int) -> Any:
    """An `on_superbatch` callback that interrupts the run once superbatch `index` is trained (and checks that
    the callback gets the superbatch's figures, not the model's state)."""
    def cut(out: dict[str, Any]) -> None:
        assert "checkpoint" not in out
        if out["index"] == index:
            raise Cut
    return cut


def _model(report: dict[str, Any]) -> dict[str, torch.Tensor]:
    return load_checkpoint(latest_checkpoint(Path(report["run_dir"]) / "checkpoints")).state["model"]


WAIT_S = 60.0       # a guard against a hang: the page shows a trained superbatch within a refresh or two


def _page_showing(page: str, k: int, gpus: int) -> dict[str, Any]:
    """The page's figures once they show superbatch k trained on each of `gpus` GPU workers. The run does not wait
    for the page: the workers' events reach the scheduler on their own, and the page's data is recomputed at most
    once a second. An `AssertionError` if it never does within `WAIT_S`."""
    deadline = time.monotonic() + WAIT_S
    while True:
        with urllib.request.urlopen(f"{page}/data.json", timeout=10) as r:
            data = json.loads(r.read())["page"]
        trained = [ln["trained"] for ln in data["lanes"]]
        if len(trained) == gpus and min(trained) >= k + 1:
            return data
        assert time.monotonic() < deadline, \
            f"the page never showed superbatch {k} trained on {gpus} GPU workers within {WAIT_S:.0f} s: it shows " \
            f"run {data['run']} with {trained} trained"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def page_during(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    """What the diskflow page's data said after each superbatch of `two_gpus`, fetched while it ran."""
    return []


@pytest.fixture(scope="module")
def two_gpus(cluster: dict[str, Any], tiny_store: Path, tmp_path_factory: pytest.TempPathFactory,
             page_during: list[dict[str, Any]]) -> tuple[dict[str, Any], float]:
    _, page = links.client_links(cluster["client"])

    def poll(out: dict[str, Any]) -> None:
        page_during.append({"index": out["index"], **_page_showing(page, out["index"], gpus=2)})

    t0 = time.time()
    report = streaming.run(tiny_store, new_run_dir(tmp_path_factory.mktemp("runs"), "dp"), scheduler=cluster["address"],
                           gpus=2, progress=False, on_superbatch=poll, **cluster["tls"], **SETTINGS)
    return report, t0


def test_two_gpu_workers_share_every_superbatch(cluster: dict[str, Any], two_gpus: tuple[dict[str, Any], float],
                                                capsys: pytest.CaptureFixture) -> None:
    report, t0 = two_gpus
    assert cluster["address"].startswith("tls://")
    gpus = {cluster["workers"]["gpu-0"], cluster["workers"]["gpu-1"]}
    s = report["stream"]
    assert s["gpus"] == 2 and set(s["gpu_workers"]) == gpus and s["trained"] == s["superbatches"] == 4
    assert s["group"]["backend"] == "gloo" and sorted(s["group"]["ranks"].values()) == [0, 1]

    where: dict[str, set[str]] = {}
    for t in cluster["client"].get_task_stream(start=t0):
        where.setdefault(key_split(t["key"]), set()).add(t["worker"])
    assert where["train"] == gpus and where["ship"] == gpus, "both GPU workers trained, and only they"
    assert cluster["workers"]["cpu"] in where["pack"] and not where["pack"] & gpus

    for entry in report["timeline"]:        # each worker trained its share: positions r, r + 2, ...
        lanes = entry["lanes"]
        assert [ln["batches"] for ln in lanes] == [(entry["batches"] + 1) // 2, entry["batches"] // 2]
        assert lanes[0]["model_crc"] == lanes[1]["model_crc"], f"models differ after {entry['key']}"
    crcs = [e["lanes"][0]["model_crc"] for e in report["timeline"]]
    assert len(set(crcs)) == len(crcs), "the weights changed every superbatch"
    assert [e["batches"] for e in report["timeline"]] == [3, 3, 3, 1]
    assert s["models_equal"] and s["models_checked"] == 4
    assert len(s["gpu_idle_fraction_per_worker"]) == 2
    for g in ("gpu-0", "gpu-1"):
        assert not list((cluster["root"] / g / "scratch").iterdir()), "each worker's scratch emptied"

    from diskflow.cli import main

    assert main(["report", report["run_dir"]]) == 0      # every GPU worker's idle share, and its row drawn
    text = capsys.readouterr().out
    assert "2, data-parallel (per-worker CPU tiers), models equal after every superbatch: yes" in text
    assert all(a in text for a in gpus) and (Path(report["run_dir"]) / "timeline.png").stat().st_size > 0


def test_the_diskflow_page_shows_both_gpu_workers(cluster: dict[str, Any], two_gpus: tuple[dict[str, Any], float]
                                                 ) -> None:
    """`diskflow scheduler` serves the page; a data-parallel run has a row per GPU worker there, agreeing with
    report.json."""
    report, _ = two_gpus
    dashboard, page = links.client_links(cluster["client"])
    assert dashboard and page == dashboard.replace("/status", "/diskflow")
    assert b"bokeh" in urllib.request.urlopen(page, timeout=10).read().lower()
    with urllib.request.urlopen(f"{page}/data.json?run={report['stream']['run']}", timeout=10) as r:
        snap = json.loads(r.read())["page"]
    gpus = report["stream"]["gpu_workers"]
    assert [(ln["rank"], ln["worker"]) for ln in snap["lanes"]] == list(enumerate(gpus))
    assert all(ln["recent"] and ln["trained"] == report["stream"]["trained"] > 1 for ln in snap["lanes"])
    assert [ln["batches"] for ln in snap["lanes"]] == [ln["batches"] for ln in report["stream"]["lanes"]]
    assert [ln["idle_share"] for ln in snap["lanes"]] == pytest.approx(
        report["stream"]["gpu_idle_fraction_per_worker"], abs=1e-6)
    assert snap["totals"]["bytes_read"] == sum(ln["io"]["bytes_read"] for ln in report["stream"]["lanes"])
    assert [ln["batches"] for ln in state.from_report(report)["lanes"]] == [ln["batches"] for ln in snap["lanes"]]


def test_the_page_shows_both_gpu_workers_while_they_train(two_gpus: tuple[dict[str, Any], float],
                                                          page_during: list[dict[str, Any]]) -> None:
    """Fetched after each superbatch, before the run ended: both GPU workers' rows, each training."""
    report, _ = two_gpus
    gpus = report["stream"]["gpu_workers"]
    assert [p["index"] for p in page_during] == list(range(report["stream"]["superbatches"]))
    during = page_during[:-1]       # the last poll comes after the last superbatch trained
    assert during and all(p["run"] == report["stream"]["run"] for p in during)
    for p in during:
        assert [(ln["rank"], ln["worker"]) for ln in p["lanes"]] == list(enumerate(gpus)), p["lanes"]
    # superbatches both workers had trained, as the page said then: poll k waited until it showed superbatch k
    # trained (`_page_showing`). When superbatch k's callback runs, only k + 1 .. k + window - 1 can have been
    # prepared, so the page can show at most k + window trained: the first polls come while it still trains.
    trained = [min(ln["trained"] for ln in p["lanes"]) for p in page_during]
    window, total = report["stream"]["window"], report["stream"]["trained"]
    assert total > window and trained == sorted(trained), trained
    assert all(k + 1 <= t <= min(k + window, total) for k, t in enumerate(trained)), trained


def test_two_gpu_workers_equal_one_with_averaged_gradients(cluster: dict[str, Any], tiny_store: Path,
                                                           two_gpus: tuple[dict[str, Any], float],
                                                           tmp_path: Path) -> None:
    report, _ = two_gpus
    ref = streaming.run(tiny_store, new_run_dir(tmp_path, "one"), scheduler=cluster["address"], batches_per_step=2,
                        progress=False, **cluster["tls"], **SETTINGS)
    assert ref["stream"]["gpus"] == 1
    a, b = _model(report), _model(ref)
    assert sorted(a) == sorted(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    la = [x for r in report["epochs"] for x in r["losses"]]
    lb = [x for r in ref["epochs"] for x in r["losses"]]
    assert la == pytest.approx(lb, rel=1e-5, abs=1e-6) and len(la) == 10
    for ra, rb in zip(report["epochs"], ref["epochs"]):
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-5) and ra["test_acc"] == pytest.approx(rb["test_acc"])
    # and one step per batch is another model: the test can tell the two apart
    plain = streaming.run(tiny_store, new_run_dir(tmp_path, "plain"), scheduler=cluster["address"], progress=False,
                          **cluster["tls"], **SETTINGS)
    assert plain["epochs"][0]["losses"][2:10] != pytest.approx(la[2:10], rel=1e-3)


def _quarter(store_path: Path, settings: dict[str, Any]) -> int:
    """A budget whose CPU tier holds at most a quarter of the features (on the worker with the smallest
    staging), as `diskflow bench stream --gpus 2` sizes it."""
    from types import SimpleNamespace

    from diskflow.bench.stream_gpus import quarter_budget
    from diskflow.flow.runtimes.packed import packed_budgets
    from diskflow.operators.formats.store import Store

    st = Store(store_path)
    b = packed_budgets(st, None, 0, None, settings["fanouts"], settings["batch_size"])
    args = SimpleNamespace(batch_size=settings["batch_size"], superbatch_size=settings["superbatch_size"],
                           epochs=settings["epochs"], fanouts=settings["fanouts"], seed=settings["seed"])
    return quarter_budget(st, args, 2, b["staging_batches"], b["io_reserve"])


def _packed(report: dict[str, Any]) -> int:
    return sum(int(ln["figures"].get("packed_bytes", 0)) for e in report["timeline"] for ln in e["lanes"])


def test_a_shared_cpu_tier_trains_the_same_model_from_fewer_disk_reads(cluster: dict[str, Any], tiny_store: Path,
                                                                        tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    settings = SETTINGS         # four superbatches: a shared tier, its reads and a resume need no more
    opts = {"scheduler": cluster["address"], "gpus": 2, "cpu_memory": _quarter(tiny_store, settings),
            "progress": False, **cluster["tls"], **settings}
    own = streaming.run(tiny_store, new_run_dir(tmp_path, "own"), cache="per-worker", **opts)
    shared = streaming.run(tiny_store, new_run_dir(tmp_path, "shared"), cache="shared", **opts)
    nodes = own["dataset"]["nodes"]
    own_rows = [ln["tiers"]["cpu_rows"] for ln in own["stream"]["lanes"]]
    shared_rows = {ln["tiers"]["cpu_rows"] for ln in shared["stream"]["lanes"]}
    assert max(own_rows) <= nodes // 4 and len(shared_rows) == 1
    assert max(own_rows) < shared_rows.pop() <= sum(own_rows) + 1, "one tier of both workers' budgets"
    assert shared["stream"]["cache"] == "shared" and shared["stream"]["models_equal"]
    assert [x for r in shared["epochs"] for x in r["losses"]] == [x for r in own["epochs"] for x in r["losses"]]
    a, b = _model(shared), _model(own)
    assert all(torch.equal(a[k], b[k]) for k in a), "bit-exact features from either tier: the same model"
    assert 0 < _packed(shared) < _packed(own), (_packed(shared), _packed(own))
    assert not list(Path("/dev/shm").glob(f"diskflow-{shared['stream']['run']}*")), "the tier's file is removed"

    run_dir = new_run_dir(tmp_path, "cut-shared")
    with pytest.raises(Cut):
        streaming.run(tiny_store, run_dir, cache="shared", window=1, on_superbatch=cut_after(1), **opts)
    opts["gpus"] = 0            # --gpus all: both GPU workers, as the checkpoint was made with
    capsys.readouterr()
    resumed = streaming.run(tiny_store, run_dir, cache="shared", resume=True, **opts)
    assert resumed["stream"]["start_index"] == 2 and resumed["stream"]["gpus"] == 2
    assert "this run trains on" not in capsys.readouterr().err, "no note that some GPU workers sit idle"
    c = _model(resumed)
    assert all(torch.equal(a[k], c[k]) for k in a)


def test_an_interrupted_two_gpu_run_resumes_to_the_same_model(cluster: dict[str, Any], tiny_store: Path,
                                                               two_gpus: tuple[dict[str, Any], float],
                                                               tmp_path: Path) -> None:
    """Cut after the third superbatch (mid-epoch): the resumed run starts at the epoch's 1-batch superbatch,
    where the second worker's share is empty (its trainer starts with no superbatch of its own), and ends with
    the uninterrupted run's model and losses."""
    from diskflow.errors import ConfigError

    report, _ = two_gpus
    run_dir = new_run_dir(tmp_path, "cut-at-short")
    opts = {"scheduler": cluster["address"], "gpus": 2, "progress": False, **cluster["tls"], **SETTINGS}
    with pytest.raises(Cut):
        streaming.run(tiny_store, run_dir, window=1, on_superbatch=cut_after(2), **opts)
    resumed = streaming.run(tiny_store, run_dir, resume=True, **opts)
    assert resumed["resumed_from"] and resumed["stream"]["start_index"] == 3
    assert resumed["timeline"][0]["lanes"][1]["batches"] == 0
    a, b = _model(resumed), _model(report)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["loss"] for r in resumed["epochs"]] == [r["loss"] for r in report["epochs"]]
    with pytest.raises(ConfigError, match=r"^gpus: 2 GPU workers share batches of which an epoch holds 1"):
        streaming.run(tiny_store, new_run_dir(tmp_path, "one-batch"), **{**opts, "batch_size": 4096})


def test_a_lost_gpu_worker_stops_the_run_naming_its_last_checkpoint(cluster: dict[str, Any], tiny_store: Path,
                                                                    tmp_path: Path) -> None:
    """The last test on the cluster: it kills one of its GPU workers."""
    from diskflow.flow.stream import StreamStopped

    def kill(out: dict[str, Any]) -> None:
        if out["index"] == 2:
            cluster["procs"]["gpu-1"].kill()

    run_dir = new_run_dir(tmp_path, "lost")
    with pytest.raises(StreamStopped) as e:
        streaming.run(tiny_store, run_dir, scheduler=cluster["address"], gpus=2, progress=False, on_superbatch=kill,
                      gpu_wait=5, **cluster["tls"], **SETTINGS)
    message = str(e.value)
    assert "the last checkpoint is" in message and f"resume=True in the run directory {run_dir}" in message, message
    assert cluster["procs"]["gpu-1"].wait(timeout=10) == -signal.SIGKILL


def test_tls_options_name_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from diskflow.cli import main

    cert = tmp_path / "node.pem"
    cert.write_text("x")
    for argv in (["worker", "tls://127.0.0.1:1"], ["scheduler"]):
        assert main([*argv, "--tls-ca-file", str(tmp_path / "ca.pem"), "--tls-cert", str(cert)]) == 2
        assert f"--tls-ca-file: {tmp_path / 'ca.pem'}: no such file" in capsys.readouterr().err
    assert main(["worker", "tls://127.0.0.1:1", "--tls-cert", str(cert)]) == 2
    assert "TLS needs the CA certificate" in capsys.readouterr().err
