"""The workers of a streamed run: the GPU workers it trains on (the workers with the `GPU` resource, waited for
up to ``gpu_wait_s``), the CPU workers it samples, plans and packs on (every other worker), the checks of
``--gpus`` against the GPU workers found, the placement of a task on a GPU worker, and the health check that
stops a run whose workers left.
`flow.stream.driver.StreamRun` calls these; they hold no state of their own.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import ConfigError
from ..plugin import GPU
from .config import StreamConfig, StreamStopped
from .lanes import Lane
from .tasks import worker_table

__all__ = ["WorkerTable", "assign_gpu_workers", "check_all_gpus", "check_health", "check_lanes",
           "cpu_workers", "gpu_workers", "on_gpu", "wait_for_gpu_workers", "worker_resources"]

log = logging.getLogger(__name__)

WorkerTable = dict[str, dict[str, float]]     # every worker's address -> its resources


def worker_resources(client: Any, where: Callable[[], str]) -> WorkerTable:
    """Every worker's address and resources, asked of the scheduler; a `StreamStopped` ending with `where()`
    (what the run has done, and how to resume it) when the scheduler cannot be reached."""
    try:
        return client.run_on_scheduler(worker_table)
    except Exception as e:   # any comm failure means the scheduler is gone
        raise StreamStopped(f"lost the Dask scheduler ({type(e).__name__}: {e}); {where()}") from e


def gpu_workers(table: WorkerTable) -> list[str]:
    """The addresses of the workers with the `GPU` resource, sorted."""
    return sorted(a for a, r in table.items() if float(r.get(GPU, 0)) > 0)


def cpu_workers(table: WorkerTable) -> list[str]:
    """The addresses of the workers without the `GPU` resource, sorted."""
    return sorted(a for a, r in table.items() if float(r.get(GPU, 0)) <= 0)


def wait_for_gpu_workers(workers: Callable[[], WorkerTable], need: int, wait_s: float) -> tuple[WorkerTable, list[str]]:
    """Wait up to `wait_s` seconds for `need` GPU workers; the worker table and the GPU workers' addresses.

    A `StreamStopped` saying how many joined, and how to start one, when they do not."""
    deadline = time.monotonic() + wait_s
    while True:
        # polled rather than `Client.wait_for_workers`, which counts every worker, not those with the GPU resource
        table = workers()
        gpus = gpu_workers(table)
        if len(gpus) >= need:
            return table, gpus
        if time.monotonic() > deadline:
            found = (f"no worker with the {GPU} resource joined within {wait_s:.0f} s "
                     f"({len(table)} workers without it)") if not gpus else \
                (f"{len(gpus)} of the {need} workers with the {GPU} resource gpus={need} needs joined within "
                 f"{wait_s:.0f} s")
            raise StreamStopped(f"{found}; start one with `diskflow worker SCHEDULER --gpu --scratch DIR` or "
                                f"`dask worker SCHEDULER --resources {GPU}=1`")
        time.sleep(0.5)


def check_all_gpus(cfg: StreamConfig, found: int) -> None:
    """``--gpus all`` (``cfg.gpus == 0``): refuse `found` GPU workers the run could not give work to each."""
    if found > cfg.superbatch_size:
        raise ConfigError("gpus", f"all {found} GPU workers share each superbatch's batches; a "
                                  f"superbatch of {cfg.superbatch_size} (superbatch_size) leaves some "
                                  "with none")
    if found > 1 and cfg.history_rows:
        raise ConfigError("history_memory", "a historical embedding cache trains on one GPU worker; "
                                            f"gpus=0 (all of them) found {found}")


def check_lanes(cfg: StreamConfig, lanes: Sequence[Lane], epoch_batches: int) -> None:
    """Refuse lanes (one per GPU worker) of which one would train no batch of an epoch of `epoch_batches`,
    and several lanes with more than one batch per step."""
    idle = [lane.rank for lane in lanes if lane.round_batches == 0]
    if idle:
        raise ConfigError("gpus", f"{len(lanes)} GPU workers share batches of which an epoch holds {epoch_batches}: "
                                  f"worker(s) {idle} would train none")
    if len(lanes) > 1 and getattr(cfg.train, "batches_per_step", 1) > 1:
        raise ConfigError("batches_per_step", "with several GPU workers each takes one batch per step; the "
                                              "step already holds one batch of each")


def assign_gpu_workers(lanes: Sequence[Lane], gpus: Sequence[str], need: int) -> None:
    """Give lane r the r-th GPU worker; note the GPU workers beyond the `need` the run trains on."""
    for lane, addr in zip(lanes, gpus):
        lane.gpu_addr = addr
    if len(gpus) > need:
        log.warning("%d GPU workers; this run trains on %s (gpus=%d)", len(gpus), ", ".join(gpus[:need]), need)


def on_gpu(lane: Lane, priority: int, amount: float) -> dict[str, Any]:
    """`client.submit`'s placement of a task on lane's GPU worker alone, taking `amount` of its `GPU` resource."""
    return {"priority": priority, "resources": {GPU: amount}, "workers": [lane.gpu_addr],
            "allow_other_workers": False}


def check_health(table: WorkerTable, lanes: Sequence[Lane], cpu_addrs: Sequence[str], where: Callable[[], str]
                 ) -> list[str]:
    """Stop the run (`StreamStopped`, ending with `where()`) when a lane's GPU worker, or every CPU worker it
    was using, left the cluster; the CPU workers there are now (later submissions use them)."""
    for lane in lanes:
        if lane.gpu_addr not in table:
            raise StreamStopped(f"the GPU worker {lane.gpu_addr} left the cluster; {where()}")
    if not cpu_addrs:
        return list(cpu_addrs)
    if not any(a in table for a in cpu_addrs):
        raise StreamStopped(f"every CPU worker this run was using ({', '.join(cpu_addrs)}) left the "
                            f"cluster; {where()}")
    return cpu_workers(table)
