"""The processes of a split run, all plain Dask: a scheduler, CPU workers, one GPU worker.

`diskflow scheduler` and `diskflow worker` are Dask's own `dask scheduler` / `dask worker`
(the same options, signals, nanny and death timeouts); `diskflow worker --gpu` only adds the
resource ``GPU=1`` and the worker's diskflow settings (scratch directory, quota, device) to its
Dask config, where `flow.plugin.DiskflowPlugin` reads them. So these two are the same worker::

    diskflow worker tcp://HOST:8786 --gpu --scratch /nvme/diskflow --quota 50GiB
    DASK_DISKFLOW__SCRATCH=/nvme/diskflow DASK_DISKFLOW__SCRATCH_QUOTA=50GiB \\
        dask worker tcp://HOST:8786 --resources GPU=1

`stream_client` is the cluster a streamed run uses: a remote scheduler, or an embedded
LocalCluster of CPU workers plus one GPU-resource worker.
"""
from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import dask

from ..errors import ConfigError
from .cluster import client_session
from .plugin import GPU, config_env, worker_config
from .security import check_tls, refusal

__all__ = ["PAGE_PRELOAD", "run_dask_cli", "scheduler_argv", "scratch_default", "set_worker_config",
           "stream_client", "tls_security", "worker_argv"]

log = logging.getLogger(__name__)
PAGE_PRELOAD = "diskflow.flow.dashboard.preload"     # the scheduler plugin with the /diskflow page


def scheduler_argv(host: str | None = None, port: int | None = None, dashboard_address: str | None = ":8787",
                   scheduler_file: str | None = None, extra: Sequence[str] = ()) -> list[str]:
    """`dask scheduler`'s arguments for a diskflow scheduler (dashboard on by default, with the diskflow page:
    `flow.dashboard.preload`)."""
    argv: list[str] = ["--preload", PAGE_PRELOAD]
    if host:
        argv += ["--host", host]
    if port is not None:
        argv += ["--port", str(port)]
    if dashboard_address is None:
        argv += ["--no-dashboard"]
    else:
        argv += ["--dashboard-address", dashboard_address]
    if scheduler_file:
        argv += ["--scheduler-file", scheduler_file]
    return argv + list(extra)


def worker_argv(scheduler: str | None, *, gpu: bool = False, nthreads: int | None = None,
                local_directory: str | None = None, name: str | None = None, memory_limit: str | None = None,
                nanny: bool = True, scheduler_file: str | None = None, dashboard: bool = False,
                host: str | None = None, extra: Sequence[str] = ()) -> list[str]:
    """`dask worker`'s arguments for a diskflow CPU worker, or the GPU worker (``--resources GPU=1``).

    The GPU worker gets 2 threads by default: one trains, the other stages the next superbatch.
    """
    if not scheduler and not scheduler_file:
        raise ConfigError("scheduler", "give the scheduler's address (tcp://HOST:8786) or a scheduler_file")
    argv = [scheduler] if scheduler else []
    if scheduler_file:
        argv += ["--scheduler-file", scheduler_file]
    if gpu:
        argv += ["--resources", f"{GPU}=1"]
    threads = nthreads if nthreads is not None else (2 if gpu else 1)
    argv += ["--nthreads", str(threads)]
    if local_directory:
        argv += ["--local-directory", local_directory]
    if name:
        argv += ["--name", name]
    if memory_limit:
        argv += ["--memory-limit", memory_limit]
    if host:
        argv += ["--host", host]
    argv += ["--nanny" if nanny else "--no-nanny"]
    argv += ["--dashboard" if dashboard else "--no-dashboard"]
    return argv + list(extra)


def tls_security(ca_file: str | None, cert: str | None, key: str | None, scheduler: str | None = None) -> Any:
    """A client's `distributed.Security` for `scheduler` from these files, checked against its address
    (`flow.security.check_tls`), or None: plain TCP, or Dask's own ``distributed.comm.tls`` config, which
    Dask then reads as for any client."""
    files = check_tls(scheduler, ca_file, cert, key, role="client")
    return files.security("client") if files.ca_file is not None else None


def set_worker_config(scratch: str | None, quota: str | None, device: str | None,
                      hold_memory: str | None = None) -> dict[str, Any]:
    """Put the diskflow worker settings into this process's Dask config and environment (children inherit)."""
    if device is not None and device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ConfigError("device", f"expected cpu or cuda[:N], got {device!r}")
    cfg = worker_config(scratch, quota, device, hold_memory=hold_memory)
    os.environ.update(config_env(cfg))
    dask.config.set(cfg)
    return cfg


