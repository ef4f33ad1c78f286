"""The diskflow WorkerPlugin: what a worker needs for a streamed run, set up per worker, no globals.

The driver registers one `DiskflowPlugin` on the cluster (``client.register_plugin``; idempotent,
so every run and every worker that joins later gets the same one). On each worker, `setup`
reads the worker's own settings from its Dask config — ``diskflow.scratch``,
``diskflow.scratch-quota``, ``diskflow.hold-memory``, ``diskflow.device``, ``diskflow.keep-freed-memory`` —
which `diskflow worker --gpu --scratch DIR --quota Q --hold-memory M --device D` sets, and a worker started by
hand takes from the environment (``DASK_DISKFLOW__SCRATCH=/nvme/x dask worker --resources GPU=1 ...``) or
defaults to ``LOCAL_DIRECTORY/diskflow-scratch``, no quota, `HOLD_MEMORY` of staged index and samples
held in memory, and CUDA when the worker has it.

On a worker holding the ``GPU`` resource the plugin keeps, per run: the scratch space with its
quota (`operators.stream.ship.ScratchSpace`), the run's directory there, and the `StreamTrainer`
(loader, model, optimizer, CPU tier) that `train-*` tasks continue. Tasks reach it with
``get_worker().plugins["diskflow"]``. `teardown` closes every trainer and removes the scratch
directories of its runs.

A run on several GPU workers (`diskflow run streaming --gpus N`) is data-parallel: the driver
asks the plugin of the first GPU worker to open a rendezvous (`group_master`: a
``torch.distributed`` TCP store on a free port of its host), then every GPU worker's plugin joins
the run's process group (`join_group`: rank = the worker's place among the run's GPU workers,
gloo on the CPU, NCCL on CUDA). The group lives as long as the run's job on the worker and is
destroyed with it; a worker takes part in one data-parallel run at a time.

Every worker also gets its allocator back from Dask's memory-trimming setting
(`flow.allocator.keep_freed_memory`; ``diskflow.keep-freed-memory: false`` keeps Dask's): a GPU
worker's trainer allocates and frees large tensors every batch, and a CPU worker's preparation
tasks allocate and free arrays of one entry per node or access; Dask's setting turns both into
page faults (CPU training about twice as slow).
"""
from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dask
from distributed import WorkerPlugin

from ..errors import ConfigError, DiskflowError
from ..operators.formats.sizes import parse_bytes
from ..operators.options import HOLD_MEMORY  # staged index and samples held in memory at most
from . import allocator

if TYPE_CHECKING:
    from ..operators.stream.ship import ScratchSpace

__all__ = ["GPU", "HOLD_MEMORY", "PLUGIN_NAME", "DiskflowPlugin", "GpuStateLost", "Job", "config_env",
           "worker_config"]

PLUGIN_NAME = "diskflow"
GPU = "GPU"


def worker_config(scratch: str | os.PathLike[str] | None = None, quota: int | str | None = None,
                  device: str | None = None, keep_freed_memory: bool | None = None,
                  hold_memory: int | str | None = None) -> dict[str, Any]:
    """The Dask config a diskflow worker runs with (``{"diskflow": {...}}``; None values left out)."""
    values = {"scratch": None if scratch is None else str(Path(scratch).resolve()),
              "scratch-quota": quota, "device": device, "keep-freed-memory": keep_freed_memory,
              "hold-memory": hold_memory}
    return {"diskflow": {k: v for k, v in values.items() if v is not None}}


def config_env(cfg: dict[str, Any]) -> dict[str, str]:
    """`worker_config`'s values as DASK_DISKFLOW__* environment variables (inherited by child processes)."""
    return {f"DASK_DISKFLOW__{k.upper().replace('-', '_')}": str(v) for k, v in cfg.get("diskflow", {}).items()}


class GpuStateLost(DiskflowError):
    """The GPU worker no longer holds a run's training state (it restarted, or another worker got the task)."""


@dataclass
class Job:
    """One streamed run on the GPU worker: its scratch directory and the trainer carried between superbatches."""

    run: str
    root: Path
    next_index: int
    trainer: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def base(self) -> Path:
        return self.root / "base"


