"""The start of a streamed run, before its first superbatch is submitted: the GPU workers' devices and
scratch floors (``probe``), the data-parallel process group, the checks that the workers found can run
it, and the partition of partition batches.

Each is done once, by a task or two whose result the driver (`driver.StreamRun`) waits for, so
these are plain functions of what they need; the driver keeps what they return.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...operators.prepare.partition import default_parts
from ..graph import partition_task
from .config import PARTITION_FILE, StreamConfig
from .lanes import Lane
from .tasks import group_master_task, join_group_task, probe_task
from .workers import on_gpu

__all__ = ["check_one_host", "join_group", "make_partition", "probe_gpu_workers"]


def check_one_host(lanes: list[Lane]) -> None:
    """A shared CPU tier lives in one machine's memory: refuse GPU workers on several hosts."""
    from distributed.comm import get_address_host

    hosts = sorted({get_address_host(lane.gpu_addr) for lane in lanes})
    if len(hosts) > 1:
        raise ConfigError("cache", f"a shared CPU tier lives in one machine's memory; the GPU workers are on "
                                   f"{', '.join(hosts)} (use cache='per-worker')")


def probe_gpu_workers(client: Any, lanes: list[Lane], tok: str, want: str | None) -> list[dict[str, Any]]:
    """Each GPU worker's device and scratch read floor (a ``probe`` task each); sets each lane's device (its
    worker's own, cuda:K each, unless `want` names another) and refuses devices of different kinds."""
    many = len(lanes) > 1
    infos: list[dict[str, Any]] = client.gather([
        client.submit(probe_task, key=f"probe-{tok}" + (f"-g{lane.rank}" if many else ""), pure=False,
                      **on_gpu(lane, 0, 0)) for lane in lanes])
    for lane, info in zip(lanes, infos):
        own = str(info["device"])
        lane.device = own if want is None or (want == "cuda" and own.startswith("cuda")) else want
    kinds = sorted({lane.device.split(":")[0] for lane in lanes})
    if len(kinds) > 1:
        raise ConfigError("device", f"the GPU workers train on different kinds of device ({', '.join(kinds)}); "
                                    "give them the same device")
    return infos


def join_group(client: Any, lanes: list[Lane], run_id: str, tok: str, timeout_s: float) -> dict[str, Any]:
    """A data-parallel run: every GPU worker joins the run's process group (rank = its lane); the group's
    figures for the report (world, backend, rendezvous, each worker's rank)."""
    world = len(lanes)
    host, port = client.submit(group_master_task, run_id, world, key=f"group-master-{tok}", pure=False,
                               **on_gpu(lanes[0], 0, 0)).result()
    joins = [client.submit(join_group_task, lane.run, run_id, host, port, lane.rank, world, timeout_s,
                           key=f"group-join-{tok}-g{lane.rank}", pure=False, **on_gpu(lane, 0, 0))
             for lane in lanes]
    members = client.gather(joins)
    return {"world": world, "backend": members[0]["backend"], "rendezvous": f"{host}:{port}",
            "ranks": {m["address"]: m["rank"] for m in members}}


def make_partition(client: Any, store: Any, store_path: str, run_dir: Path, cfg: StreamConfig, resume: bool,
                   tok: str, cpu: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    """Partition batches: the graph's min-cut parts, computed once by a task on a CPU worker (placed by `cpu`)
    into the run directory; the partition's figures and its file.

    The CPU workers' sample tasks read the file there, so it must be on a filesystem they share
    with the driver, as the store is; a resumed run keeps the parts it started with.
    """
    path = (run_dir / PARTITION_FILE).resolve()
    if resume and path.is_file():
        partition: dict[str, Any] = {"path": str(path), "cached": True}
    else:
        parts = default_parts(int(store.split_ids("train").shape[0]), store.num_nodes, cfg.partitions,
                              cfg.batch_size)
        fut = client.submit(partition_task, store_path, parts, "kaminpar", cfg.seed, 1, str(path),
                            key=f"partition-{tok}", pure=False, **cpu)
        partition = {**fut.result(), "cached": False}
    partition["group_by"] = cfg.group_by
    return partition, path
