"""`diskflow worker SCHEDULER [--gpu --scratch DIR --quota SIZE --hold-memory SIZE --device DEV]`: a Dask worker.

Without `--gpu`: a CPU worker (sampling, counting, planning, packing). With `--gpu`: the
training worker, carrying the Dask resource ``GPU=1``, staging superbatches in `--scratch`
(at most `--quota` bytes at once; their index and samples held in memory up to `--hold-memory`)
and training on `--device` (cpu makes everything testable without a GPU). It is Dask's own
`dask worker`; the diskflow settings travel in the worker's Dask config, where the run's
WorkerPlugin reads them, so `dask worker --resources GPU=1` with ``DASK_DISKFLOW__SCRATCH=DIR``
is the same worker.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import ConfigError
from ..sizes import parse_bytes
from .options import add_tls_arguments

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("worker", help="start a Dask worker: CPU preprocessing, or --gpu for training",
                       description="Start a Dask worker connected to SCHEDULER. --gpu makes it the training worker "
                                   "(resource GPU=1) with a local scratch directory for staged superbatches.")
    p.add_argument("scheduler", nargs="?", default=None, metavar="SCHEDULER",
                   help="the scheduler's address, tcp://HOST:8786 (or give --scheduler-file)")
    p.add_argument("--gpu", action="store_true", help="the training worker: carries the resource GPU=1")
    p.add_argument("--scratch", default=None, metavar="DIR",
                   help="GPU worker: local directory for staged superbatches (default: LOCAL_DIRECTORY/diskflow-scratch)")
    p.add_argument("--quota", default=None, metavar="SIZE",
                   help="GPU worker: bytes staged superbatches may take at once, e.g. 50GiB (default: no limit)")
    p.add_argument("--hold-memory", default=None, metavar="SIZE",
                   help="GPU worker: memory for staged superbatches' index and samples, which are read whole and "
                        "once, so they skip the scratch disk while they fit; 0: all on disk (default 256MiB)")
    p.add_argument("--device", default=None, metavar="DEV",
                   help="GPU worker: where to train, cpu or cuda[:N] (default: cuda when available, else cpu)")
    p.add_argument("--nthreads", type=int, default=None, help="threads (default 1; 2 for --gpu: train + ship)")
    p.add_argument("--local-directory", default=None, metavar="DIR", help="the worker's own local directory")
    p.add_argument("--name", default=None, help="worker name shown in the dashboard")
    p.add_argument("--host", default=None, help="address to listen on (default: the machine's)")
    p.add_argument("--memory-limit", default=None, metavar="SIZE", help="worker memory limit (Dask's, default auto)")
    p.add_argument("--no-nanny", action="store_true", help="run the worker in this process (no restarting nanny)")
    p.add_argument("--scheduler-file", default=None, metavar="PATH", help="read the scheduler's address from this file")
    add_tls_arguments(p, listens=True)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ..cluster import check_tls, log_links, probe, run_dask_cli, set_worker_config, worker_argv

    if not args.gpu and (args.scratch or args.quota or args.device or args.hold_memory is not None):
        raise ConfigError("--scratch/--quota/--hold-memory/--device", "apply to the training worker only; add --gpu")
    if args.quota is not None:
        parse_bytes(args.quota, "--quota")
    if args.hold_memory is not None:
        parse_bytes(args.hold_memory, "--hold-memory")
    if args.nthreads is not None and args.nthreads < 1:
        raise ConfigError("--nthreads", f"must be >= 1, got {args.nthreads}")
    if args.gpu:
        set_worker_config(args.scratch, args.quota, args.device, args.hold_memory)
    argv = worker_argv(args.scheduler, gpu=args.gpu, nthreads=args.nthreads, local_directory=args.local_directory,
                       name=args.name, memory_limit=args.memory_limit, nanny=not args.no_nanny,
                       scheduler_file=args.scheduler_file, host=args.host)
    address = args.scheduler or _address_in(args.scheduler_file)
    tls = check_tls(address, args.tls_ca_file, args.tls_cert, args.tls_key, role="worker", address_option="SCHEDULER")
    if address:
        probe(address, tls, role="worker")      # a refused certificate: one line, not a worker retrying forever
        log_links(address, tls)      # the dashboard's address and the diskflow page's (or that it is absent)
    return run_dask_cli("worker", argv + tls.argv())


def _address_in(scheduler_file: str | None) -> str | None:
    """The address in a scheduler file already written (None: none yet; Dask's worker waits for it)."""
    if not scheduler_file:
        return None
    try:
        address = json.loads(Path(scheduler_file).read_text()).get("address")
    except (OSError, ValueError, AttributeError):
        return None
    return address if isinstance(address, str) else None