class DiskflowPlugin(WorkerPlugin):
    """Per-worker setup for streamed runs: scratch space and quota, device, and the runs' training state."""

    name = PLUGIN_NAME
    idempotent = True

    def setup(self, worker: Any) -> None:
        from ..operators.stream.ship import ScratchSpace

        self.address = str(worker.address)
        self.is_gpu = float(worker.state.total_resources.get(GPU, 0)) > 0
        def setting(key: str, default: Any = None) -> Any:    # "scratch-quota" also finds DASK_DISKFLOW__SCRATCH_QUOTA's
            return dask.config.get(f"diskflow.{key}", default=default)

        quota = setting("scratch-quota")
        self.quota = parse_bytes(quota, "diskflow.scratch-quota") if quota not in (None, "", "none") else None
        self.device = str(setting("device") or "auto")
        self.scratch: Path = Path(setting("scratch") or Path(worker.local_directory) / "diskflow-scratch")
        self.jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._stores: dict[str, Any] = {}       # run -> the TCP store this worker serves as rank 0
        self.groups: dict[str, tuple[int, int]] = {}    # run -> (rank, world) of the process group joined
        self.hold_memory = parse_bytes(setting("hold-memory", HOLD_MEMORY), "diskflow.hold-memory")
        self.space = ScratchSpace(self.scratch, self.quota, self.hold_memory) if self.is_gpu else None
        keep = setting("keep-freed-memory", True)
        if not isinstance(keep, bool):
            keep = str(keep).strip().lower() not in ("0", "false", "no", "off")
        self.allocator = allocator.describe(keep and allocator.keep_freed_memory())

    def teardown(self, worker: Any) -> None:
        for run in list(getattr(self, "jobs", {})):
            self.close_job(run)

    # ------------------------------------------------------------------ queries
    def resolved_device(self) -> str:
        """The device this worker trains on: its setting, or CUDA when available (else the CPU)."""
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def describe(self) -> dict[str, Any]:
        """What the driver prints and records about this worker (imports the trainer, so it warms up)."""
        from ..operators.stream import train as stream_train  # noqa: F401 - torch and PyG load now, not in the first train task

        free = shutil.disk_usage(self.scratch).free if self.scratch.exists() else None
        return {"address": self.address, "gpu": self.is_gpu, "device": self.resolved_device(),
                "scratch": str(self.scratch), "quota": self.quota, "free_bytes": free, "pid": os.getpid(),
                "allocator": self.allocator}

    # ------------------------------------------------------------------ runs
    def gpu_space(self) -> ScratchSpace:
        """This GPU worker's scratch space; a ConfigError on a worker without the ``GPU`` resource."""
        if not self.is_gpu or self.space is None:
            raise ConfigError("resources", f"worker {self.address} has no {GPU} resource but was given a GPU task")
        return self.space

    def open_job(self, run: str, start_index: int) -> Job:
        """The run's state on this (GPU) worker, created with its scratch directory on first use."""
        self.gpu_space()
        with self._lock:
            job = self.jobs.get(run)
            if job is None:
                root = self.scratch / run
                root.mkdir(parents=True, exist_ok=True)
                job = self.jobs[run] = Job(run, root, start_index)
            return job

    def job(self, run: str) -> Job:
        """The run's existing state; GpuStateLost when this worker does not hold it."""
        job = self.jobs.get(run)
        if job is None:
            raise GpuStateLost(f"the GPU worker {self.address} holds no state of run {run} (it was restarted, or a "
                               "second GPU worker got the task); the run cannot continue without resume")
        return job

    # ------------------------------------------------------------------ data-parallel runs
    def group_master(self, run: str, world: int) -> tuple[str, int]:
        """Open the rendezvous of run `run`'s process group on this (rank 0) worker: (host, port)."""
        import torch.distributed as dist

        self.gpu_space()
        host = _host(self.address)
        store = dist.TCPStore(host, 0, world, is_master=True, wait_for_workers=False)
        with self._lock:
            self._stores[run] = store
        return host, int(store.port)

    def join_group(self, run: str, group: str, host: str, port: int, rank: int, world: int, timeout_s: float
                   ) -> dict[str, Any]:
        """Join the process group `group` (opened by `group_master`) as `rank` of `world`, for this worker's
        job `run` (which leaves it when closed); blocks until every rank joined.

        Raises:
            ConfigError: this worker is already in another run's group (one per process).
        """
        import datetime

        import torch.distributed as dist

        with self._lock:        # rank 0's store: held here from now on, so a failure below drops it
            master = self._stores.pop(group, None) if rank == 0 else None
        self.gpu_space()
        if dist.is_initialized():
            others = [r for r in self.groups if r != run]
            raise ConfigError("gpus", f"GPU worker {self.address} already trains a data-parallel run "
                                      f"({', '.join(others) or 'another group'}); one at a time")
        device = self.resolved_device()
        backend = "nccl" if device.startswith("cuda") else "gloo"
        if backend == "nccl":       # NCCL: each rank on its own GPU (`--device cuda:K`, or CUDA_VISIBLE_DEVICES)
            import torch

            torch.cuda.set_device(torch.device(device))
        store = master
        if store is None:
            store = dist.TCPStore(host, port, world, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
        dist.init_process_group(backend, store=dist.PrefixStore(group, store), rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        with self._lock:
            self._stores[run] = store           # kept (rank 0 serves it) until the job is closed
            self.groups[run] = (rank, world)
        return {"address": self.address, "rank": rank, "world": world, "backend": backend}

    def close_job(self, run: str) -> dict[str, Any]:
        """Close the run's trainer, leave its process group and remove its scratch directory; its scratch figures."""
        with self._lock:
            job = self.jobs.pop(run, None)
            for key in [k for k in self._stores if run == k or run.startswith(f"{k}-g")]:   # the group's, or a
                self._stores.pop(key)                                                          # rendezvous never joined
            group = self.groups.pop(run, None)
        if job is not None:
            with job.lock:
                if job.trainer is not None:
                    job.trainer.close()
                    job.trainer = None
        if group is not None:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        if job is None:
            return {}
        shutil.rmtree(job.root, ignore_errors=True)
        if self.space is None:
            return {}
        for name in self.space.usage()["staged"]:
            if name.startswith(f"{run}/"):
                self.space.release(name)
        return self.space.usage()


def _host(address: str) -> str:
    """The host of a Dask address (``tcp://10.0.0.5:40123``, ``tls://[::1]:9000``)."""
    from distributed.comm import get_address_host

    return str(get_address_host(address))
