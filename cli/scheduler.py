"""`diskflow scheduler`: the Dask scheduler of a split run (Dask's own `dask scheduler`, dashboard on).

Start it on the preprocessing machine; workers and `diskflow run ... --scheduler
tcp://HOST:8786` connect to it; the dashboard (http://HOST:8787/status) shows the run's task
groups (sample, count, plan, pack, ship, train), and diskflow's scheduler plugin (a preload,
`flow.dashboard.preload`) adds http://HOST:8787/diskflow: each GPU worker's stage lanes, the
preparation's lead, tier hit rates, disk bytes/s against the floor and the GPU idle share, live
(`flow.dashboard.page`). Runs until Ctrl-C.
"""
from __future__ import annotations

import argparse

from .options import add_tls_arguments

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scheduler", help="start a Dask scheduler (with its dashboard) for split runs",
                       description="Start the Dask scheduler that CPU workers, the GPU worker and `diskflow run ... "
                                   "--scheduler tcp://HOST:PORT` connect to. Equivalent to `dask scheduler --preload "
                                   "diskflow.flow.dashboard.preload` (the diskflow page, /diskflow).")
    p.add_argument("--host", default=None, help="address to listen on (default: all interfaces)")
    p.add_argument("--port", type=int, default=8786, help="scheduler port (default 8786; 0: any free port)")
    p.add_argument("--dashboard-address", default=":8787", metavar="ADDR",
                   help="dashboard address (default :8787)")
    p.add_argument("--no-dashboard", action="store_true", help="run without the dashboard")
    p.add_argument("--scheduler-file", default=None, metavar="PATH",
                   help="write the scheduler's address to this JSON file (workers can read it)")
    add_tls_arguments(p, listens=True)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ..cluster import check_tls, run_dask_cli, scheduler_argv

    argv = scheduler_argv(args.host, args.port, None if args.no_dashboard else args.dashboard_address,
                          args.scheduler_file)
    files = check_tls(args.host, args.tls_ca_file, args.tls_cert, args.tls_key, role="scheduler", address_option="--host")
    tls = files.argv()
    if files.enabled and not (args.host or "").startswith("tls://"):
        tls += ["--protocol", "tls"]
    return run_dask_cli("scheduler", argv + tls)