def run_dask_cli(command: str, argv: Sequence[str]) -> int:
    """Run `dask scheduler` or `dask worker` with `argv` in this process (blocks until it stops)."""
    if command == "scheduler":
        from distributed.cli.dask_scheduler import main
    elif command == "worker":
        from distributed.cli.dask_worker import main
    else:
        raise ValueError(command)
    try:
        main.main(args=list(argv), prog_name=f"diskflow {command}", standalone_mode=False)
    except SystemExit as e:     # dask's CLI exits with its code on errors and on signals
        return int(e.code or 0)
    return 0


@contextlib.contextmanager
def stream_client(scheduler: str | None = None, *, cpu_workers: int | None = None, scratch: str | None = None,
                  quota: str | int | None = None, device: str | None = None, processes: bool = True,
                  memory_limit: str | int = "auto", quiet: bool = False, connect_timeout: str = "15s",
                  local_directory: str | None = None, keep_freed_memory: bool | None = None,
                  hold_memory: str | int | None = None, gpu_workers: int = 1, security: Any = None) -> Iterator[Any]:
    """A client for a streamed run: connected to `scheduler`, or to an embedded LocalCluster.

    The embedded cluster has `cpu_workers` single-threaded CPU workers (default: the cores
    but one) and `gpu_workers` GPU-resource workers (2 threads each; several get scratch
    subdirectories ``gpu-R`` of their own) with the given scratch directory,
    quota, memory for held index and samples (`hold_memory`, default `plugin.HOLD_MEMORY`)
    and device (`keep_freed_memory`: False keeps Dask's allocator setting on it, see
    `flow.allocator`). A scheduler that cannot be reached is a clear error after
    `connect_timeout`, not a hang. `security` (a `distributed.Security`): the connection (and
    the embedded cluster's, which then listens on ``tls://``) is encrypted and authenticated. Logs the
    dashboard's and the diskflow page's addresses, as `flow.cluster.dask_client` does (`quiet`: none).
    """
    from distributed import Client, LocalCluster

    from ..errors import DiskflowError

    logging.getLogger("distributed").setLevel(logging.ERROR)
    if scheduler:
        try:
            client = Client(scheduler, timeout=connect_timeout, **({"security": security} if security else {}))
        except (OSError, TimeoutError) as e:
            refused = refusal(scheduler, e, security)
            if refused is not None:
                raise refused from None
            raise DiskflowError(f"cannot reach the Dask scheduler at {scheduler} within {connect_timeout} ({e}); "
                                "is `diskflow scheduler` running there, and the port open?") from e
        with client_session(client, log, quiet=quiet, embedded=False):
            yield client
        return
    n = cpu_workers if cpu_workers is not None else max(1, (os.cpu_count() or 2) - 1)
    if n < 0:
        raise ConfigError("workers", f"must be >= 0, got {n}")
    settings = worker_config(scratch, quota, device, keep_freed_memory, hold_memory)
    kwargs: dict[str, Any] = {"local_directory": local_directory} if local_directory else {}
    if security is not None:
        kwargs.update(security=security, protocol="tls://")
    with dask.config.set(settings):   # in-process workers read their settings here; processes get them below
        # ":0": a free port. Even without a dashboard the scheduler serves HTTP, by default on 8787,
        # and only warns when another cluster already holds that port.
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=processes, memory_limit=memory_limit,
                               dashboard_address=":0", silence_logs=logging.CRITICAL,
                               **kwargs)
        try:
            spec = dict(cluster.new_spec)
            cuda_devices = _cuda_devices() if gpu_workers > 1 and device in ("cuda", None) else 0
            if 0 < cuda_devices < gpu_workers:
                raise ConfigError("gpus", f"{gpu_workers} GPU workers on CUDA need a device each; this machine has "
                                          f"{cuda_devices} (or give device='cpu')")
            for g in range(gpu_workers):
                options = {**spec.get("options", {}), "nthreads": 2, "resources": {GPU: 1}}
                # several GPU workers: a scratch directory each, and on CUDA a device each (cuda:0, cuda:1, ...)
                own_device = f"cuda:{g}" if gpu_workers > 1 and device in ("cuda", None) and cuda_devices >= gpu_workers \
                    else device
                own = settings if gpu_workers == 1 else \
                    worker_config(None if scratch is None else str(Path(scratch) / f"gpu-{g}"), quota, own_device,
                                  keep_freed_memory, hold_memory)
                if processes:
                    options["config"] = own
                cluster.worker_spec["gpu" if g == 0 else f"gpu-{g}"] = {"cls": spec["cls"], "options": options}
            cluster.sync(cluster._correct_state)
            client = Client(cluster, **({"security": security} if security else {}))
            with client_session(client, log, quiet=quiet, embedded=True, workers=n + gpu_workers):
                yield client
        finally:
            cluster.close()


def _cuda_devices() -> int:
    """CUDA devices on this machine (0 without CUDA): the embedded cluster gives each GPU worker its own."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def scratch_default(run_dir: str | os.PathLike[str]) -> str:
    """The embedded GPU worker's scratch directory when none is given: inside the run directory."""
    return str(Path(run_dir) / "scratch")
